// StrategyEditor front end: preset, mesh, per-op signatures, hints and stages in; the physical graph,
// memory, communication and the simulator's prediction Python computed out. All deduction lives in Python
// (sbplab.widgets.strategy_editor); this file renders state and sends edits back.
// Elements carry stable data-testid attributes for a browser test.

const DERIVED = [
  "preset", "mesh_text", "micro_batches", "stages", "inner", "optimizer", "lr", "momentum", "choices", "hints",
  "stage_of", "selected_op", "op_phase", "op_filter", "graph_kind", "graph_phases", "graph_ranks", "collapse",
  "preset_names", "inner_names", "optimizer_names", "hint_roles", "strategy_name", "modules", "ops", "ops_note",
  "candidates", "explain", "graph_svg", "graph_text", "graph_note", "memory_rows", "memory_svg", "memory_text",
  "comm_rows", "comm_svg", "comm_text", "summary", "error", "note", "preset_badge", "timings_ms", "stale",
  "auto_predict", "hardware_name", "predicted", "predicted_version", "version", "predict_error", "predict_note",
];
const PHASES = ["forward", "backward", "update"];

// The helpers every widget shares (widgets/dom.js) arrive as the trait _dom_js and are imported here
// once per model; sbplab/widgets/widget_base.py says why (one ES module per widget, no bundler).
let h, fmtBytes, redrawOn, onEnter, onEnterOrChange, showValue, panZoom;

async function initialize({ model }) {
  const url = URL.createObjectURL(new Blob([model.get("_dom_js")], { type: "text/javascript" }));
  const dom = await import(url);
  URL.revokeObjectURL(url);
  ({ h, fmtBytes, redrawOn, onEnter, onEnterOrChange, showValue, panZoom } = dom);
  dom.useBaseCss(model);
}

function field(label, control) {
  return h("label", { class: "se-field" }, h("span", { class: "sbplab-label", text: label }), control);
}

/** Milliseconds with three significant figures: 0.0123 ms, 1.23 ms, 123 ms. */
function fmtMs(ms) {
  if (Math.abs(ms) < 5e-7) return "0 ms";  // a sum's rounding (1.7e-15) is no time at all
  if (ms >= 100) return `${ms.toFixed(0)} ms`;
  return `${ms.toPrecision(3)} ms`;
}

function options(sel, values, labels = {}) {
  const cur = sel.value;
  sel.replaceChildren(...values.map((v) => h("option", { value: v, text: labels[v] || v || "any" })));
  sel.value = cur;
}

