// ModelBuilder front end: zoo model and sizes, or a layer list; shows the logical graph Python drew.
// All model logic lives in Python (sbplab.widgets.model_builder); this file renders state and sends
// edits back. Elements carry stable data-testid attributes for a browser test.

const DERIVED = [
  "mode", "zoo_model", "config", "batch", "in_features", "layers", "collapse", "zoo_names", "layer_kinds",
  "config_fields", "layer_names", "summary", "graph_svg", "graph_text", "graph_note", "error", "stale",
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
  return h("label", { class: "mb-field" }, h("span", { class: "sbplab-label", text: label }), control);
}

/** A whole-number field that applies on Enter or on leaving it. */
function numberInput(testid, onCommit) {
  const input = h("input", { type: "number", min: "1", step: "1", "data-testid": testid });
  return onEnterOrChange(input, (v) => onCommit(Number(v)));
}

const MIN_FONT_PX = 9;  // the graph's smallest label is never drawn smaller than this
const GROW = 1.5;  // a small graph may grow to this many times its natural size to fill the box

/**
 * Size the graphviz SVG in `box` the way sbplab.viz.zoom_box does for notebooks: its viewBox kept, as
 * wide as the box and anchored at the top left, but never so narrow that its smallest text falls
 * under MIN_FONT_PX pixels (the box scrolls instead) nor wider than GROW times its natural size. Returns the
 * widths (CSS px) the zoom controls move between, or null when there is no SVG.
 */
function fitGraph(box) {
  const svg = box.querySelector("svg");
  if (!svg) return null;
  const vb = (svg.getAttribute("viewBox") || "").split(/[\s,]+/).map(Number);
  if (vb.length !== 4 || !(vb[2] > 0)) return null;
  const unit = { pt: 4 / 3, px: 1, "": 1 };
  const m = /^([\d.]+)\s*([a-z]*)$/.exec(svg.getAttribute("width") || "");
  // its own size, read once: the width attribute is dropped below, and "1:1" fits again later
  const natural = Number(svg.dataset.naturalWidth) || (m && m[2] in unit ? Number(m[1]) * unit[m[2]] : vb[2]);
  svg.dataset.naturalWidth = String(natural);
  const g = svg.querySelector("g[transform*=scale]");
  const gs = g ? Number((/scale\(([\d.]+)/.exec(g.getAttribute("transform")) || [0, 1])[1]) : 1;
  const sizes = [...svg.querySelectorAll("text[font-size]")].map((t) => parseFloat(t.getAttribute("font-size")) * gs);
  const minFont = sizes.length ? Math.min(...sizes) : 0;
  const minWidth = minFont > 0 ? vb[2] * MIN_FONT_PX / minFont : 0;
  const maxWidth = Math.max(natural * GROW, minWidth);
  for (const a of ["width", "height"]) svg.removeAttribute(a);
  svg.setAttribute("preserveAspectRatio", "xMinYMin meet");
  Object.assign(svg.style, { display: "block", width: "100%", height: "auto", minWidth: `${minWidth}px`,
    maxWidth: `${maxWidth}px` });
  box.scrollTop = 0;
  box.scrollLeft = startOf(box, svg);
  return { svg, minWidth, maxWidth };
}

/** Where the box scrolls sideways at first: 0 (the top left), unless the graph's first node lies
 * beyond the box's right edge (graphviz may put a wide graph's inputs there); then far enough to show it. */
function startOf(box, svg) {
  const nodes = [...svg.querySelectorAll("g.node")];
  if (!nodes.length || svg.getBoundingClientRect().width <= box.clientWidth) return 0;
  const left = svg.getBoundingClientRect().left;
  const first = nodes.map((n) => n.getBoundingClientRect()).reduce((a, b) => (b.top < a.top ? b : a));
  return first.right - left <= box.clientWidth ? 0 : Math.max(0, first.left - left - box.clientWidth / 3);
}

/** Zoom (buttons, Ctrl/⌘ + wheel around the pointer) and drag-to-pan for the graph box. */
function panZoom(box, bar) {
  let fit = null;
  const zoomTo = (w, cx, cy) => {
    if (!fit) return;
    const { svg } = fit;
    const old = svg.getBoundingClientRect().width || 1, r = box.getBoundingClientRect();
    const px = cx === undefined ? box.clientWidth / 2 : cx - r.left;
    const py = cy === undefined ? box.clientHeight / 2 : cy - r.top;
    w = Math.max(40, Math.min(w, fit.maxWidth * 8));
    Object.assign(svg.style, { minWidth: "0", maxWidth: "none", width: `${w}px` });
    const k = w / old;
    box.scrollLeft = (box.scrollLeft + px) * k - px;
    box.scrollTop = (box.scrollTop + py) * k - py;
  };
  const width = () => (fit ? fit.svg.getBoundingClientRect().width : 0);
  const buttons = [["zoom-in", "+", "zoom in (Ctrl/⌘ + wheel)", () => zoomTo(width() * 1.25)],
    ["zoom-out", "−", "zoom out", () => zoomTo(width() / 1.25)],
    ["zoom-fit", "fit", "the whole graph in the box", () => { zoomTo(box.clientWidth); box.scrollLeft = box.scrollTop = 0; }],
    ["zoom-reset", "1:1", "readable size, top left", () => { fit = fitGraph(box); }]];
  for (const [id, text, title, act] of buttons) {
    const b = h("button", { type: "button", "data-testid": id, text, title });
    b.addEventListener("click", act);
    bar.append(b);
  }
  box.addEventListener("wheel", (e) => {
    if (!(e.ctrlKey || e.metaKey) || !fit) return;
    e.preventDefault();
    zoomTo(width() * Math.exp(-e.deltaY * 0.002), e.clientX, e.clientY);
  }, { passive: false });
  let drag = null;
  box.addEventListener("pointerdown", (e) => {
    if (e.button === 0) drag = [e.clientX, e.clientY, box.scrollLeft, box.scrollTop];
  });
  const move = (e) => {
    if (!drag) return;
    box.scrollLeft = drag[2] - (e.clientX - drag[0]);
    box.scrollTop = drag[3] - (e.clientY - drag[1]);
  };
  const up = () => { drag = null; };
  window.addEventListener("pointermove", move);
  window.addEventListener("pointerup", up);
  return {
    refit: () => { fit = fitGraph(box); bar.hidden = !fit; },
    dispose: () => { window.removeEventListener("pointermove", move); window.removeEventListener("pointerup", up); },
  };
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
  const zoomBar = h("div", { class: "mb-zoom", "data-testid": "graph-zoom" });
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
