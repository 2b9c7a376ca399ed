"""A large model's graph drawn grouped: one node per module (at a depth that keeps the picture
readable) per class of alike ranks, instead of thousands of op nodes or a text dump.

An ATen-level capture of GPT-2 has thousands of ops; graphviz either takes minutes or fails on it
("trouble in init_rank"), and on eight ranks the physical graph is eight times that. What a person
wants first is where the work and the communication sit: per module, how many ops run, how many
collectives it issues and the bytes they send. Ranks doing the same thing (every data-parallel
replica, every rank of one pipeline stage) are one class, drawn once with its rank list. The module
depth is the deepest at which the picture keeps to ``max_nodes`` nodes; ``depth=`` expands a level
(``transformer.h`` -> ``transformer.h.0`` ...), ``module=`` draws one module's ops alone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from ..errors import InputError
from ..fmt import fmt_bytes
from .colors import device_color
from .dot import DotPicture, digraph, edge, node, q
from .graph_dot import PHASE_FILL

TOP = "(top level)"


def module_group(path: str, depth: int) -> str:
    """The first ``depth`` parts of a module path (``transformer.h.0.attn`` at 2: ``transformer.h``)."""
    return ".".join(path.split(".")[:depth]) if path else TOP


def rank_ranges(ranks: Sequence[int]) -> str:
    """``0-3, 6``: a rank list as people write it."""
    out, run = [], [ranks[0]]
    for r in ranks[1:]:
        if r == run[-1] + 1:
            run.append(r)
        else:
            out.append(run)
            run = [r]
    out.append(run)
    return ", ".join(f"{a[0]}-{a[-1]}" if len(a) > 2 else ", ".join(map(str, a)) for a in out)


def rank_classes(phys: Any, phases: Sequence[str]) -> list[list[int]]:
    """Ranks that run the same ops on the same layouts (data-parallel replicas, one pipeline stage's
    ranks), grouped, each class in rank order and the classes by their first rank."""
    sig: dict[int, list[tuple]] = {r: [] for r in phys.ranks}
    for n in phys.nodes:
        if n.phase in phases:
            sig[n.rank].append((n.kind, n.op, n.logical, n.out_shapes, repr(n.out_sbps)))
    classes: dict[tuple, list[int]] = {}
    for r in sorted(sig):
        classes.setdefault(tuple(sig[r]), []).append(r)
    return sorted(classes.values(), key=lambda c: c[0])


def deepest(paths: Iterable[str]) -> int:
    return max((len(p.split(".")) for p in paths if p), default=1)


def _depth_for(paths: Iterable[str], per_class: int, classes: int, max_nodes: int) -> int:
    paths = set(paths)
    for d in range(deepest(paths), 0, -1):
        if len({module_group(p, d) for p in paths}) * (classes if per_class else 1) <= max_nodes:
            return d
    return 1


def _group_node(key: str, group: str, ops: Counter, colls: int, sent: int, color: str | None = None) -> str:
    n_ops = sum(ops.values())
    phase = ops.most_common(1)[0][0] if ops else "forward"
    text = f"{group}\n{n_ops} op{'s' if n_ops != 1 else ''}"
    style: dict[str, Any] = dict(shape="box", style="rounded,filled", fillcolor=PHASE_FILL.get(phase, "#eeeeee"))
    if colls:
        text += f"\n{colls} collective{'s' if colls != 1 else ''}, {fmt_bytes(sent)} sent"
        style.update(style="rounded,filled,bold", color="#c0661d", penwidth="2")
    elif color:
        style["color"] = color
    return node(key, label=text, **style)


def physical_module_dot(phys: Any, graph: Any, phases: Sequence[str] = ("forward",), depth: int | None = None,
                        max_nodes: int = 80, title: str | None = None) -> str:
    """DOT text of a PhysicalGraph grouped by module (at ``depth``; None: the deepest that keeps to
    ``max_nodes`` nodes) and by class of alike ranks: a cluster per class, a node per module."""
    from .physical_dot import module_of

    graph = getattr(graph, "graph", graph)
    classes = rank_classes(phys, phases)
    class_of = {r: i for i, c in enumerate(classes) for r in c}
    shown = [n for n in phys.nodes if n.phase in phases and n.kind != "source"]
    path = {n.id: module_of(graph, n.logical) for n in shown}
    if depth is None:
        depth = _depth_for(path.values(), 1, len(classes), max_nodes)
    if depth < 1:
        raise InputError(f"depth must be >= 1 (module path parts per group), got {depth}")
    colls = {c.index: c for c in phys.collectives}
    stats: dict[tuple[int, str], list] = {}  # (class, group) -> [op phases, collectives, bytes sent]
    reps = {c[0] for c in classes}
    for n in shown:
        if n.rank not in reps:
            continue
        key = (class_of[n.rank], module_group(path[n.id], depth))
        st = stats.setdefault(key, [Counter(), set(), 0])
        if n.kind == "compute":
            st[0][n.phase] += 1
        if n.collective is not None and n.collective not in st[1]:
            st[1].add(n.collective)
            st[2] += colls[n.collective].bytes_sent.get(n.rank, 0)
    ids = {k: f"g{i}" for i, k in enumerate(stats)}
    body: list[str] = []
    for i, ranks in enumerate(classes):
        body.append(f"subgraph {q(f'cluster_class{i}')} {{")
        label = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_ranges(ranks)} (alike)"
        body.append(f"  label={q(label)}; style=\"rounded\"; color={q(device_color(ranks[0]))}; penwidth=2;")
        for (c, g), (ops, cs, sent) in stats.items():
            if c == i:
                body.append("  " + _group_node(ids[c, g], g, ops, len(cs), sent))
        body.append("}")
    edges: dict[tuple[str, str], int] = {}
    node_by_id = {n.id: n for n in shown}
    for n in shown:
        if n.rank not in reps:
            continue
        dst = (class_of[n.rank], module_group(path[n.id], depth))
        for r in n.inputs:
            p = node_by_id.get(r.node)
            if p is None or p.rank != n.rank:
                continue
            src = (class_of[p.rank], module_group(path[p.id], depth))
            if src != dst:
                edges[ids[src], ids[dst]] = edges.get((ids[src], ids[dst]), 0) + 1
    lines = [edge(a, b) for a, b in edges]
    for c in phys.collectives:  # transfers between classes: a pipeline's send and its receive
        members = [phys.nodes[i] for i in c.nodes]
        sends = [m for m in members if m.op == "send" and m.phase in phases]
        for m in [m for m in members if m.op == "recv" and m.phase in phases]:
            for s in sends:
                a = (class_of[s.rank], module_group(module_of(graph, s.logical), depth))
                b = (class_of[m.rank], module_group(module_of(graph, m.logical), depth))
                if a[0] != b[0] and a in ids and b in ids:
                    lines.append(edge(ids[a], ids[b], color="#d55e00", style="bold", constraint="false"))
    lines = list(dict.fromkeys(lines))
    more = f": pass depth={depth + 1} to expand a level" if depth < deepest(path.values()) else ""
    label = title or (f"physical graph grouped by module (depth {depth}) and by alike ranks, "
                      f"{', '.join(phases)}{more}")
    return digraph(body + lines, name="physical_modules", label=label)


def logical_module_dot(graph: Any, phases: Sequence[str] = ("forward",), depth: int | None = None,
                       max_nodes: int = 80, title: str | None = None, deduction: Any = None) -> str:
    """DOT text of a logical Graph grouped by module: a node per module (ops and, with a deduction, the
    boxings its ops read through), edges where tensors cross from one module to another."""
    ops = [o for o in graph.ops if o.phase in phases]
    if depth is None:
        depth = _depth_for((o.module for o in ops), 0, 1, max_nodes)
    if depth < 1:
        raise InputError(f"depth must be >= 1 (module path parts per group), got {depth}")
    group = {o.name: module_group(o.module, depth) for o in ops}
    stats: dict[str, list] = {}
    for o in ops:
        st = stats.setdefault(group[o.name], [Counter(), 0, 0])
        st[0][o.phase] += 1
    if deduction is not None:
        for b in deduction.boxings:  # counted where the boxed tensor is made (a store) or first read
            made = graph.tensors[b.tensor].producer if b.tensor in graph.tensors else None
            g = group.get(made) or next((group[c] for c in b.consumers if c in group), None)
            if g is not None and b.plan.communicates:
                stats[g][1] += 1
                stats[g][2] += b.bytes
    ids = {g: f"g{i}" for i, g in enumerate(stats)}
    body = [_group_node(ids[g], g, ops_, k, sent) for g, (ops_, k, sent) in stats.items()]
    edges: set[tuple[str, str]] = set()
    for o in ops:
        for t in o.inputs:
            prod = graph.tensors[t].producer if t in graph.tensors else None
            if prod in group and group[prod] != group[o.name]:
                edges.add((ids[group[prod]], ids[group[o.name]]))
    more = f": pass depth={depth + 1} to expand a level" if depth < deepest(o.module for o in ops) else ""
    label = title or f"logical graph grouped by module (depth {depth}), {', '.join(phases)}{more}"
    return digraph(body + [edge(a, b) for a, b in sorted(edges)], name="logical_modules", label=label)


def module_picture(graph: Any, phys: Any = None, **kwargs: Any) -> DotPicture:
    """A large model's graph grouped by module (physical when ``phys`` is given, else logical)."""
    if phys is not None:
        return DotPicture(physical_module_dot(phys, graph, **kwargs))
    return DotPicture(logical_module_dot(getattr(graph, "graph", graph), **kwargs))
