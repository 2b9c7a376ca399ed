// SearchPanel front end: hardware, devices, memory limit, method and time budget in, a Search button; while
// the search runs, its progress and the best cost so far; then the searched strategy against every preset,
// the explanation, and the result opened in a StrategyEditor. The search runs in Python
// (sbplab.widgets.search_panel); this file renders state. Elements carry data-testid attributes for a
// browser test.

const DERIVED = [
  "hardware", "devices", "memory_limit", "method", "time_budget", "hardware_names", "method_names", "status",
  "phase", "progress", "units_done", "units_total", "best_ms", "best_label", "rows", "summary", "result_for",
  "explanation", "seconds", "note", "error", "stale", "version", "editor_ref", "editor_note", "model_name",
];
const HEAD = ["strategy", "analytic ms", "memory/device", "simulated ms", "vs searched"];

// The helpers every widget shares (widgets/dom.js) arrive as the trait _dom_js and are imported here
// once per model; sbplab/widgets/widget_base.py says why (one ES module per widget, no bundler).
let h, fmtBytes, redrawOn, onEnterOrChange, showValue;

async function initialize({ model }) {
  const url = URL.createObjectURL(new Blob([model.get("_dom_js")], { type: "text/javascript" }));
  const dom = await import(url);
  URL.revokeObjectURL(url);
  ({ h, fmtBytes, redrawOn, onEnterOrChange, showValue } = dom);
  dom.useBaseCss(model);
}

function field(label, control) {
  return h("label", { class: "sp-field" }, h("span", { class: "sbplab-label", text: label }), control);
}

/** Milliseconds with four significant figures, as SearchResult.table() prints them. */
const fmtMs = (ms) => (ms == null ? "-" : `${Number(ms.toPrecision(4))}`);

function options(sel, labels) {
  const keys = Object.keys(labels || {});
  if (sel.options.length !== keys.length || keys.some((k, i) => sel.options[i].value !== k)) {
    sel.replaceChildren(...keys.map((k) => h("option", { value: k, text: labels[k] })));
  }
}

