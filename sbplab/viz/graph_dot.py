"""The logical graph as DOT: ops as boxes, tensors on the edges with their (sharded) types.

Clusters are the model's repeated units (``blocks.0``, ...); repeated layers collapse into one
summary node so a 24-layer model stays readable. Given SBPs (and a placement) for tensors, edges
carry JAX-like types such as ``f32[8@dp,32]`` with the SBP and the local shape, the way the BRIEF
asks every tensor to show its local shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..fmt import fmt_bytes
from ..placement import Placement
from ..sbp import fmt_sbp
from .dot import MAX_NODES, DotPicture, digraph, edge, node, node_count, q
from .layout_picture import LayoutPicture, dtype_short
from .repeat import RepeatGroup, collapsed_units, find_repeats, unit_name, unit_of

PHASE_FILL = {"forward": "#dbe7f3", "backward": "#f6dcdc", "update": "#dcefd9"}
SOURCE_STYLE = {
    "input": dict(shape="ellipse", style="filled", fillcolor="#fff4c2"),
    "param": dict(shape="note", style="filled", fillcolor="#eeeeee"),
    "state": dict(shape="note", style="filled", fillcolor="#e6e0f0"),
    "const": dict(shape="plain"),
}


def tensor_label(meta: Any, sbp: Any = None, placement: Placement | None = None) -> str:
    """``f32[8,32]``; with an SBP and placement ``f32[8@axis0,32] (S(0), B)`` plus the local shape."""
    if sbp is None or placement is None:
        return f"{dtype_short(meta.dtype)}[{','.join(map(str, meta.shape))}]"
    pic = LayoutPicture(meta.shape, placement, sbp, meta.dtype)
    return f"{pic.type_string()} {fmt_sbp(pic.sbp)}\nlocal {' | '.join(pic.local_types())}"


def _placement_of(name: str, graph: Any, placement: Any) -> Placement | None:
    if isinstance(placement, Placement) or placement is None:
        prod = graph.producer(name) if graph.tensors[name].producer else None
        if prod is not None and prod.placement is not None:
            return prod.placement
        return placement
    return placement.get(name)


def logical_dot(graph: Any, phases: Sequence[str] = ("forward",), collapse: bool = True, keep: int = 1,
                show_params: bool = True, sbp: Mapping[str, Any] | None = None,
                placement: Placement | Mapping[str, Placement] | None = None, title: str | None = None,
                deduction: Any = None) -> str:
    """DOT text of ``graph`` (a ``sbplab.compiler`` logical Graph) restricted to ``phases``.

    With a ``deduction`` (``sbplab.compiler.deduce``), every edge shows the tensor's SBP and local
    shape, and each boxing a consumer reads through becomes a node of its own: orange with its
    collectives and bytes when data moves, grey when it is a local slice or zero fill.
    """
    ops = [o for o in graph.ops if o.phase in phases]
    groups: list[RepeatGroup] = []
    if collapse:
        groups = find_repeats(((unit_of(o.module), o.type) for o in ops), keep)
    hidden = collapsed_units(groups)
    op_id: dict[str, str] = {}
    for o in ops:
        u = unit_of(o.module)
        op_id[o.name] = hidden[u].node_id if u in hidden else f"op:{o.name}"
    clusters: dict[str, list[str]] = {}
    loose: list[str] = []

    def place(unit: tuple[str, int] | None, line: str) -> None:
        (clusters.setdefault(unit_name(unit), []) if unit is not None else loose).append(line)

    final = {graph.loss, graph.loss_value, *graph.outputs} - {None}
    for o in ops:
        u = unit_of(o.module)
        if u in hidden:
            continue
        extra = {"peripheries": 2} if set(o.outputs) & final else {}
        label = o.name if o.name == o.type else f"{o.name}\n{o.type}"
        place(u, node(op_id[o.name], label=label, shape="box", style="rounded,filled",
                      fillcolor=PHASE_FILL[o.phase], **extra))
    for g in groups:
        loose.append(node(g.node_id, label=g.label, shape="box3d", style="filled", fillcolor="#f2f2f2",
                          color="#777777"))
    # sources: data inputs, parameters (hidden inside collapsed units), states, constants
    src_id: dict[str, str] = {}
    for o in ops:
        for t in o.inputs:
            tn = graph.tensors[t]
            if tn.producer is not None or t in src_id:
                continue
            u = unit_of(tn.module)
            if u in hidden or (tn.role == "param" and not show_params):
                continue
            src_id[t] = f"tensor:{t}"
            label = f"{t}\n{tensor_label(tn.meta)}" if tn.role != "const" else t
            place(u if tn.role in ("param", "state") else None, node(src_id[t], label=label,
                                                                       **SOURCE_STYLE.get(tn.role, {})))
            if tn.role in ("param", "state") and u == unit_of(o.module) and op_id[o.name].startswith("op:"):
                # beside the op that reads it, not on a row of its own: rows of parameters push every
                # cluster sideways, and a two-block model drifted diagonally across 2,300 points
                place(u, f"{{rank=same; {q(src_id[t])}; {q(op_id[o.name])};}}")
    edges: list[str] = []
    seen: set[tuple[str, str]] = set()
    drawn_boxes: set[int] = set()

    def link(src: str, dst: str, **a: Any) -> None:
        if src != dst and (src, dst) not in seen:
            seen.add((src, dst))
            edges.append(edge(src, dst, **a))

    for o in ops:
        dst = op_id[o.name]
        choice = deduction.choices.get(o.name) if deduction is not None else None
        for i, t in enumerate(o.inputs):
            tn = graph.tensors[t]
            src = op_id.get(tn.producer) if tn.producer else src_id.get(t)
            if src is None:
                continue
            if deduction is None:
                nd = sbp.get(t) if sbp else None
                link(src, dst, label=tensor_label(tn.meta, nd, _placement_of(t, graph, placement)))
                continue
            via = choice.reads[i] if choice is not None else None
            if via is None or src == dst:
                link(src, dst, label=tensor_label(tn.meta, deduction.sbp[t], deduction.placement[t]))
                continue
            chain = _boxing_chain(deduction, via)
            prev = src
            for b in chain:
                bid = f"box:{b.id}"
                if b.id not in drawn_boxes:
                    drawn_boxes.add(b.id)
                    loose.append(node(bid, **boxing_style(b)))
                link(prev, bid, label=tensor_label(tn.meta, b.src_sbp, b.src_placement))
                prev = bid
            last = chain[-1]
            link(prev, dst, label=tensor_label(tn.meta, last.dst_sbp, last.dst_placement))
    body = list(loose)
    for name, lines in clusters.items():
        body.append(f"subgraph {q('cluster_' + name)} {{")
        body.append(f'  label={q(name)}; style="rounded,dashed"; color="#999999"; fontsize=10;')
        body.extend("  " + line for line in lines)
        body.append("}")
    return digraph(body + edges, name="logical", label=title)


def _boxing_chain(deduction: Any, via: int) -> list[Any]:
    """The boxings a read goes through, first to last (a use boxing may feed an input boxing)."""
    chain = [deduction.boxings[via]]
    while chain[0].source is not None:
        chain.insert(0, deduction.boxings[chain[0].source])
    return chain




def boxing_style(b: Any) -> dict[str, Any]:
    """A boxing node: what it does, its bytes, and orange when it talks."""
    kinds = list(b.plan.kinds)
    talks = b.plan.communicates
    label = f"{' + '.join(kinds) or 'no-op'}\n{b.tensor}\n{fmt_bytes(b.bytes)} sent"
    if talks:
        return dict(label=label, shape="hexagon", style="filled,bold", fillcolor="#f9c784", color="#c0661d")
    return dict(label=label, shape="hexagon", style="filled,dashed", fillcolor="#f4f4f4", color="#999999",
                fontcolor="#555555")


def logical_picture(graph: Any, *, group: bool | None = None, depth: int | None = None, **kwargs: Any) -> DotPicture:
    """``logical_dot`` wrapped for display: SVG in a notebook where graphviz is installed.

    group: draw it grouped by module (``module_dot``); None: when op by op it would have more than
    ``dot.MAX_NODES`` nodes (an ATen capture of GPT-2 has thousands, which graphviz cannot lay out).
    depth: the module depth when grouped."""
    if group is None:
        source = logical_dot(graph, **kwargs)
        if node_count(source) <= MAX_NODES:
            return DotPicture(source)
    if group or group is None:
        from .module_dot import logical_module_dot

        keep = {k: v for k, v in kwargs.items() if k in ("phases", "title", "deduction")}
        return DotPicture(logical_module_dot(getattr(graph, "graph", graph), depth=depth, **keep))
    return DotPicture(logical_dot(graph, **kwargs))
