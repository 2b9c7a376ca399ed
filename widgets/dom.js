// Shared by every sbplab widget front end, written once. There is no bundler: Python sends this file's
// text as the synced trait `_dom_js` (sbplab/widgets/widget_base.py), and each widget's module imports
// it from a Blob URL in its `initialize` (the few lines at the top of each widget file).

/** Make an element: h("div", { class: "x", text: "hi", "data-testid": "y" }, child, ...). */
export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

/** 1500 -> "1.5 KB": the same decimal units as sbplab.fmt.fmt_bytes. */
export function fmtBytes(n) {
  const units = ["B", "KB", "MB", "GB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i += 1; }
  return i === 0 ? `${n} B` : `${n.toFixed(1)} ${units[i]}`;
}

/**
 * Redraw once per batch of trait changes (Python sends many traits per recompute), draw now, and
 * return the clean-up anywidget calls when the view goes away.
 */
export function redrawOn(model, names, draw) {
  let pending = false;
  const schedule = () => {
    if (pending) return;
    pending = true;
    queueMicrotask(() => { pending = false; draw(); });
  };
  for (const name of names) model.on(`change:${name}`, schedule);
  draw();
  return () => { for (const name of names) model.off(`change:${name}`, schedule); };
}

/** Call `apply(input.value)` when the person presses Enter in `input`; Enter stops here, so the
 * notebook does not also take it as a command. */
export function onEnter(input, apply) {
  input.addEventListener("keydown", (e) => {
    if (e.key !== "Enter" || e.isComposing) return;
    e.preventDefault();
    e.stopPropagation();
    apply(input.value);
  });
  return input;
}

/**
 * Call `apply(input.value)` when the person presses Enter in `input` or leaves it changed, the way
 * JupyterLab's own fields behave. Enter keeps the focus (type, Enter, look, type again); the
 * `change` the browser may fire for the same text afterwards is not sent twice.
 */
export function onEnterOrChange(input, apply) {
  let sent = null;  // the text Enter applied, until the person types again
  input.addEventListener("input", () => { sent = null; });
  onEnter(input, (value) => { sent = value; apply(value); });
  input.addEventListener("change", () => {
    if (input.value !== sent) apply(input.value);
    sent = null;
  });
  return input;
}

/** Show `value` in `input` unless the person is typing in it (a redraw must not undo their typing). */
export function showValue(input, value) {
  if (document.activeElement !== input) input.value = String(value);
}

/**
 * Put base.css (the rules on .sbplab-widget, sent as the trait `_base_css`) into the page once, the way
 * anywidget puts each widget's own CSS there, and replace it when a newer text arrives (live reload).
 */
export function useBaseCss(model) {
  const install = () => {
    let style = document.head.querySelector("style[data-sbplab-base]");
    if (!style) {
      style = document.createElement("style");
      style.setAttribute("data-sbplab-base", "");
      document.head.prepend(style);  // first, so each widget's own rules win
    }
    const css = model.get("_base_css");
    if (style.textContent !== css) style.textContent = css;
  };
  install();
  model.on("change:_base_css", install);
}

// --- graph boxes: readable graphviz pictures with zoom and pan ------------------------------------------
const MIN_FONT_PX = 9;  // the graph's smallest label is never drawn smaller than this
const GROW = 1;  // a small graph opens at its natural size: never enlarged and pushed past the box's edge

/**
 * Size the graphviz SVG in `box` the way sbplab.viz.zoom_box does for notebooks (every widget's graph box uses it): its viewBox kept, as
 * wide as the box and anchored at the top left, but never so narrow that its smallest text falls
 * under MIN_FONT_PX pixels (the box scrolls instead) nor wider than GROW times its natural size. Returns the
 * widths (CSS px) the zoom controls move between, or null when there is no SVG.
 */
export function fitGraph(box) {
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
export function panZoom(box, bar) {
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
  const fitWidth = () => {  // as wide as the box, and no taller than the box may grow (its max-height)
    const vb = fit ? fit.svg.viewBox.baseVal : null, cap = parseFloat(getComputedStyle(box).maxHeight);
    const tall = (cap > 0 ? cap : window.innerHeight * 0.8) - 2;
    return vb && vb.width > 0 && vb.height > 0 ? Math.min(box.clientWidth, tall * vb.width / vb.height) : box.clientWidth;
  };
  const buttons = [["zoom-in", "+", "zoom in (Ctrl/⌘ + wheel)", () => zoomTo(width() * 1.25)],
    ["zoom-out", "−", "zoom out", () => zoomTo(width() / 1.25)],
    ["zoom-fit", "fit", "the whole graph in the box, both ways", () => { zoomTo(fitWidth()); box.scrollLeft = box.scrollTop = 0; }],
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