function render({ model, el }) {
  const commit = (name, value) => { model.set(name, value); model.save_changes(); };
  el.classList.add("sbplab-widget", "sbplab-se");

  // --- inputs -------------------------------------------------------------------------------------
  const presetSel = h("select", { "data-testid": "preset-select" });
  const presetBadge = h("span", { class: "se-badge", "data-testid": "preset-badge" });
  presetSel.addEventListener("change", () => commit("preset", presetSel.value));
  const meshIn = h("input", { type: "text", "data-testid": "mesh-input", spellcheck: "false" });
  onEnterOrChange(meshIn, (v) => commit("mesh_text", v));
  const microIn = h("input", { type: "number", min: "1", "data-testid": "micro-batches-input" });
  onEnterOrChange(microIn, (v) => commit("micro_batches", Number(v)));
  const stagesIn = h("input", { type: "number", min: "1", "data-testid": "stages-input" });
  onEnterOrChange(stagesIn, (v) => commit("stages", Number(v)));
  const innerSel = h("select", { "data-testid": "inner-select" });
  innerSel.addEventListener("change", () => commit("inner", innerSel.value));
  const optSel = h("select", { "data-testid": "optimizer-select" });
  optSel.addEventListener("change", () => commit("optimizer", optSel.value));
  const lrIn = h("input", { type: "number", step: "any", min: "0", "data-testid": "lr-input" });
  onEnterOrChange(lrIn, (v) => commit("lr", Number(v)));
  const pipeFields = h("span", { class: "se-pipe" }, field("stages", stagesIn), field("inside a stage", innerSel));

  const error = h("div", { class: "se-error sbplab-error", "data-testid": "error-message", role: "alert" });
  const note = h("div", { class: "se-note sbplab-note", "data-testid": "note-message" });
  const status = h("div", { class: "se-status sbplab-status", "data-testid": "status" });

  // --- the simulator's prediction ---------------------------------------------------------------------
  const predLine = h("span", { class: "se-predicted", "data-testid": "prediction" });
  const autoBox = h("input", { type: "checkbox", "data-testid": "auto-predict" });
  autoBox.addEventListener("change", () => commit("auto_predict", autoBox.checked));
  const predictBtn = h("button", { type: "button", "data-testid": "predict-button", text: "predict" });
  predictBtn.addEventListener("click", () => commit("predict_requests", model.get("predict_requests") + 1));
  const predError = h("div", { class: "se-error sbplab-error", "data-testid": "predict-error", role: "alert" });
  const predNote = h("div", { class: "se-note sbplab-note", "data-testid": "predict-note" });
  const predTable = h("table", { class: "se-table", "data-testid": "prediction-table" });
  const predBox = h("section", { class: "se-predict" },
    h("div", { class: "se-row" }, predLine, field("predict after every change", autoBox), predictBtn),
    predNote, predError, h("details", {}, h("summary", { text: "predicted per rank" }), predTable));

  // --- ops and signatures ---------------------------------------------------------------------------
  const phaseSel = h("select", { "data-testid": "op-phase-select" });
  options(phaseSel, [...PHASES, "all"]);
  phaseSel.addEventListener("change", () => commit("op_phase", phaseSel.value));
  const filterIn = h("input", { type: "search", placeholder: "filter ops", "data-testid": "op-filter" });
  onEnterOrChange(filterIn, (v) => commit("op_filter", v));
  const opsTable = h("table", { class: "se-ops", "data-testid": "ops-table" });
  const opsNote = h("div", { class: "se-small sbplab-status" });
  const sigTitle = h("h4", { text: "signatures" });
  const sigList = h("div", { class: "se-sigs", "data-testid": "signature-list" });
  const resetBtn = h("button", { type: "button", "data-testid": "reset-signature", text: "back to deduced" });
  resetBtn.addEventListener("click", () => {
    const op = model.get("selected_op");
    const next = { ...(model.get("choices") || {}) };
    delete next[op];
    commit("choices", next);
  });
  const explain = h("pre", { class: "se-explain", "data-testid": "op-explain" });

  // --- hints and stages -----------------------------------------------------------------------------
  const hintList = h("ul", { class: "se-hints", "data-testid": "hint-list" });
  const hintPattern = h("input", { type: "text", placeholder: "*.fc1.weight", "data-testid": "hint-pattern" });
  const hintSbp = h("input", { type: "text", placeholder: "S(0)", "data-testid": "hint-sbp" });
  const hintRole = h("select", { "data-testid": "hint-role" });
  const hintUse = h("input", { type: "checkbox", "data-testid": "hint-use" });
  const hintAdd = h("button", { type: "button", text: "add hint", "data-testid": "hint-add" });
  const addHint = () => commit("hints", [...(model.get("hints") || []),
    { pattern: hintPattern.value, sbp: hintSbp.value, role: hintRole.value, use: hintUse.checked }]);
  hintAdd.addEventListener("click", addHint);
  onEnter(hintPattern, addHint);  // Enter in either text field adds the hint, like the button
  onEnter(hintSbp, addHint);
  const stageList = h("div", { class: "se-stages", "data-testid": "stage-list" });
  const stageBox = h("details", { class: "se-stage-box" }, h("summary", { text: "stage per module" }), stageList);

  // --- graph, memory, communication -----------------------------------------------------------------------
  const kindSel = h("select", { "data-testid": "graph-kind" });
  options(kindSel, ["physical", "logical"], { logical: "logical (deduced)" });
  kindSel.addEventListener("change", () => commit("graph_kind", kindSel.value));
  const phaseBoxes = PHASES.map((p) => {
    const box = h("input", { type: "checkbox", "data-testid": `graph-phase-${p}` });
    box.addEventListener("change", () => {
      commit("graph_phases", PHASES.filter((q, i) => (q === p ? box.checked : phaseBoxes[i].checked)));
    });
    return box;
  });
  const ranksIn = h("input", { type: "text", "data-testid": "graph-ranks" });
  onEnterOrChange(ranksIn, (v) => commit("graph_ranks", v));
  const collapseBox = h("input", { type: "checkbox", "data-testid": "graph-collapse" });
  collapseBox.addEventListener("change", () => commit("collapse", collapseBox.checked));
  const graph = h("div", { class: "se-graph", "data-testid": "physical-graph" });
  const zoomBar = h("div", { class: "sbplab-zoombar", "data-testid": "graph-zoom" });
  const zoom = panZoom(graph, zoomBar);
  let shownSvg = null;
  const graphNote = h("div", { class: "se-note sbplab-note", "data-testid": "graph-note" });
  const graphText = h("pre", { class: "se-text", "data-testid": "graph-text" });
  const memSvg = h("div", { class: "se-chart", "data-testid": "memory-chart" });
  const memTable = h("table", { class: "se-table", "data-testid": "memory-table" });
  const commSvg = h("div", { class: "se-chart", "data-testid": "comm-chart" });
  const commText = h("pre", { class: "se-text", "data-testid": "comm-table" });
  const summary = h("pre", { class: "se-text", "data-testid": "summary" });

  el.append(
    h("div", { class: "se-inputs" }, field("preset", presetSel), presetBadge, field("mesh", meshIn),
      field("micro-batches", microIn), pipeFields, field("optimizer", optSel), field("lr", lrIn)),
    error, note, status, predBox,
    h("div", { class: "se-columns" },
      h("section", { class: "se-col" }, h("div", { class: "se-row" }, phaseSel, filterIn), opsNote,
        h("div", { class: "se-scroll" }, opsTable)),
      h("section", { class: "se-col" }, sigTitle, sigList, resetBtn, explain)),
    h("details", { class: "se-hint-box" }, h("summary", { text: "tensor hints" }), hintList,
      h("div", { class: "se-row" }, hintPattern, hintSbp, field("role", hintRole), field("use", hintUse), hintAdd)),
    stageBox,
    h("div", { class: "se-row" }, field("graph", kindSel),
      ...PHASES.map((p, i) => field(p, phaseBoxes[i])), field("ranks", ranksIn), field("collapse", collapseBox)),
    graphNote, zoomBar, graph, graphText,
    h("div", { class: "se-charts" }, h("section", {}, memSvg, memTable), h("section", {}, commSvg)),
    h("details", {}, h("summary", { text: "communication, collective by collective" }), commText),
    h("details", {}, h("summary", { text: "summary" }), summary),
  );

  function drawOps() {
    const sel = model.get("selected_op");
    opsTable.replaceChildren(h("tr", {}, ...["op", "type", "module", "stage", "signature", "boxing"]
      .map((c) => h("th", { text: c }))));
    for (const op of model.get("ops") || []) {
      const cls = ["se-op", op.name === sel ? "selected" : "", op.hand ? "hand" : ""].join(" ").trim();
      const row = h("tr", { class: cls, "data-testid": `op-row-${op.name}`, "data-op": op.name },
        h("td", { text: op.name }), h("td", { text: op.type }), h("td", { text: op.module }),
        h("td", { text: String(op.stage) }), h("td", { class: "se-mono", text: op.signature }),
        h("td", { text: op.cost ? fmtBytes(op.cost) : (op.boxed ? "local" : "") }));
      row.addEventListener("click", () => commit("selected_op", op.name));
      opsTable.append(row);
    }
    opsNote.textContent = model.get("ops_note");
  }

  function drawSignatures() {
    const op = model.get("selected_op");
    sigTitle.textContent = op ? `signatures of ${op}` : "signatures (pick an op)";
    sigList.replaceChildren();
    (model.get("candidates") || []).forEach((c, i) => {
      const cls = ["sig-choice", c.chosen ? "selected" : "", c.best ? "best" : "", c.blocked ? "blocked" : ""]
        .join(" ").trim();
      const btn = h("button", { type: "button", class: cls, "data-testid": `signature-${i}`,
        "data-signature": c.signature, "aria-pressed": String(c.chosen),
        title: c.blocked ? `not allowed: ${c.blocked}`
          : `${c.changes} input(s) boxed, ${fmtBytes(c.cost)} sent` + (c.best ? " (deduction's pick)" : "") },
      h("code", { text: c.signature }), h("span", { class: "se-cost", text: ` ${fmtBytes(c.cost)}` }));
      btn.addEventListener("click", () => commit("choices", { ...(model.get("choices") || {}), [op]: c.signature }));
      sigList.append(btn);
    });
    resetBtn.hidden = !(op && (model.get("choices") || {})[op]);
    explain.textContent = model.get("explain");
  }

  function drawHints() {
    const hints = model.get("hints") || [];
    hintList.replaceChildren();
    hints.forEach((hi, i) => {
      const del = h("button", { type: "button", class: "se-remove sbplab-remove", text: "✕", "data-testid": `hint-remove-${i}` });
      del.addEventListener("click", () => commit("hints", hints.filter((_, j) => j !== i)));
      hintList.append(h("li", { "data-testid": `hint-${i}` }, h("code", {
        text: `${hi.pattern} ${hi.use ? "used as" : "stored as"} ${hi.sbp}${hi.role ? ` (${hi.role})` : ""}` }), del));
    });
  }

  let stageKey = "";  // the module list the stage inputs were made for
  function drawStages() {
    const pipeline = model.get("preset") === "pipeline";
    stageBox.hidden = !pipeline;
    const modules = pipeline ? model.get("modules") || [] : [];
    const key = JSON.stringify([modules.map((m) => m.name), model.get("stages")]);
    if (key !== stageKey) {
      stageKey = key;
      stageList.replaceChildren(...modules.map((m) => {
        const input = h("input", { type: "number", min: "0", max: String(model.get("stages") - 1),
          "data-testid": `stage-${m.name}` });
        onEnterOrChange(input, (v) => commit("stage_of", { ...(model.get("stage_of") || {}), [m.name]: Number(v) }));
        return field(m.name, input);
      }));
    }
    modules.forEach((m, i) => showValue(stageList.children[i].querySelector("input"), m.stage));
  }

  function drawMemory() {
    memSvg.innerHTML = model.get("memory_svg");  // SVG built in Python, text escaped there
    const rows = model.get("memory_rows") || [];
    memTable.replaceChildren(h("tr", {}, ...["rank", "params", "grads", "optim state", "activ. peak", "peak"]
      .map((c) => h("th", { text: c }))));
    for (const r of rows) {
      memTable.append(h("tr", { "data-rank": String(r.rank) }, h("td", { text: String(r.rank) }),
        ...[r.params, r.grads, r.optimizer_state, r.activations_peak, r.peak].map((v) => h("td", { text: fmtBytes(v) }))));
    }
  }

  function drawPrediction() {
    const p = model.get("predicted") || {};
    const fresh = model.get("predicted_version") === model.get("version");
    const auto = model.get("auto_predict");
    autoBox.checked = auto;
    predictBtn.hidden = auto && fresh;
    predBox.classList.toggle("stale", Boolean(p.step_ms !== undefined && !fresh));
    const coming = auto && !fresh && !model.get("predict_note") && !model.get("predict_error");
    if (p.step_ms === undefined) {
      predLine.textContent = coming ? `predicting on ${model.get("hardware_name")}…`
        : `no prediction yet: press predict to simulate a step on ${model.get("hardware_name")}`;
    } else {
      const peak = Math.max(...p.ranks.map((r) => r.peak));
      predLine.textContent = `predicted on ${p.hardware} (${p.origin}): ${fmtMs(p.step_ms)} per step, `
        + `peak ${fmtBytes(peak)} on the fullest rank` + (fresh ? "" : " (for the previous settings)");
    }
    predNote.textContent = model.get("predict_note");
    predNote.hidden = !model.get("predict_note") || fresh;
    predError.textContent = model.get("predict_error");
    predError.hidden = !model.get("predict_error");
    predTable.replaceChildren(h("tr", {}, ...["rank", "peak", "params", "grads", "optim state", "activations",
      "compute", "exposed comm", "idle"].map((c) => h("th", { text: c }))));
    for (const r of p.ranks || []) {
      const m = r.memory;
      predTable.append(h("tr", { "data-rank": String(r.rank) }, h("td", { text: String(r.rank) }),
        ...[r.peak, m.parameters, m.gradients, m["optimizer state"], m.activations].map((v) => h("td", { text: fmtBytes(v) })),
        ...[r.compute_ms, r.comm_ms, r.idle_ms].map((v) => h("td", { text: fmtMs(v) }))));
    }
  }

  function draw() {
    options(presetSel, Object.keys(model.get("preset_names") || {}), model.get("preset_names") || {});
    presetSel.value = model.get("preset");
    options(innerSel, model.get("inner_names") || []);
    innerSel.value = model.get("inner");
    options(optSel, model.get("optimizer_names") || []);
    optSel.value = model.get("optimizer");
    options(hintRole, model.get("hint_roles") || []);
    showValue(meshIn, model.get("mesh_text"));
    showValue(microIn, model.get("micro_batches"));
    showValue(stagesIn, model.get("stages"));
    showValue(lrIn, model.get("lr"));
    pipeFields.hidden = model.get("preset") !== "pipeline";
    phaseSel.value = model.get("op_phase");
    showValue(filterIn, model.get("op_filter"));
    error.textContent = model.get("error");
    error.hidden = !model.get("error");
    presetBadge.textContent = model.get("preset_badge");
    presetBadge.hidden = !model.get("preset_badge");
    presetBadge.title = model.get("note");
    note.textContent = model.get("note");
    note.hidden = !model.get("note");
    const ms = model.get("timings_ms") || {};
    const name = model.get("strategy_name");
    if (!name) status.textContent = "";
    else if (model.get("stale")) status.textContent = `showing the last valid result (${name}); fix the error above to recompute`;
    else status.textContent = `${name}: recomputed in ${(ms.total || 0).toFixed(0)} ms `
      + `(deduce ${(ms.deduce || 0).toFixed(0)}, lower ${(ms.lower || 0).toFixed(0)}, graph ${(ms.graph || 0).toFixed(0)})`;
    kindSel.value = model.get("graph_kind");
    const phases = model.get("graph_phases") || [];
    PHASES.forEach((p, i) => { phaseBoxes[i].checked = phases.includes(p); });
    showValue(ranksIn, model.get("graph_ranks"));
    collapseBox.checked = model.get("collapse");
    const svgText = model.get("graph_svg");
    if (svgText !== shownSvg) {  // a redraw for other traits keeps the person's zoom and scroll
      graph.innerHTML = svgText;  // SVG made by graphviz from DOT text escaped in sbplab.viz
      shownSvg = svgText;
      zoom.refit();
    }
    graphNote.textContent = model.get("graph_note");
    graphNote.hidden = !model.get("graph_note");
    graphText.textContent = model.get("graph_text");
    graphText.hidden = !model.get("graph_text");
    commSvg.innerHTML = model.get("comm_svg");
    commText.textContent = model.get("comm_text");
    summary.textContent = model.get("summary");
    drawOps();
    drawSignatures();
    drawHints();
    drawStages();
    drawMemory();
    drawPrediction();
  }

  const stop = redrawOn(model, DERIVED, draw);
  return () => { stop(); zoom.dispose(); };
}

export default { initialize, render };
