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
