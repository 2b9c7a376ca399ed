"""The base of every sbplab widget: the shared front-end helpers travel with it as two synced traits.

anywidget loads one ES module per widget, and ours are plain files (no bundler), so there is no
build step to put ``dom.js`` into each of them. Instead the widget carries the text of ``dom.js``
(``_dom_js``) and of ``base.css`` (``_base_css``); each widget's module, in its ``initialize``,
imports ``_dom_js`` from a Blob URL (an ES module like any other, written once) and lets it put
``base.css`` into the page once. The widget's own ``_esm``/``_css`` stay file paths, which anywidget
watches in development mode (``ANYWIDGET_HMR=1``).

In that mode the shared files are watched too: an edited ``base.css`` is re-sent and replaces the
page's rules; an edited ``dom.js`` is re-sent and each live widget's module is re-sent with a
marker comment, so anywidget's own hot reload runs it again against the new helpers.
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

import anywidget
import traitlets as t

from ._assets import shared_module, shared_style

_LIVE: weakref.WeakSet[SbplabWidget] = weakref.WeakSet()  # widgets a shared-file edit must reach


def _watched(path: Path) -> Any:
    """The file's text as anywidget keeps it: ``str()`` is always the latest, and in development mode
    ``.changed`` fires on every save. A plain text holder where anywidget's helper is not available."""
    try:
        from anywidget._util import try_file_contents  # the same rule anywidget applies to _esm/_css

        return try_file_contents(path)
    except ImportError:
        return path.read_text(encoding="utf-8")


_DOM_JS = _watched(shared_module())
_BASE_CSS = _watched(shared_style())


class SbplabWidget(anywidget.AnyWidget):
    """An anywidget whose module can ``import`` the shared helpers (see the module docstring)."""

    _dom_js = t.Unicode(str(_DOM_JS)).tag(sync=True)  # the text of widgets/dom.js, an ES module
    _base_css = t.Unicode(str(_BASE_CSS)).tag(sync=True)  # the text of widgets/base.css

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._dom_js, self._base_css = str(_DOM_JS), str(_BASE_CSS)  # the latest, after a live edit
        _LIVE.add(self)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        """The widget view, and beside it ``text/html``: a static card of what it shows now, for a saved
        notebook opened where no kernel holds the widget (see ``static_view``)."""
        bundle = super()._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        if isinstance(data, dict):
            try:
                html = self.static_html()
            except Exception:  # noqa: BLE001 - a snapshot that cannot be made never stops the widget showing
                html = ""
            if html:
                data["text/html"] = html
        return bundle

    def static_html(self) -> str:
        """HTML of what the widget shows now; every sbplab widget says what matters in it."""
        return ""


_RELOADED = "\n// dom.js reloaded: "  # the marker that makes a widget's own module text new


def _dom_js_saved(text: str) -> None:
    for w in list(_LIVE):
        w._dom_js = text
        own = w._esm.split(_RELOADED)[0]  # the module as anywidget last sent it, without an older marker
        w._esm = f"{own}{_RELOADED}{abs(hash(text))}\n"


def _base_css_saved(text: str) -> None:
    for w in list(_LIVE):
        w._base_css = text


for _contents, _on_save in ((_DOM_JS, _dom_js_saved), (_BASE_CSS, _base_css_saved)):
    if hasattr(_contents, "changed"):
        _contents.changed.connect(_on_save)
