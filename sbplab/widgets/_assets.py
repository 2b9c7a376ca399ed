"""Where the widgets' front-end files live: ``sbplab/_widgets`` in a wheel, ``widgets/`` in a checkout.

The ES modules and CSS are written by hand (no bundler) in the repository's top-level ``widgets/``
folder; the wheel carries them as ``sbplab/_widgets`` (pyproject's force-include), so the same
lookup serves an installed package and an editable checkout.
"""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent.parent  # the sbplab package folder


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


def widget_module(name: str) -> str:
    """A widget's ES module as anywidget loads it: the shared ``dom.js`` helpers, then ``name``.

    There is no bundler and anywidget loads one module per widget, so shared helpers are put in
    front of each module here rather than imported.
    """
    return asset_path("dom.js").read_text() + "\n" + asset_path(name).read_text()


def widget_style(name: str) -> str:
    """A widget's CSS: the shared ``base.css`` rules (on ``.sbplab-widget``), then ``name``."""
    return asset_path("base.css").read_text() + "\n" + asset_path(name).read_text()
