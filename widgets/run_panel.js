// RunPanel front end: steps and backend in, a run button; the simulator's prediction, progress, losses
// side by side, the measured step time against the prediction and the timeline out. The run itself happens in Python (sbplab.widgets.run_panel); this file renders state.
// Elements carry stable data-testid attributes for a browser test.

const DERIVED = [
  "steps", "backend", "backends", "strategy_name", "ranks", "stale", "status", "progress", "steps_done",
  "run_losses", "stage_ms", "loss_rows",
  "loss_diff", "param_diff", "worst_param", "passed", "timeline_ref", "makespan_us", "firings", "wall_s", "note",
  "error", "tol", "hardware_name", "predicted", "predict_error", "measured", "compare_text", "ran_for",
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
const fmtMs = (ms) => (Math.abs(ms) < 5e-7 ? "0 ms"  // a sum's rounding (1.7e-15) is no time at all
  : ms >= 100 ? `${ms.toFixed(0)} ms` : `${ms.toPrecision(3)} ms`);
// the prediction's error (predicted / measured - 1); far off, as the run's multiple of the prediction
// ("-100%" said nothing about a run 200 times slower than an uncalibrated spec sheet)
const pct = (e) => (e > -0.5 ? `error ${e >= 0 ? "+" : ""}${(e * 100).toFixed(0)}%`
  : `the run took ${1 / (1 + e) >= 10 ? (1 / (1 + e)).toFixed(0) : (1 / (1 + e)).toPrecision(2)}x the predicted time`);

function render({ model, el, host }) {
  const commit = (name, value) => { model.set(name, value); model.save_changes(); };
  el.classList.add("sbplab-widget", "sbplab-rp");

  const stepsIn = h("input", { type: "number", min: "1", "data-testid": "steps-input" });
  onEnterOrChange(stepsIn, (v) => commit("steps", Number(v)));
  const backendSel = h("select", { "data-testid": "backend-select" });
  backendSel.addEventListener("change", () => commit("backend", backendSel.value));
  const runBtn = h("button", { type: "button", class: "rp-run", "data-testid": "run-button", text: "run" });
  runBtn.addEventListener("click", () => commit("run_requests", model.get("run_requests") + 1));
  const what = h("div", { class: "rp-what", "data-testid": "strategy" });
  const predicted = h("div", { class: "rp-predicted", "data-testid": "prediction" });
  const predTable = h("table", { class: "rp-pred-table", "data-testid": "prediction-table" });
  const predError = h("div", { class: "rp-error sbplab-error", "data-testid": "predict-error", role: "alert" });
  const measured = h("div", { class: "rp-measured", "data-testid": "measured" });
  const compareText = h("pre", { class: "rp-compare", "data-testid": "compare-table" });
  const compareBox = h("details", {}, h("summary", { text: "predicted against measured, per rank, lane and kind" }),
    compareText);
  const bar = h("progress", { max: "1", value: "0", "data-testid": "progress" });
  const status = h("span", { class: "rp-status sbplab-status", "data-testid": "status" });
  const error = h("div", { class: "rp-error sbplab-error", "data-testid": "error-message", role: "alert" });
  const note = h("div", { class: "rp-note sbplab-note", "data-testid": "note-message" });
  const verdict = h("div", { class: "rp-verdict", "data-testid": "check" });
  const losses = h("table", { class: "rp-losses", "data-testid": "loss-table" });
  const timeline = h("div", { class: "rp-timeline", "data-testid": "timeline" });
  // what the last run measured, under a banner naming its strategy once the strategy has changed
  const staleNote = h("div", { class: "sbplab-note rp-stale-note", "data-testid": "stale-note" });
  const results = h("section", { class: "rp-results", "data-testid": "results" }, staleNote, measured, compareBox,
    verdict, losses, timeline);

  el.append(
    h("div", { class: "rp-inputs" }, field("steps", stepsIn), field("run on", backendSel), runBtn),
    what, predicted, predError, predTable, h("div", { class: "rp-progress" }, bar, status), error, note, results,
  );

  function drawPrediction() {
    const p = model.get("predicted") || {};
    if (p.step_ms === undefined) {
      predicted.textContent = model.get("strategy_name") && !model.get("predict_error")
        ? `prediction on ${model.get("hardware_name")}: computed before the run` : "";
    } else {
      predicted.textContent = `predicted on ${p.hardware} (${p.origin}): ${fmtMs(p.step_ms)} per step`;
    }
    predicted.hidden = !predicted.textContent;
    predError.textContent = model.get("predict_error");
    predError.hidden = !model.get("predict_error");
    predTable.replaceChildren();
    predTable.hidden = !(p.ranks || []).length;
    if (p.ranks) {
      predTable.append(h("tr", {}, ...["rank", "predicted peak memory", "compute", "exposed comm", "idle"]
        .map((c) => h("th", { text: c }))));
      for (const r of p.ranks) {
        predTable.append(h("tr", { "data-rank": String(r.rank) }, h("td", { text: String(r.rank) }),
          h("td", { text: fmtBytes(r.peak) }), ...[r.compute_ms, r.comm_ms, r.idle_ms].map((v) => h("td", { text: fmtMs(v) }))));
      }
    }
    const m = model.get("measured") || {};
    measured.hidden = m.step_ms === undefined;
    measured.classList.toggle("elsewhere", m.comparable === false);
    if (m.step_ms !== undefined) {
      const ran = `measured ${fmtMs(m.step_ms)} per step on ${m.ran_on || "the workers"} (median of the steps `
        + `after the first; each: ${m.steps_ms.map(fmtMs).join(", ")})`;
      measured.textContent = m.comparable === false  // another machine's prediction: no error figure
        ? `${ran}; the prediction (${fmtMs(m.predicted_ms)}) is for ${m.hardware}: not comparable (${m.why}). `
          + "Predict on this machine's Hardware (cpu_box, or cluster.calibrate()) to compare."
        : `${ran}; predicted ${fmtMs(m.predicted_ms)} on ${m.hardware}` + (m.error == null ? "" : `, ${pct(m.error)}`)
          + (m.error != null && Math.abs(m.error) > 0.5 && m.origin === "spec sheet"
            ? " (a spec sheet: cluster.calibrate() measures this machine)" : "");
    }
    compareText.textContent = model.get("compare_text");
    compareBox.hidden = !model.get("compare_text");
  }

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
    if (model.get("timeline_ref") !== shownRef) showTimeline(model.get("timeline_ref"));
    const stale = model.get("stale") && !!model.get("ran_for");
    results.classList.toggle("stale", stale);
    staleNote.hidden = !stale;
    staleNote.textContent = stale ? `the results below are of ${model.get("ran_for")}, before the strategy changed: `
      + "run again to measure the strategy above" : "";
    drawPrediction();
  }

  // the run's timeline: an ipywidgets Output holding what sl.timeline shows a notebook (the theme's
  // stylesheet, then plotly's own output), drawn here as JupyterLab draws any widget view
  let shownRef = "";
  let child = null;  // the Output's view shown now
  let sizer = null;  // tells it when the panel's width changes (a scrollbar, the sidebar, the window)
  async function showTimeline(ref) {
    shownRef = ref;
    sizer?.disconnect();
    child?.remove();
    child = sizer = null;
    timeline.replaceChildren();
    if (!ref) return;
    const manager = model.widget_manager;
    if (!manager?.create_view) {
      timeline.append(h("div", { class: "sbplab-note", text: "this front end cannot draw one widget inside another: "
        + "display(panel.timeline_output) in a cell to see the timeline" }));
      return;
    }
    try {
      const view = await manager.create_view(await manager.get_model(ref));
      if (shownRef !== ref) { view.remove(); return; }  // a newer run's timeline came meanwhile
      child = view;
      timeline.append(view.el);
      // a Lumino widget (JupyterLab's output area) lays out and draws its outputs once told it is attached
      const lumino = view.luminoWidget || view.pWidget;
      lumino?.processMessage?.({ type: "after-attach", isConflatable: false });
      lumino?.processMessage?.({ type: "after-show", isConflatable: false });
      // and that its size changed whenever the panel's does: plotly's renderer then fits the figure to it
      sizer = new ResizeObserver(() => lumino?.processMessage?.({ type: "resize", width: -1, height: -1,
        isConflatable: false }));
      sizer.observe(timeline);
    } catch (e) {
      timeline.replaceChildren(h("div", { class: "sbplab-error", text: `the timeline could not be shown: ${e}` }));
    }
  }

  const stop = redrawOn(model, DERIVED, draw);
  return () => { stop(); sizer?.disconnect(); child?.remove(); };
}

export default { initialize, render };
