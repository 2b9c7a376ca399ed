// RunPanel front end: steps and backend in, a run button; progress, losses side by side and the
// timeline out. The run itself happens in Python (sbplab.widgets.run_panel); this file renders state.
// Elements carry stable data-testid attributes for a browser test.

const DERIVED = [
  "steps", "backend", "backends", "strategy_name", "ranks", "stale", "status", "progress", "steps_done",
  "run_losses", "stage_ms", "loss_rows",
  "loss_diff", "param_diff", "worst_param", "passed", "timeline_svg", "makespan_us", "firings", "wall_s", "note",
  "error", "tol",
];

// The helpers every widget shares (widgets/dom.js) arrive as the trait _dom_js and are imported here
// once per model; sbplab/widgets/widget_base.py says why (one ES module per widget, no bundler).
let h, fmtBytes, redrawOn, onEnter, onEnterOrChange, showValue;

async function initialize({ model }) {
  const url = URL.createObjectURL(new Blob([model.get("_dom_js")], { type: "text/javascript" }));
  const dom = await import(url);
  URL.revokeObjectURL(url);
  ({ h, fmtBytes, redrawOn, onEnter, onEnterOrChange, showValue } = dom);
  dom.useBaseCss(model);
}

function field(label, control) {
  return h("label", { class: "rp-field" }, h("span", { class: "sbplab-label", text: label }), control);
}

const sci = (x) => (x === 0 ? "0" : x.toExponential(2));

function render({ model, el }) {
  const commit = (name, value) => { model.set(name, value); model.save_changes(); };
  el.classList.add("sbplab-widget", "sbplab-rp");

  const stepsIn = h("input", { type: "number", min: "1", "data-testid": "steps-input" });
  onEnterOrChange(stepsIn, (v) => commit("steps", Number(v)));
  const backendSel = h("select", { "data-testid": "backend-select" });
  backendSel.addEventListener("change", () => commit("backend", backendSel.value));
  const runBtn = h("button", { type: "button", class: "rp-run", "data-testid": "run-button", text: "run" });
  runBtn.addEventListener("click", () => commit("run_requests", model.get("run_requests") + 1));
  const what = h("div", { class: "rp-what", "data-testid": "strategy" });
  const bar = h("progress", { max: "1", value: "0", "data-testid": "progress" });
  const status = h("span", { class: "rp-status sbplab-status", "data-testid": "status" });
  const error = h("div", { class: "rp-error sbplab-error", "data-testid": "error-message", role: "alert" });
  const note = h("div", { class: "rp-note sbplab-note", "data-testid": "note-message" });
  const verdict = h("div", { class: "rp-verdict", "data-testid": "check" });
  const losses = h("table", { class: "rp-losses", "data-testid": "loss-table" });
  const timeline = h("div", { class: "rp-timeline", "data-testid": "timeline" });

  el.append(
    h("div", { class: "rp-inputs" }, field("steps", stepsIn), field("run on", backendSel), runBtn),
    what, h("div", { class: "rp-progress" }, bar, status), error, note, verdict, losses, timeline,
  );

  function draw() {
    showValue(stepsIn, model.get("steps"));
    backendSel.replaceChildren(...(model.get("backends") || []).map((b) => h("option", { value: b, text: b })));
    backendSel.value = model.get("backend");
    const name = model.get("strategy_name");
    what.textContent = name ? `${name} on ${model.get("ranks")} rank(s)` + (model.get("stale") ? " (changed since the last run)" : "") : "";
    const st = model.get("status");
    const busy = !["idle", "done", "failed"].includes(st);
    runBtn.disabled = busy || !name;
    bar.value = model.get("progress");
    const ms = model.get("stage_ms") || {};
    const took = Object.entries(ms).map(([k, v]) => `${k} ${v.toFixed(0)} ms`).join(", ");
    let live = "";  // while running: how many steps are done and the latest loss
    if (st === "running" && model.get("steps_done") > 0) {
      const last = (model.get("run_losses") || []).at(-1);
      live = `: step ${model.get("steps_done")}/${model.get("steps")}`;
      if (last != null) live += `, loss ${last.toFixed(6)}`;
    }
    status.textContent = st + live + (took ? ` (${took})` : "");
    error.textContent = model.get("error");
    error.hidden = !model.get("error");
    note.textContent = model.get("note");
    note.hidden = !model.get("note");
    const rows = model.get("loss_rows") || [];
    verdict.hidden = !rows.length;
    verdict.className = `rp-verdict ${model.get("passed") ? "ok" : "bad"}`;
    verdict.textContent = `${model.get("passed") ? "matches" : "differs from"} single-device PyTorch: `
      + `max |loss diff| ${sci(model.get("loss_diff"))}, max |param diff| ${sci(model.get("param_diff"))}`
      + (model.get("worst_param") ? ` (${model.get("worst_param")})` : "") + `, tolerance ${sci(model.get("tol"))}`;
    losses.replaceChildren();
    if (rows.length) {
      losses.append(h("tr", {}, ...["step", "parallel run", "PyTorch", "|diff|"].map((c) => h("th", { text: c }))));
      for (const r of rows) {
        losses.append(h("tr", { "data-step": String(r.step) }, h("td", { text: String(r.step) }),
          h("td", { text: r.run.toFixed(6) }), h("td", { text: r.torch.toFixed(6) }), h("td", { text: sci(r.diff) })));
      }
    }
    timeline.innerHTML = model.get("timeline_svg");  // SVG built in Python, text escaped there
  }

  return redrawOn(model, DERIVED, draw);
}

export default { initialize, render };
