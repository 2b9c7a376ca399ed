// ModelBuilder front end: zoo model and sizes, or a layer list; shows the logical graph Python drew.
// All model logic lives in Python (sbplab.widgets.model_builder); this file renders state and sends
// edits back. Elements carry stable data-testid attributes for a browser test.

const DERIVED = [
  "mode", "zoo_model", "config", "batch", "in_features", "layers", "collapse", "zoo_names", "layer_kinds",
  "config_fields", "layer_names", "summary", "graph_svg", "graph_text", "graph_note", "error",
];

function field(label, control) {
  return h("label", { class: "mb-field" }, h("span", { text: label }), control);
}

function numberInput(testid, value, onCommit) {
  const input = h("input", { type: "number", min: "1", step: "1", "data-testid": testid });
  input.value = String(value);
  input.addEventListener("change", () => onCommit(Number(input.value)));
  return input;
}

function render({ model, el }) {
  const commit = (name, value) => { model.set(name, value); model.save_changes(); };
  el.classList.add("sbplab-widget", "sbplab-mb");

  const modeSel = h("select", { "data-testid": "mode-select", "aria-label": "build from" });
  for (const [v, t] of [["zoo", "zoo model"], ["layers", "layer by layer"]]) modeSel.append(h("option", { value: v, text: t }));
  modeSel.addEventListener("change", () => commit("mode", modeSel.value));
  const zooSel = h("select", { "data-testid": "zoo-select", "aria-label": "zoo model" });
  zooSel.addEventListener("change", () => commit("zoo_model", zooSel.value));
  const batchBox = h("span");
  const collapseBox = h("input", { type: "checkbox", "data-testid": "collapse-toggle" });
  collapseBox.addEventListener("change", () => commit("collapse", collapseBox.checked));

  const sizes = h("div", { class: "mb-sizes", "data-testid": "config-fields" });
  const layerList = h("ol", { class: "mb-layers", "data-testid": "layer-list" });
  const addKind = h("select", { "data-testid": "add-kind", "aria-label": "layer kind" });
  const addSize = h("input", { type: "number", min: "1", value: "32", "data-testid": "add-size" });
  const addBtn = h("button", { type: "button", "data-testid": "add-layer", text: "add layer" });
  addBtn.addEventListener("click", () => {
    const layer = addKind.value === "Linear" ? { kind: "Linear", size: Number(addSize.value) } : { kind: addKind.value };
    commit("layers", [...(model.get("layers") || []), layer]);
  });
  const inBox = h("span");
  const layersPanel = h("div", { class: "mb-layers-panel" }, inBox, layerList,
    h("div", { class: "mb-add" }, addKind, addSize, addBtn));

  const error = h("div", { class: "mb-error", "data-testid": "error-message", role: "alert" });
  const summary = h("div", { class: "mb-summary", "data-testid": "model-summary" });
  const graph = h("div", { class: "mb-graph", "data-testid": "logical-graph" });
  const note = h("div", { class: "mb-note", "data-testid": "graph-note" });
  const dump = h("pre", { class: "mb-dump", "data-testid": "graph-text" });
  const dumpBox = h("details", {}, h("summary", { text: "graph as text" }), dump);

  el.append(
    h("div", { class: "mb-inputs" }, field("build from", modeSel), field("model", zooSel), batchBox,
      field("collapse repeated layers", collapseBox)),
    sizes, layersPanel, error, summary, note, graph, dumpBox,
  );

  function drawSizes() {
    sizes.replaceChildren();
    for (const f of model.get("config_fields") || []) {
      let control;
      const tid = `size-${f.name}`;
      const set = (v) => commit("config", { ...(model.get("config") || {}), [f.name]: v });
      if (f.kind === "bool") {
        control = h("input", { type: "checkbox", "data-testid": tid });
        control.checked = Boolean(f.value);
        control.addEventListener("change", () => set(control.checked));
      } else if (f.choices && f.choices.length) {
        control = h("select", { "data-testid": tid });
        for (const c of f.choices) control.append(h("option", { value: c, text: c }));
        control.value = f.value;
        control.addEventListener("change", () => set(control.value));
      } else if (f.kind === "int") {
        control = numberInput(tid, f.value, set);
      } else {
        control = h("input", { type: "text", "data-testid": tid });
        control.value = String(f.value);
        control.addEventListener("change", () => set(control.value));
      }
      sizes.append(field(f.name, control));
    }
  }

  function drawLayers() {
    const layers = model.get("layers") || [];
    const names = model.get("layer_names") || [];
    layerList.replaceChildren();
    layers.forEach((layer, i) => {
      const del = h("button", { type: "button", class: "mb-remove", "data-testid": `remove-layer-${i}`, text: "✕",
        title: "remove this layer" });
      del.addEventListener("click", () => commit("layers", layers.filter((_, j) => j !== i)));
      const text = layer.kind === "Linear" ? `Linear → ${layer.size}` : layer.kind;
      layerList.append(h("li", { "data-testid": `layer-${i}` }, h("code", { text: names[i] || "" }),
        h("span", { text: ` ${text} ` }), del));
    });
  }

  function draw() {
    const mode = model.get("mode");
    modeSel.value = mode;
    zooSel.replaceChildren(...(model.get("zoo_names") || []).map((n) => h("option", { value: n, text: n })));
    zooSel.value = model.get("zoo_model");
    zooSel.disabled = mode !== "zoo";
    addKind.replaceChildren(...(model.get("layer_kinds") || []).map((n) => h("option", { value: n, text: n })));
    batchBox.replaceChildren(field("batch", numberInput("batch-input", model.get("batch"), (v) => commit("batch", v))));
    inBox.replaceChildren(field("input features",
      numberInput("in-features-input", model.get("in_features"), (v) => commit("in_features", v))));
    collapseBox.checked = model.get("collapse");
    sizes.hidden = mode !== "zoo";
    layersPanel.hidden = mode !== "layers";
    drawSizes();
    drawLayers();
    error.textContent = model.get("error");
    error.hidden = !model.get("error");
    summary.textContent = model.get("summary");
    note.textContent = model.get("graph_note");
    note.hidden = !model.get("graph_note");
    graph.innerHTML = model.get("graph_svg");  // SVG made by graphviz from DOT text escaped in sbplab.viz
    dump.textContent = model.get("graph_text");
    dumpBox.open = !model.get("graph_svg");
  }

  return redrawOn(model, DERIVED, draw);
}

export default { render };
