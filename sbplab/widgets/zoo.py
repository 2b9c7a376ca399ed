"""What the ModelBuilder builds: a zoo model from its config, or a stack of layers added one by one.

Both end as a ``BuiltModel``: the torch module, one example batch, its target and loss, and the
forward logical graph the compiler traced from them. That is all the StrategyEditor and the RunPanel
need, and all a person needs to run the same model in plain PyTorch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import models
from ..compiler.frontend.from_torch import from_torch
from ..compiler.ir import Graph
from .parse import parse_dims

# name -> (module class, config class, default batch, choices of string fields)
ZOO: dict[str, tuple[type, type, int, dict[str, tuple[str, ...]]]] = {
    "mlp": (models.MLP, models.MLPConfig, 8, {"activation": ("relu", "gelu", "tanh")}),
    "gpt": (models.GPT, models.GPTConfig, 4, {}),
    "wide_deep": (models.WideDeep, models.WideDeepConfig, 8, {}),
    "cnn": (models.CNN, models.CNNConfig, 8, {}),
}
LAYER_KINDS = ("Linear", "ReLU", "GELU", "Tanh", "LayerNorm")  # Linear takes a size (out features)


@dataclass
class BuiltModel:
    """A model ready to compile: ``sl.compile(module, inputs, loss_fn=loss_fn, target=target, ...)``."""

    name: str
    module: nn.Module
    inputs: tuple[torch.Tensor, ...]  # one full batch
    target: torch.Tensor
    loss_fn: Callable
    graph: Graph  # forward logical graph, loss included, traced on the full batch

    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in self.module.parameters())

    @classmethod
    def from_module(cls, module: nn.Module, inputs: Any, target: Any, loss_fn: Any, who: str) -> BuiltModel:
        """A user's own module with one example batch; ``who`` (the widget) names itself in the error."""
        if inputs is None or target is None or loss_fn is None:
            raise TypeError(f"{who}(module, inputs, target, loss_fn): a torch module needs an example batch, "
                            f"its target and a loss function")
        xs = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
        return cls(type(module).__name__, module, xs, target, loss_fn, from_torch(module, xs, loss_fn, target))


