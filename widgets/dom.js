// Shared by every sbplab widget front end. There is no bundler: Python (sbplab/widgets/_assets.py)
// puts this file in front of each widget's module, so these names are in scope there.

/** Make an element: h("div", { class: "x", text: "hi", "data-testid": "y" }, child, ...). */
function h(tag, attrs = {}, ...children) {
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
function fmtBytes(n) {
  const units = ["B", "KB", "MB", "GB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i += 1; }
  return i === 0 ? `${n} B` : `${n.toFixed(1)} ${units[i]}`;
}

/**
 * Redraw once per batch of trait changes (Python sends many traits per recompute), draw now, and
 * return the clean-up anywidget calls when the view goes away.
 */
function redrawOn(model, names, draw) {
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
