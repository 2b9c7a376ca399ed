"""The text dump of a graph: FX-like lines, and once deduced, SBP and local shape beside each tensor.

    %fc1 = linear(%x, %fc1.weight, %fc1.bias)  f32[8, 32] (S(0),) local [2, 32]   # fc1  model.py:12
        <- box %x (B,) -> (S(0),): slice, 0 B

The local shape is rank 0's of the op's placement (the largest piece under balanced splits), so
``f32[8, 32] (S(0),) local [2, 32]`` reads like JAX's ``f32[8@x, 32]``.
"""

from __future__ import annotations

from typing import Any

from ..boxing.plan import dtype_name
from ..layout import local_shape
from ..sbp import fmt_sbp


def _ty(graph, name: str) -> str:
    m = graph.tensors[name].meta
    return f"{dtype_name(m.dtype)}[{', '.join(map(str, m.shape))}]"


def _layout(graph, d: Any, name: str) -> str:
    if d is None or name not in d.sbp:
        return ""
    pl = d.placement[name]
    loc = local_shape(graph.tensors[name].shape, pl, d.sbp[name], pl.rank_list[0])
    return f" {fmt_sbp(d.sbp[name])} local [{', '.join(map(str, loc))}]"


def dump_graph(graph, d: Any = None, phases: tuple[str, ...] = ("forward", "backward", "update")) -> str:
    lines = []
    srcs = [n for n in graph.sources() if graph.tensors[n].consumers or n in graph.state_updates]
    lines.append(f"graph ({len(graph.ops)} ops, {graph.micro_batches} micro-batch(es)):")
    for n in srcs:
        t = graph.tensors[n]
        where = f" on {d.placement[n]}" if d is not None and n in d.placement else ""
        lines.append(f"  %{n}: {_ty(graph, n)} {t.role}{_layout(graph, d, n)}{where}")
    phase = None
    for op in graph.ops:
        if op.phase not in phases:
            continue
        if op.phase != phase:
            phase = op.phase
            lines.append(f"  # --- {phase} ---")
        outs = ", ".join(f"%{o}" for o in op.outputs)
        args = ", ".join(f"%{i}" for i in op.inputs)
        attrs = ", ".join(f"{k}={v}" for k, v in op.attrs.items() if k not in ("out_shape",))
        call = f"{op.type}({args}{', ' if args and attrs else ''}{attrs})"
        types = "; ".join(f"{_ty(graph, o)}{_layout(graph, d, o)}" for o in op.outputs)
        note = "  # " + "  ".join(x for x in (op.module, op.source, f"stage {op.stage}" if op.stage else "") if x)
        lines.append(f"  {outs} = {call}  {types}{note if note.strip() != '#' else ''}")
        if d is not None and op.name in d.choices:
            for bid in d.choices[op.name].reads:
                if bid is not None:
                    b = d.boxings[bid]
                    lines.append(f"      <- box %{b.tensor} {fmt_sbp(b.src_sbp)} -> {fmt_sbp(b.dst_sbp)}: "
                                 f"{' -> '.join(b.plan.kinds) or 'move'}, {b.bytes} B")
            for o in op.outputs:
                if o in d.store_boxing:
                    b = d.boxings[d.store_boxing[o]]
                    lines.append(f"      -> store %{o} as {fmt_sbp(b.dst_sbp)}: {' -> '.join(b.plan.kinds)}, {b.bytes} B")
    if d is not None and d.write_backs:
        lines.append("  # --- write-back ---")
        for old, bid in d.write_backs.items():
            b = d.boxings[bid]
            lines.append(f"  %{old} <- %{b.tensor} {fmt_sbp(b.src_sbp)} -> {fmt_sbp(b.dst_sbp)}: "
                         f"{' -> '.join(b.plan.kinds)}, {b.bytes} B")
    if graph.loss_value or graph.loss:
        lines.append(f"  return %{graph.loss_value or graph.loss}")
    elif graph.outputs:
        lines.append("  return " + ", ".join(f"%{o}" for o in graph.outputs))
    return "\n".join(lines)
