"""What the StrategyEditor's inputs mean: a preset on a mesh, extra tensor hints, signatures chosen
per op, stages per module.

Everything becomes a plain ``sl.compiler.Strategy`` made by the compiler's own presets, so what the
editor shows is what ``sl.compile(..., strategy=...)`` would do with the same choices.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..compiler import presets
from ..compiler.deduction.deduce import Deduction, deduce
from ..compiler.deduction.signature_hints import SignatureError, escape
from ..compiler.deduction.strategy import Strategy
from ..compiler.ir import ROLES, Graph
from ..compiler.training.optim import SGD, Adam
from ..viz.repeat import unit_name, unit_of

PRESETS = {  # name -> what the menu says
    "single": "single device",
    "dp": "data parallel (DP)",
    "tp": "tensor parallel (Megatron TP)",
    "dp_tp": "DP x TP (2-D mesh)",
    "zero2": "ZeRO-2",
    "zero3": "ZeRO-3",
    "pipeline": "pipeline (stages x micro-batches)",
}
INNER = ("none", "dp", "tp", "zero", "dp_tp")  # what runs inside each pipeline stage
OPTIMIZERS = ("sgd", "adam")
HINT_ROLES = ("", *ROLES)  # "" = any role
HAND = "chosen by hand"  # the reason signature hints made by clicking an op's signature carry


def make_strategy(preset: str, mesh: tuple[int, ...], micro_batches: int = 1, stages: int = 2, inner: str = "none",
                  stage_of: Mapping[str, int] | None = None) -> Strategy:
    """The preset on ``mesh`` (for a pipeline: the mesh of each stage)."""
    if preset not in PRESETS:
        raise ValueError(f"preset {preset!r}: pick one of {', '.join(PRESETS)}")
    if micro_batches < 1:
        raise ValueError(f"micro-batches must be >= 1, got {micro_batches}")
    one_d = ("tp", "zero2", "zero3")
    if preset in one_d and len(mesh) != 1:
        raise ValueError(f"{PRESETS[preset]} runs on a 1-D mesh, got mesh {list(mesh)}; "
                         f"for a 2-D mesh pick DP x TP")
    if preset == "dp_tp" and len(mesh) != 2:
        raise ValueError(f"DP x TP needs a 2-D mesh like '2, 2' (dp, tp), got {list(mesh)}")
    if preset == "single":
        return Strategy(presets.as_mesh(1), micro_batches=micro_batches, name="single device")
    if preset == "dp":
        return presets.data_parallel(presets.as_mesh(mesh), micro_batches=micro_batches)
    if preset == "tp":
        return presets.tensor_parallel(mesh[0], micro_batches=micro_batches)
    if preset == "dp_tp":
        return presets.dp_tp(mesh, micro_batches=micro_batches)
    if preset in ("zero2", "zero3"):
        return presets.zero(mesh[0], shard_params=preset == "zero3", micro_batches=micro_batches)
    if inner not in INNER:
        raise ValueError(f"inside each stage: {inner!r} is not offered; pick one of {', '.join(INNER)}")
    if inner == "dp_tp" and len(mesh) != 2:
        raise ValueError(f"a pipeline with DP x TP inside needs a 2-D mesh per stage, got {list(mesh)}")
    if inner in ("dp", "tp", "zero") and len(mesh) != 1:
        raise ValueError(f"a pipeline with {inner} inside needs a 1-D mesh per stage, got {list(mesh)}")
    per_stage = mesh[0] if len(mesh) == 1 else mesh
    return presets.pipeline(stages, micro_batches, per_stage, inner=inner, stage_of=dict(stage_of or {}))


def add_hints(st: Strategy, hints: Sequence[Mapping[str, Any]]) -> None:
    """Extra tensor hints ``{"pattern", "sbp", "role", "use"}`` on top of the preset's."""
    for i, h in enumerate(hints):
        pattern, sbp = str(h.get("pattern", "")).strip(), h.get("sbp", "")
        if not pattern:
            raise ValueError(f"hint {i}: the tensor pattern is empty; write a glob like '*.fc1.weight'")
        role = h.get("role") or None
        if role is not None and role not in ROLES:
            raise ValueError(f"hint {i} ({pattern!r}): role {role!r} is not one of {', '.join(ROLES)}")
        st.hint(pattern, sbp, why=f"editor hint {i}", role=role, use=bool(h.get("use", False)))


def add_choices(st: Strategy, choices: Mapping[str, str]) -> None:
    """Signatures chosen per op (op name -> signature text) as the strategy's signature hints."""
    for op, sig in choices.items():
        try:
            st.signature(escape(op), sig, why=HAND)
        except (ValueError, TypeError) as e:  # unreadable text: still about this op, so it can be dropped
            raise SignatureError(op, f"op {op!r}: {e}") from None


def deduce_with_choices(train: Graph, st: Strategy, choices: Mapping[str, str], strict: bool
                        ) -> tuple[Graph, Deduction, dict[str, str], list[str]]:
    """Deduce on a copy of the training graph (deduction places its ops: each Compiled keeps its own),
    with each chosen signature as a signature hint of ``st``.

    ``strict`` (the choices are what just changed): a choice that does not fit is an error. Otherwise
    choices made before the model or the settings changed are dropped once they no longer fit.
    Returns the graph, its deduction, the choices kept and a note per drop.
    """
    kept, notes = dict(choices), []
    gone = [op for op in kept if op not in train.op_by_name]
    if gone and strict:
        raise ValueError(f"signatures chosen for ops that are not in the graph: {', '.join(gone)}")
    if gone:
        notes.append(f"dropped the signatures chosen for {', '.join(gone)}: the model has no such ops now")
        kept = {k: v for k, v in kept.items() if k not in gone}
    own = list(st.signatures)
    while True:
        g = train.copy()
        try:
            st.signatures = list(own)
            add_choices(st, kept)
            return g, deduce(g, st), kept, notes
        except SignatureError as e:
            if strict or e.op not in kept:
                raise
            notes.append(f"dropped the signature chosen for {e.op}: it is not valid under the new settings")
            del kept[e.op]


def make_optimizer(kind: str, lr: float, momentum: float = 0.0):
    if kind not in OPTIMIZERS:
        raise ValueError(f"optimizer {kind!r}: pick one of {', '.join(OPTIMIZERS)}")
    return SGD(lr=lr, momentum=momentum) if kind == "sgd" else Adam(lr=lr)


def module_unit(module: str) -> str:
    """What a pipeline stage is given to: the repeated unit of a module path (``blocks.3`` for
    ``blocks.3.attn.q``), else the path itself (``wte``, ``layers.b0_fc1``)."""
    u = unit_of(module)
    return unit_name(u) if u is not None else module


def module_units(graph: Graph) -> list[str]:
    """The units of the forward ops' modules, in the order the forward pass meets them."""
    return list(dict.fromkeys(module_unit(op.module) for op in graph.ops if op.phase == "forward" and op.module))
