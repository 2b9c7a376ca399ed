"""ModelBuilder: a zoo model with its sizes, or layers added one by one; shows the logical graph.

The state is plain traitlets. Every change rebuilds the torch module, traces it with the compiler's
frontend and draws the forward logical graph (SVG where graphviz's ``dot`` exists, else the text
dump). The result is ``builder.model`` (a ``BuiltModel``: module, example batch, target, loss, graph),
which a StrategyEditor picks up whenever ``version`` moves. Bad sizes become the ``error`` trait;
the last good model stays available, and its summary and graph stay on the page beside the error
(``stale``), so a typo does not wipe what the person was looking at.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import traitlets as t

from ..viz.dot import MAX_NODES, node_count
from ..viz.graph_dot import logical_dot
from ..viz.module_dot import logical_module_dot
from . import static_view as static
from ._assets import widget_module, widget_style
from .messages import error_text, graph_view
from .widget_base import SbplabWidget
from .zoo import (
    LAYER_KINDS,
    ZOO,
    BuiltModel,
    build_stack,
    build_zoo,
    config_fields,
    default_config,
    layer_names,
)

MODES = ("zoo", "layers")
DEFAULT_LAYERS = [{"kind": "Linear", "size": 64}, {"kind": "ReLU"}, {"kind": "Linear", "size": 16},
                  {"kind": "LayerNorm"}, {"kind": "Linear", "size": 8}]


class ModelBuilder(SbplabWidget):
    """``ModelBuilder("gpt", n_layer=4, n_embd=64)`` or ``ModelBuilder(layers=[{"kind": "Linear", "size": 32}])``."""

    _esm = widget_module("model_builder.js")
    _css = widget_style("model_builder.css")

    # --- inputs ---------------------------------------------------------------------------------
    mode = t.Unicode("zoo").tag(sync=True)  # "zoo": a model of sbplab.models; "layers": a stack built here
    zoo_model = t.Unicode("mlp").tag(sync=True)  # mlp, gpt, wide_deep, cnn
    config = t.Dict().tag(sync=True)  # zoo config field -> value (missing fields keep their defaults)
    batch = t.Int(8).tag(sync=True)  # rows of the example batch (the global batch of a step)
    in_features = t.Int(16).tag(sync=True)  # layers mode: width of the input
    layers = t.List(t.Dict(), default_value=DEFAULT_LAYERS).tag(sync=True)  # {"kind": "Linear", "size": 32}, ...
    collapse = t.Bool(True).tag(sync=True)  # draw repeated blocks as one node
    seed = t.Int(0).tag(sync=True)  # parameters and batch are drawn from this seed

    # --- derived ----------------------------------------------------------------------------------
    zoo_names = t.List(t.Unicode(), default_value=list(ZOO)).tag(sync=True)
    layer_kinds = t.List(t.Unicode(), default_value=list(LAYER_KINDS)).tag(sync=True)
    config_fields = t.List(t.Dict()).tag(sync=True)  # name, kind (int/bool/str/dims), value, choices
    layer_names = t.List(t.Unicode()).tag(sync=True)  # module names of the layers (b0_fc1, act1, ...)
    summary = t.Unicode("").tag(sync=True)
    n_params = t.Int(0).tag(sync=True)
    n_ops = t.Int(0).tag(sync=True)
    graph_svg = t.Unicode("").tag(sync=True)
    graph_text = t.Unicode("").tag(sync=True)  # the graph's text dump (shown when there is no SVG)
    graph_note = t.Unicode("").tag(sync=True)  # why there is no SVG, if there is none
    error = t.Unicode("").tag(sync=True)
    version = t.Int(0).tag(sync=True)  # +1 after every successful build
    stale = t.Bool(False).tag(sync=True)  # summary and graph are the last good model's: the inputs have an error

    def __init__(self, model: str = "mlp", *, layers: Sequence[dict[str, Any]] | None = None, batch: int | None = None,
                 in_features: int = 16, collapse: bool = True, seed: int = 0, **config: Any) -> None:
        traits = {k: config.pop(k) for k in list(config) if k in self.class_trait_names()}
        super().__init__(**traits)
        self.model: BuiltModel | None = None
        self.dot = ""  # DOT text of the logical graph
        self._busy = True
        with self.hold_trait_notifications():
            if layers is not None:
                self.mode, self.layers = "layers", [dict(x) for x in layers]
            self.zoo_model = model
            self.config = {**(default_config(model) if model in ZOO else {}), **config}
            default_batch = ZOO[model][2] if model in ZOO and layers is None else 8
            self.batch = default_batch if batch is None else batch
            self.in_features, self.collapse, self.seed = in_features, collapse, seed
        self._busy = False
        self._rebuild()

    # --- what clicks do -------------------------------------------------------------------------------
    def add_layer(self, kind: str, size: int | None = None) -> None:
        """Append a layer (``size`` = out features of a Linear) and switch to layers mode."""
        layer = {"kind": kind} if size is None else {"kind": kind, "size": size}
        self._busy = True
        try:
            self.mode, self.layers = "layers", [*self.layers, layer]
        finally:
            self._busy = False
        self._rebuild()

    def remove_layer(self, index: int) -> None:
        if not 0 <= index < len(self.layers):
            raise IndexError(f"layer {index} does not exist; there are {len(self.layers)} layers")
        self.layers = [x for i, x in enumerate(self.layers) if i != index]

    def set_size(self, field: str, value: Any) -> None:
        """Set one zoo config field (``n_layer``, ``n_embd``...)."""
        self.config = {**self.config, field: value}

    @t.observe("zoo_model")
    def _on_model(self, change: dict) -> None:
        if self._busy:
            return
        if change["new"] in ZOO:  # a new zoo model starts from its own defaults and batch
            self._busy = True
            self.config, self.batch = default_config(change["new"]), ZOO[change["new"]][2]
            self._busy = False
        self._rebuild()

    @t.observe("mode", "config", "batch", "in_features", "layers", "collapse", "seed")
    def _on_input(self, change: dict) -> None:
        if not self._busy:
            self._rebuild()

    # --- the one place derived state is computed -------------------------------------------------------
    def _rebuild(self) -> None:
        self._busy = True
        try:
            with self.hold_sync(), self.hold_trait_notifications():
                self.error = ""
                try:
                    self._derive()
                except Exception as e:  # shown inline; the last good model stays, and on the page
                    self.error = error_text(e)
                    self.stale = self.model is not None
        finally:
            self._busy = False

    def _derive(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r}: pick one of {', '.join(MODES)}")
        if self.mode == "zoo":
            if self.zoo_model not in ZOO:
                raise ValueError(f"model {self.zoo_model!r} is not in the zoo; pick one of {', '.join(ZOO)}")
            self.config_fields = config_fields(self.zoo_model, self.config)
            built = build_zoo(self.zoo_model, self.config, self.batch, self.seed)
            self.layer_names = []
        else:
            self.config_fields = []
            self.layer_names = layer_names(self.layers)
            built = build_stack(self.in_features, self.layers, self.batch, self.seed)
        self.model = built
        g = built.graph
        shapes = ", ".join(f"{i} {g.tensors[i].meta.dtype}{list(g.tensors[i].shape)}".replace("torch.", "")
                           for i in g.inputs)
        self.n_params, self.n_ops = built.n_params, len(g.ops)
        self.summary = (f"{built.name}: {built.n_params:,} parameters in {len(g.params)} tensors, "
                        f"{len(g.ops)} forward ops; inputs {shapes}")
        self.dot = logical_dot(g, collapse=self.collapse, title=f"{built.name}: logical graph (forward)")
        if node_count(self.dot) > MAX_NODES:  # too big to draw op by op: grouped by module
            self.dot = logical_module_dot(g, title=f"{built.name}: logical graph (forward), grouped by module")
        self.graph_svg, self.graph_note = graph_view(self.dot)
        self.graph_text = g.dump()
        self.stale = False
        self.version += 1

    def static_html(self) -> str:
        """The model's summary (its graph is drawn live)."""
        return static.card(f"ModelBuilder: {self.zoo_model if self.mode == 'zoo' else 'layers'}",
                           [static.line(self.error), static.pre(self.summary)])

    # --- for other widgets and for plain PyTorch ------------------------------------------------------
    @property
    def module(self):
        return self._need().module

    @property
    def graph(self):
        return self._need().graph

    def fresh_module(self):
        """A deep copy of the module: train it with torch.optim without touching the builder's."""
        return copy.deepcopy(self._need().module)

    def _need(self) -> BuiltModel:
        if self.model is None:
            raise ValueError(f"no model is built yet: {self.error or 'set a model first'}")
        return self.model