function render({ model, el, host }) {
  const commit = (name, value) => { model.set(name, value); model.save_changes(); };
  el.classList.add("sbplab-widget", "sbplab-sp");

  // --- inputs -------------------------------------------------------------------------------------
  const hwSel = h("select", { "data-testid": "hardware-select" });
  hwSel.addEventListener("change", () => commit("hardware", hwSel.value));
  const devIn = h("input", { type: "number", min: "1", step: "1", "data-testid": "devices-input" });
  onEnterOrChange(devIn, (v) => {
    const n = Number(v);
    commit("devices", v.trim() !== "" && Number.isFinite(n) ? Math.round(n) : 0);
  });
  const memIn = h("input", { type: "text", placeholder: "none", spellcheck: "false", "data-testid": "memory-input" });
  onEnterOrChange(memIn, (v) => commit("memory_limit", v));
  const methodSel = h("select", { "data-testid": "method-select" });
  methodSel.addEventListener("change", () => commit("method", methodSel.value));
  const budgetIn = h("input", { type: "text", placeholder: "none", spellcheck: "false", "data-testid": "budget-input" });
  onEnterOrChange(budgetIn, (v) => commit("time_budget", v));
  const searchBtn = h("button", { type: "button", class: "sp-search", "data-testid": "search-button", text: "Search" });
  searchBtn.addEventListener("click", () => commit("search_requests", model.get("search_requests") + 1));

  // --- progress, errors ---------------------------------------------------------------------------
  const bar = h("progress", { max: "1", value: "0", "data-testid": "progress" });
  const status = h("span", { class: "sbplab-status", "data-testid": "status" });
  const error = h("div", { class: "sbplab-error", "data-testid": "error-message", role: "alert" });
  const note = h("div", { class: "sbplab-note", "data-testid": "note-message" });

  // --- the result -------------------------------------------------------------------------------------
  const summary = h("div", { class: "sp-summary", "data-testid": "summary" });
  const resultFor = h("div", { class: "sbplab-status", "data-testid": "result-for" });
  const table = h("table", { class: "sp-table", "data-testid": "result-table" });
  const explanation = h("pre", { class: "sp-explain", "data-testid": "explanation" });
  const why = h("details", { class: "sp-why", open: "" },
    h("summary", { text: "where the searched strategy differs from the best preset" }), explanation);
  const openBtn = h("button", { type: "button", "data-testid": "open-editor", text: "open in StrategyEditor" });
  openBtn.addEventListener("click", () => commit("open_requests", model.get("open_requests") + 1));
  const editorNote = h("span", { class: "sbplab-status", "data-testid": "editor-note" });
  const editorBox = h("div", { class: "sp-editor", "data-testid": "editor-view" });
  const result = h("section", { class: "sp-result", "data-testid": "result" },
    summary, resultFor, h("div", { class: "sp-table-wrap" }, table), why,
    h("div", { class: "sp-row" }, openBtn, editorNote), editorBox);

  el.append(
    h("div", { class: "sp-inputs" }, field("hardware", hwSel), field("devices", devIn),
      field("memory limit per device", memIn), field("method", methodSel), field("time budget (s)", budgetIn),
      searchBtn),
    h("div", { class: "sp-progress" }, bar, status), error, note, result,
  );

  // the editor the result opened in, drawn here through anywidget's host (once per editor)
  let shownRef = "";
  let child = null;
  async function showEditor(ref) {
    shownRef = ref;
    child?.abort();
    child = new AbortController();
    editorBox.replaceChildren();
    if (!ref) return;
    if (!host?.getWidget) {
      editorBox.append(h("div", { class: "sbplab-note", text: "this anywidget cannot draw one widget inside another: "
        + "display(panel.editor) in a cell to see the editor" }));
      return;
    }
    const slot = h("div");
    editorBox.append(slot);
    try {
      const widget = await host.getWidget(ref);
      await widget.render({ el: slot, signal: child.signal });
    } catch (e) {
      editorBox.replaceChildren(h("div", { class: "sbplab-error", text: `the editor could not be shown: ${e}` }));
    }
  }

  function draw() {
    options(hwSel, model.get("hardware_names"));
    hwSel.value = model.get("hardware");
    options(methodSel, model.get("method_names"));
    methodSel.value = model.get("method");
    showValue(devIn, model.get("devices"));
    showValue(memIn, model.get("memory_limit"));
    showValue(budgetIn, model.get("time_budget"));

    const st = model.get("status");
    const searching = st === "searching";
    searchBtn.disabled = searching;
    bar.value = model.get("progress");
    let text = st === "idle" ? "press Search" : st;
    if (searching) {
      const total = model.get("units_total");
      text = `searching${model.get("phase") ? ` (${model.get("phase")})` : ""}`
        + (total ? `: ${model.get("units_done")} of ${total} steps` : "");
      const best = model.get("best_ms");
      text += best == null ? ", nothing found yet" : `, best so far ${fmtMs(best)} ms/step: ${model.get("best_label")}`;
    } else if (st === "done") {
      text = `done in ${model.get("seconds").toFixed(1)} s`;
    } else if (st === "failed") {
      text = "the search failed (see below)";
    }
    const rows = model.get("rows") || [];
    if (model.get("stale") && rows.length) text += "; showing the last good result";
    status.textContent = text;
    error.textContent = model.get("error");
    error.hidden = !model.get("error");
    note.textContent = model.get("note");
    note.hidden = !model.get("note");

    result.hidden = !rows.length;
    result.classList.toggle("stale", model.get("stale"));
    summary.textContent = model.get("summary");
    resultFor.textContent = `for ${model.get("result_for")}`;
    table.replaceChildren(h("tr", {}, ...HEAD.map((c) => h("th", { text: c }))));
    for (const r of rows) {
      table.append(h("tr", { class: r.searched ? "searched" : "", "data-searched": String(r.searched) },
        h("td", { text: r.strategy }), h("td", { text: fmtMs(r.analytic_ms) }), h("td", { text: fmtBytes(r.memory) }),
        // a finalist the simulator was spared shows the floor it cannot go below, marked ">=" (SearchResult.rows)
        h("td", { text: r.at_least ? `>=${fmtMs(r.ms)}` : fmtMs(r.simulated_ms), title: r.at_least ? r.model : "" }),
        h("td", { text: r.ratio == null ? "-" : `${r.at_least ? ">=" : ""}${r.ratio.toFixed(2)}x` })));
    }
    explanation.textContent = model.get("explanation");
    openBtn.disabled = searching || !rows.length;
    editorNote.textContent = model.get("editor_note");
    if (model.get("editor_ref") !== shownRef) showEditor(model.get("editor_ref"));
  }

  const stop = redrawOn(model, DERIVED, draw);
  return () => { stop(); child?.abort(); };
}

export default { initialize, render };
