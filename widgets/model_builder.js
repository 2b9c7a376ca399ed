// ModelBuilder front end: zoo model and sizes, or a layer list; shows the logical graph Python drew.
// All model logic lives in Python (sbplab.widgets.model_builder); this file renders state and sends
// edits back. Elements carry stable data-testid attributes for a browser test.

const DERIVED = [
  "mode", "zoo_model", "config", "batch", "in_features", "layers", "collapse", "zoo_names", "layer_kinds",
  "config_fields", "layer_names", "summary", "graph_svg", "graph_text", "graph_note", "error", "stale",
];

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
  return h("label", { class: "mb-field" }, h("span", { class: "sbplab-label", text: label }), control);
}

/** A whole-number field that applies on Enter or on leaving it. */
function numberInput(testid, onCommit) {
  const input = h("input", { type: "number", min: "1", step: "1", "data-testid": testid });
  return onEnterOrChange(input, (v) => onCommit(Number(v)));
}

function render({ model, el }) {
  const commit = (name, value) => { model.set(name, value); model.save_changes(); };
  el.classList.add("sbplab-widget", "sbplab-mb");

  const modeSel = h("select", { "data-testid": "mode-select", "aria-label": "build from" });
  for (const [v, t] of [["zoo", "zoo model"], ["layers", "layer by layer"]]) modeSel.append(h("option", { value: v, text: t }));
  modeSel.addEventListener("change", () => commit("mode", modeSel.value));
  const zooSel = h("select", { "data-testid": "zoo-select", "aria-label": "zoo model" });
  zooSel.addEventListener("change", () => commit("zoo_model", zooSel.value));
  const batchIn = numberInput("batch-input", (v) => commit("batch", v));
  const inFeaturesIn = numberInput("in-features-input", (v) => commit("in_features", v));
  const collapseBox = h("input", { type: "checkbox", "data-testid": "collapse-toggle" });
  collapseBox.addEventListener("change", () => commit("collapse", collapseBox.checked));

  const sizes = h("div", { class: "mb-sizes", "data-testid": "config-fields" });
  const layerList = h("ol", { class: "mb-layers", "data-testid": "layer-list" });
  const addKind = h("select", { "data-testid": "add-kind", "aria-label": "layer kind" });
  const addSize = h("input", { type: "number", min: "1", value: "32", "data-testid": "add-size" });
  const addBtn = h("button", { type: "button", "data-testid": "add-layer", text: "add layer" });
  const addLayer = () => {
    const layer = addKind.value === "Linear" ? { kind: "Linear", size: Number(addSize.value) } : { kind: addKind.value };
    commit("layers", [...(model.get("layers") || []), layer]);
  };
  addBtn.addEventListener("click", addLayer);
  onEnter(addSize, addLayer);  // Enter in the size field adds the layer, like the button
  const layersPanel = h("div", { class: "mb-layers-panel" }, field("input features", inFeaturesIn), layerList,
    h("div", { class: "mb-add" }, addKind, addSize, addBtn));

  const error = h("div", { class: "mb-error sbplab-error", "data-testid": "error-message", role: "alert" });
  const staleNote = h("div", { class: "sbplab-status", "data-testid": "stale-note",
    text: "showing the last model that built; fix the error above to rebuild" });
  const summary = h("div", { class: "mb-summary", "data-testid": "model-summary" });
  const graph = h("div", { class: "mb-graph", "data-testid": "logical-graph" });
  const zoomBar = h("div", { class: "sbplab-zoombar", "data-testid": "graph-zoom" });
  const zoom = panZoom(graph, zoomBar);
  const note = h("div", { class: "mb-note sbplab-note", "data-testid": "graph-note" });
  const dump = h("pre", { class: "mb-dump", "data-testid": "graph-text" });
  const dumpBox = h("details", {}, h("summary", { text: "graph as text" }), dump);

  el.append(
    h("div", { class: "mb-inputs" }, field("build from", modeSel), field("model", zooSel), field("batch", batchIn),
      field("collapse repeated layers", collapseBox)),
    sizes, layersPanel, error, staleNote, summary, note, h("div", { class: "mb-graph-box" }, zoomBar, graph), dumpBox,
  );

  let sizesKey = "";  // the fields the size controls were made for: kept while they stay the same
  let shownSvg = null;  // the graph SVG now in the box
  function drawSizes() {
    const fields = model.get("config_fields") || [];
    const key = JSON.stringify(fields.map((f) => [f.name, f.kind, f.choices]));
    if (key !== sizesKey) {
      sizesKey = key;
      sizes.replaceChildren(...fields.map((f) => field(f.name, sizeControl(f))));
    }
    fields.forEach((f, i) => {
      const control = sizes.children[i].querySelector("input, select");
      if (control.type === "checkbox") control.checked = Boolean(f.value);
      else showValue(control, f.value);
    });
  }

  function sizeControl(f) {
    const tid = `size-${f.name}`;
    const set = (v) => commit("config", { ...(model.get("config") || {}), [f.name]: v });
    if (f.kind === "bool") {
      const box = h("input", { type: "checkbox", "data-testid": tid });
      box.addEventListener("change", () => set(box.checked));
      return box;
    }
    if (f.choices && f.choices.length) {
      const sel = h("select", { "data-testid": tid });
      for (const c of f.choices) sel.append(h("option", { value: c, text: c }));
      sel.addEventListener("change", () => set(sel.value));
      return sel;
    }
    if (f.kind === "int") return numberInput(tid, set);
    return onEnterOrChange(h("input", { type: "text", "data-testid": tid }), set);
  }

  function drawLayers() {
    const layers = model.get("layers") || [];
    const names = model.get("layer_names") || [];
    layerList.replaceChildren();
    layers.forEach((layer, i) => {
      const del = h("button", { type: "button", class: "mb-remove sbplab-remove", "data-testid": `remove-layer-${i}`, text: "✕",
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
    showValue(batchIn, model.get("batch"));
    showValue(inFeaturesIn, model.get("in_features"));
    collapseBox.checked = model.get("collapse");
    sizes.hidden = mode !== "zoo";
    layersPanel.hidden = mode !== "layers";
    drawSizes();
    drawLayers();
    error.textContent = model.get("error");
    error.hidden = !model.get("error");
    staleNote.hidden = !model.get("stale");
    summary.textContent = model.get("summary");
    note.textContent = model.get("graph_note");
    note.hidden = !model.get("graph_note");
    const svgText = model.get("graph_svg");
    if (svgText !== shownSvg) {  // a redraw for other traits keeps the person's zoom and scroll
      shownSvg = svgText;
      graph.innerHTML = svgText;  // SVG made by graphviz from DOT text escaped in sbplab.viz
      zoom.refit();
    }
    dump.textContent = model.get("graph_text");
    dumpBox.open = !model.get("graph_svg");
  }

  const stop = redrawOn(model, DERIVED, draw);
  return () => { stop(); zoom.dispose(); };
}

export default { initialize, render };
