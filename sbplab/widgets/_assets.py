"""Where the widgets' front-end files live: ``sbplab/_widgets`` in a wheel, ``widgets/`` in a checkout.

The ES modules and CSS are written by hand (no bundler) in the repository's top-level ``widgets/``
folder; the wheel carries them as ``sbplab/_widgets`` (pyproject's force-include), so the same
lookup serves an installed package and an editable checkout.

A widget's ``_esm`` and ``_css`` are these files' paths, not their text: anywidget reads a path and,
in development mode (``ANYWIDGET_HMR=1``, a checkout outside site-packages, ``watchfiles``
installed), watches it and re-sends it when the file is saved, so an edit shows in a running
JupyterLab without restarting the kernel. The helpers every widget shares (``dom.js``, ``base.css``)
travel separately, as traits of ``widget_base.SbplabWidget``.
"""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent.parent  # the sbplab package folder
SHARED_MODULE = "dom.js"  # helpers every widget's module imports (h, redrawOn, onEnterOrChange, ...)
SHARED_STYLE = "base.css"  # rules on .sbplab-widget, put into the page once by dom.js


def asset_dirs() -> tuple[Path, ...]:
    return (_PKG / "_widgets", _PKG.parent / "widgets")


def asset_path(name: str) -> Path:
    """The path of front-end file ``name`` (e.g. ``sbp_playground.js``)."""
    for base in asset_dirs():
        p = base / name
        if p.is_file():
            return p
    looked = ", ".join(str(d) for d in asset_dirs())
    raise FileNotFoundError(f"widget asset {name!r} not found; looked in {looked}. A wheel must include "
                            f"the top-level widgets/ folder as sbplab/_widgets")


def widget_module(name: str) -> Path:
    """A widget's own ES module (``strategy_editor.js``) as the file anywidget loads and watches."""
    return _checked(name, ".js")


def widget_style(name: str) -> Path:
    """A widget's own CSS (``strategy_editor.css``) as the file anywidget loads and watches."""
    return _checked(name, ".css")


def shared_module() -> Path:
    return asset_path(SHARED_MODULE)


def shared_style() -> Path:
    return asset_path(SHARED_STYLE)


def _checked(name: str, suffix: str) -> Path:
    if not name.endswith(suffix) or name in (SHARED_MODULE, SHARED_STYLE):
        raise ValueError(f"widget asset {name!r}: give a widget's own {suffix} file (the shared "
                         f"{SHARED_MODULE} and {SHARED_STYLE} come with every sbplab widget)")
    return asset_path(name)
