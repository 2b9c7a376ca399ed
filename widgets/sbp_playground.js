// SbpPlayground front end: draws what the Python model derived, and sends back clicks and typed text.
// All the SBP logic lives in Python (sbplab.widgets.playground); this file only renders state.
// Elements carry stable data-testid attributes so a browser test can click and read them.

const DERIVED = [
  "shape", "mesh_shape", "choices", "axis_names", "src_sbp", "dst_sbp", "src_svg", "dst_svg",
  "src_type", "dst_type", "local_shapes", "steps", "total_bytes", "time_us", "boxing_text",
  "error", "note", "shape_text", "mesh_text", "dtype", "device_type",
];
const DTYPES = ["float32", "float16", "bfloat16", "float64"];
const DEVICES = ["cpu", "cuda"];

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

/** "S(0)" -> "S0", "P(max)" -> "Pmax": a test id fragment without brackets. */
export function token(value) {
  return value.replace(/[()\s]/g, "");
}

function textInput(testid, label, onCommit) {
  const input = h("input", { "data-testid": testid, type: "text", spellcheck: "false", "aria-label": label });
  onEnterOrChange(input, onCommit);
  return [h("label", { class: "pg-field" }, h("span", { class: "sbplab-label", text: label }), input), input];
}

function select(testid, label, options, onPick) {
  const sel = h("select", { "data-testid": testid, "aria-label": label });
  for (const o of options) sel.append(h("option", { value: o, text: o }));
  sel.addEventListener("change", () => onPick(sel.value));
  return [h("label", { class: "pg-field" }, h("span", { class: "sbplab-label", text: label }), sel), sel];
}

function render({ model, el }) {
  const commit = (name, value) => { model.set(name, value); model.save_changes(); };
  const [shapeField, shapeIn] = textInput("shape-input", "tensor shape", (v) => commit("shape_text", v));
  const [meshField, meshIn] = textInput("mesh-input", "mesh shape", (v) => commit("mesh_text", v));
  const [dtypeField, dtypeSel] = select("dtype-select", "dtype", DTYPES, (v) => commit("dtype", v));
  const [devField, devSel] = select("device-select", "devices", DEVICES, (v) => commit("device_type", v));
  const error = h("div", { class: "pg-error sbplab-error", "data-testid": "error-message", role: "alert" });
  const note = h("div", { class: "pg-note sbplab-note", "data-testid": "note-message" });

  const side = (name, title) => {
    const axes = h("div", { class: "pg-axes", "data-testid": `${name}-axes` });
    const type = h("div", { class: "pg-type", "data-testid": `${name}-type` });
    const layout = h("div", { class: "pg-layout", "data-testid": `${name}-layout` });
    const box = h("section", { class: "pg-side", "data-side": name }, h("h4", { text: title }), axes, type, layout);
    return { box, axes, type, layout };
  };
  const src = side("src", "from");
  const dst = side("dst", "to");

  const summary = h("div", { class: "pg-boxing-summary", "data-testid": "boxing-summary" });
  const stepsTable = h("table", { class: "pg-steps", "data-testid": "boxing-steps" });
  const planText = h("pre", { class: "pg-plan-text", "data-testid": "boxing-text" });
  const shapesTable = h("table", { class: "pg-shapes", "data-testid": "local-shapes" });

  el.classList.add("sbplab-widget", "sbplab-pg");
  el.append(
    h("div", { class: "pg-inputs" }, shapeField, meshField, dtypeField, devField),
    error, note,
    h("div", { class: "pg-sides" }, src.box, dst.box),
    h("div", { class: "pg-boxing", "data-testid": "boxing" }, h("h4", { text: "boxing" }), summary, stepsTable,
      h("details", {}, h("summary", { text: "plan as text" }), planText)),
    h("details", { class: "pg-local" }, h("summary", { text: "local shapes per rank" }), shapesTable),
  );

  function drawAxes(part, name) {
    const current = model.get(`${name}_sbp`) || [];
    const choices = model.get("choices") || [];
    const names = model.get("axis_names") || [];
    part.axes.replaceChildren();
    current.forEach((value, axis) => {
      const row = h("div", { class: "pg-axis", "data-testid": `${name}-axis${axis}` },
        h("span", { class: "pg-axis-name", text: names[axis] || `axis${axis}` }));
      for (const choice of choices) {
        const on = choice === value;
        const btn = h("button", {
          type: "button", class: on ? "sbp-choice selected" : "sbp-choice",
          "data-testid": `${name}-axis${axis}-${token(choice)}`, "data-side": name,
          "data-axis": String(axis), "data-value": choice, "aria-pressed": String(on), text: choice,
        });
        btn.addEventListener("click", () => {
          const next = [...(model.get(`${name}_sbp`) || [])];
          next[axis] = choice;
          commit(`${name}_sbp`, next);
        });
        row.append(btn);
      }
      part.axes.append(row);
    });
  }

  function drawSteps() {
    const steps = model.get("steps") || [];
    const err = model.get("error");
    if (err) summary.textContent = "";
    else if (steps.length === 0) summary.textContent = "nothing to do: same SBP";
    else summary.textContent = `${steps.length} step(s): ${steps.map((s) => s.kind).join(" → ")}, `
      + `${fmtBytes(model.get("total_bytes"))} sent in total, ~${model.get("time_us").toFixed(2)} us`;
    stepsTable.replaceChildren();
    if (!steps.length) return;
    stepsTable.append(h("tr", {}, ...["step", "axis", "from → to", "bytes", "time", "why"]
      .map((c) => h("th", { text: c }))));
    steps.forEach((s, i) => stepsTable.append(h("tr", { class: "boxing-step", "data-testid": `boxing-step-${i}` },
      h("td", { text: s.kind }), h("td", { text: s.axis }), h("td", { text: `${s.from} → ${s.to}` }),
      h("td", { text: s.bytes }), h("td", { text: `${s.time_us.toFixed(2)} us` }), h("td", { text: s.why }))));
  }

  function drawShapes() {
    const rows = model.get("local_shapes") || [];
    shapesTable.replaceChildren(h("tr", {}, ...["rank", "mesh coords", "from", "to"].map((c) => h("th", { text: c }))));
    for (const r of rows) {
      shapesTable.append(h("tr", { "data-rank": String(r.rank) }, h("td", { text: String(r.rank) }),
        h("td", { text: `(${r.coords.join(",")})` }), h("td", { text: `[${r.src.join(", ")}]` }),
        h("td", { text: `[${r.dst.join(", ")}]` })));
    }
  }

  function draw() {
    showValue(shapeIn, model.get("shape_text"));
    showValue(meshIn, model.get("mesh_text"));
    dtypeSel.value = model.get("dtype");
    devSel.value = model.get("device_type");
    error.textContent = model.get("error");
    error.hidden = !model.get("error");
    note.textContent = model.get("note");
    note.hidden = !model.get("note");
    drawAxes(src, "src");
    drawAxes(dst, "dst");
    src.type.textContent = model.get("src_type");
    dst.type.textContent = model.get("dst_type");
    src.layout.innerHTML = model.get("src_svg");  // SVG built by sbplab.viz, text escaped there
    dst.layout.innerHTML = model.get("dst_svg");
    planText.textContent = model.get("boxing_text");
    drawSteps();
    drawShapes();
  }

  // Python sends many traits per recompute; draw once after the batch.
  return redrawOn(model, DERIVED, draw);
}

export default { initialize, render };