# --- zoo configs as editable fields ---------------------------------------------------------------
def config_fields(name: str, values: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per config field: name, kind (int, bool, str, dims), current value, choices."""
    _, cfg_cls, _, options = ZOO[name]
    out = []
    for f in dataclasses.fields(cfg_cls):
        default = f.default
        kind = "bool" if isinstance(default, bool) else "int" if isinstance(default, int) else \
            "dims" if isinstance(default, tuple) else "str"
        value = values.get(f.name, default)
        if kind == "dims" and not isinstance(value, str):
            value = ", ".join(str(v) for v in value)
        out.append({"name": f.name, "kind": kind, "value": value, "choices": list(options.get(f.name, ()))})
    return out


def default_config(name: str) -> dict[str, Any]:
    return {f["name"]: f["value"] for f in config_fields(name, {})}


def _coerce(model: str, field: dict[str, Any], value: Any) -> Any:
    what = f"{model} config {field['name']}"
    kind = field["kind"]
    if kind == "bool":
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if not isinstance(value, bool):
            raise ValueError(f"{what}: {value!r} is not true or false")
        return value
    if kind == "int":
        if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, str) and
                                                                      value.strip().lstrip("-").isdigit())):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ValueError(f"{what}: {value!r} is not a whole number")
        return int(value)
    if kind == "dims":
        return parse_dims(str(value), what, 8)
    value = str(value)
    if field["choices"] and value not in field["choices"]:
        raise ValueError(f"{what}: {value!r} is not offered; pick one of {', '.join(field['choices'])}")
    return value


def build_zoo(name: str, values: dict[str, Any], batch: int, seed: int = 0) -> BuiltModel:
    """The zoo model ``name`` with config ``values`` (unknown keys are an error), traced on a batch."""
    if name not in ZOO:
        raise ValueError(f"model {name!r} is not in the zoo; pick one of {', '.join(ZOO)}")
    cls, cfg_cls, _, _ = ZOO[name]
    fields = {f["name"]: f for f in config_fields(name, {})}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(f"{name} config has no field {', '.join(map(repr, unknown))}; fields: {', '.join(fields)}")
    cfg = cfg_cls(**{k: _coerce(name, fields[k], v) for k, v in values.items()})
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    torch.manual_seed(seed)
    module = cls(cfg)
    inputs, target = module.example_batch(batch, seed=seed)
    loss_fn = module.loss_fn
    return BuiltModel(name, module, tuple(inputs), target, loss_fn, from_torch(module, inputs, loss_fn, target))


# --- a stack of layers ----------------------------------------------------------------------------
def layer_names(layers: Sequence[dict[str, Any]]) -> list[str]:
    """Consecutive Linear layers pair up as ``b0_fc1``/``b0_fc2``, ``b1_fc1``..., the names the Megatron
    presets look for (column then row parallel); activations and norms are ``act3``, ``ln4``."""
    names, linear = [], 0
    for i, layer in enumerate(layers):
        kind = layer.get("kind")
        if kind == "Linear":
            names.append(f"b{linear // 2}_fc{linear % 2 + 1}")
            linear += 1
        else:
            names.append(f"{'ln' if kind == 'LayerNorm' else 'act'}{i}")
    return names


class LayerStack(nn.Module):
    """Layers applied in order to ``(N, in_features)``; the last width is the number of classes."""

    def __init__(self, in_features: int, layers: Sequence[dict[str, Any]]) -> None:
        super().__init__()
        self.layers = nn.ModuleDict()
        width = in_features
        for name, layer in zip(layer_names(layers), layers):
            kind = layer["kind"]
            if kind == "Linear":
                self.layers[name] = nn.Linear(width, int(layer["size"]))
                width = int(layer["size"])
            elif kind == "LayerNorm":
                self.layers[name] = nn.LayerNorm(width)
            else:
                self.layers[name] = {"ReLU": nn.ReLU, "GELU": nn.GELU, "Tanh": nn.Tanh}[kind]()
        self.out_features = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, in_features) -> (N, out_features)
        for layer in self.layers.values():
            x = layer(x)
        return x

    loss_fn = staticmethod(F.cross_entropy)


def check_layers(layers: Sequence[Any]) -> list[dict[str, Any]]:
    """Layer entries as ``{"kind": ..., "size": ...}``; says which entry is wrong and what is valid."""
    out = []
    for i, layer in enumerate(layers):
        if not isinstance(layer, dict) or layer.get("kind") not in LAYER_KINDS:
            kind = layer.get("kind") if isinstance(layer, dict) else layer
            raise ValueError(f"layer {i}: {kind!r} is not a layer kind; pick one of {', '.join(LAYER_KINDS)}")
        if layer["kind"] == "Linear":
            size = layer.get("size")
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(f"layer {i} (Linear): size must be a whole number >= 1, got {size!r}")
            out.append({"kind": "Linear", "size": size})
        else:
            out.append({"kind": layer["kind"]})
    return out


def build_stack(in_features: int, layers: Sequence[dict[str, Any]], batch: int, seed: int = 0) -> BuiltModel:
    """A LayerStack on a random batch, with random class targets; needs at least one Linear layer."""
    layers = check_layers(layers)
    if in_features < 1 or batch < 1:
        raise ValueError(f"in_features and batch must be >= 1, got {in_features} and {batch}")
    if not any(layer["kind"] == "Linear" for layer in layers):
        raise ValueError("add at least one Linear layer: the last width is the number of classes")
    torch.manual_seed(seed)
    module = LayerStack(in_features, layers)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, in_features, generator=g)
    y = torch.randint(0, module.out_features, (batch,), generator=g)
    return BuiltModel("layers", module, (x,), y, module.loss_fn, from_torch(module, (x,), module.loss_fn, y))
