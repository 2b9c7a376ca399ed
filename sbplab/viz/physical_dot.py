"""The physical graph as DOT: one cluster per rank (inside one per pipeline stage), every op instance,
every boxing step highlighted with its collective and the bytes this rank sends.

Edges carry the local shape and the SBP the shard is a piece of. Members of one collective are
joined by a dashed orange line across ranks, send/recv pairs by a vermillion arrow (Okabe-Ito), so the global
collective order can be read off the picture. With the logical graph at hand, repeated layers
collapse per rank exactly as in the logical picture. Rank clusters sit two to a row (``columns``),
further rows below, so a picture of four ranks keeps readable text in a notebook's width. Past eight
ranks, ranks doing the same work (data-parallel replicas, one stage's ranks) are one cluster labelled by
its rank set (``ranks 1-15 (alike)``): sixteen or sixty-four copies of one cluster would only scroll.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from ..errors import InputError
from ..fmt import fmt_bytes
from ..sbp import fmt_sbp
from .colors import device_color
from .dot import MAX_NODES, DotPicture, digraph, edge, node, node_count, q
from .graph_dot import PHASE_FILL
from .module_dot import rank_classes, rank_ranges
from .repeat import collapsed_units, find_repeats, unit_of

ALIKE_FROM = 8  # more ranks than this in one picture: alike ranks drawn once


def module_of(graph: Any, logical: str) -> str:
    """The module path of a node's logical op or tensor ("" when unknown)."""
    if graph is None:
        return ""
    if logical in graph.op_by_name:
        return graph.op_by_name[logical].module
    t = graph.tensors.get(logical)
    if t is None:
        return ""
    return graph.op_by_name[t.producer].module if t.producer else t.module


def _label(n: Any, coll: Any) -> tuple[str, dict[str, Any]]:
    if n.kind == "compute":
        text = n.logical if n.logical == n.op else f"{n.logical}\n{n.op}"
        return text, dict(shape="box", style="rounded,filled", fillcolor=PHASE_FILL[n.phase])
    if n.kind == "source":
        return f"{n.logical}\n{n.op}", dict(shape="note", style="filled", fillcolor="#eeeeee")
    if coll is not None:
        sent = coll.bytes_sent.get(n.rank, 0)
        group = ",".join(map(str, coll.group))
        if n.op == "recv":
            moved = f"{fmt_bytes(sum(coll.bytes_sent.values()))} received"
        else:
            moved = f"{fmt_bytes(sent)} sent"
        text = f"{n.op} #{coll.index}\n{n.logical}\n{moved}, group ({group})"
        return text, dict(shape="hexagon", style="filled,bold", fillcolor="#f9c784", color="#c0661d")
    return f"{n.op}\n{n.logical}", dict(shape="hexagon", style="filled,dashed", fillcolor="#f4f4f4",
                                        color="#999999", fontcolor="#555555")


def _edge_label(p: Any, out: int, n: Any, k: int) -> str:
    """Local shape and SBP of what flows; a send has no output, so its recv's shape is used."""
    if out < len(p.out_shapes):
        shape, sbp = p.out_shapes[out], p.out_sbps[out]
    elif n.out_shapes:
        shape, sbp = n.out_shapes[0], n.out_sbps[0]
    else:
        return ""
    return "[" + ",".join(map(str, shape)) + "] " + fmt_sbp(sbp)


def _stages(phys: Any) -> dict[int, int]:
    """Each rank's pipeline stage: the stage of most of its compute nodes."""
    counts: dict[int, Counter] = {}
    for n in phys.nodes:
        if n.kind == "compute":
            counts.setdefault(n.rank, Counter())[n.stage] += 1
    return {r: c.most_common(1)[0][0] for r, c in counts.items()}


def _stack(per_rank_ids: dict[int, list[str]], same_rank: set[tuple[str, str]], rows: list[list[int]]) -> list[str]:
    """Invisible edges that put each row of rank clusters below the row above it: from the last node of
    a cluster to every node of the cluster below that reads nothing on its own rank (its roots)."""
    out = []
    for upper, lower in zip(rows, rows[1:]):
        for a, b in zip(upper, lower):
            if not per_rank_ids.get(a) or not per_rank_ids.get(b):
                continue
            last = per_rank_ids[a][-1]
            fed = {d for _, d in same_rank}
            for root in (x for x in per_rank_ids[b] if x not in fed):
                out.append(edge(last, root, style="invis", weight="0"))
    return out


def physical_dot(phys: Any, graph: Any = None, ranks: Iterable[int] | None = None,
                 phases: Sequence[str] = ("forward",), show_sources: bool = False, collapse: bool = True,
                 keep: int = 1, title: str | None = None, columns: int = 2, alike: bool | None = None) -> str:
    """DOT text of a ``PhysicalGraph``; ``graph`` (the logical Graph or a Deduction) enables collapsing.

    columns: rank clusters side by side per row (within a pipeline stage); more ranks wrap onto rows
        below, so a picture of many ranks grows downwards (a notebook scrolls) instead of shrinking
        its text to fit the width.
    alike: draw one cluster per class of ranks doing the same work, labelled by its ranks; None: when
        more than ``ALIKE_FROM`` ranks are drawn.
    """
    if columns < 1:
        raise InputError(f"columns must be >= 1 (rank clusters per row), got {columns}")
    graph = getattr(graph, "graph", graph)
    want = set(phys.ranks if ranks is None else ranks)
    listed = sorted(want)
    names = {r: f"rank {r}" for r in want}
    if alike or (alike is None and len(want) > ALIKE_FROM):
        for cls in rank_classes(phys, phases):
            members = [r for r in cls if r in want]
            if len(members) > 1:
                want -= set(members[1:])
                names[members[0]] = f"ranks {rank_ranges(members)} (alike)"
    shown = [n for n in phys.nodes if n.rank in want and n.phase in phases
             and (show_sources or n.kind != "source")]
    units = {n.id: unit_of(module_of(graph, n.logical)) for n in shown}
    first = min(want)
    groups = find_repeats(((units[n.id], f"{n.kind}:{n.op}") for n in shown if n.rank == first), keep) \
        if collapse and graph is not None else []
    hidden = collapsed_units(groups)
    colls = {c.index: c for c in phys.collectives}
    ids: dict[int, str] = {}
    per_rank: dict[int, list[str]] = {r: [] for r in sorted(want)}
    inside: dict[str, tuple[Any, int, list[int]]] = {}  # collapsed node -> group, rank, [collectives, bytes]
    for n in shown:
        u = units[n.id]
        if u in hidden:
            ids[n.id] = f"r{n.rank}:{hidden[u].node_id}"
            _, _, acc = inside.setdefault(ids[n.id], (hidden[u], n.rank, [0, 0]))
            if n.collective is not None:
                acc[0] += 1
                acc[1] += colls[n.collective].bytes_sent.get(n.rank, 0)
            continue
        ids[n.id] = f"n{n.id}"
        text, style = _label(n, colls.get(n.collective) if n.collective is not None else None)
        per_rank[n.rank].append(node(ids[n.id], label=text, **style))
    for nid, (g, rank, (k, sent)) in inside.items():
        talk = f"\n{k} collectives, {fmt_bytes(sent)} sent" if k else ""
        per_rank[rank].append(node(nid, label=g.label + talk, shape="box3d", style="filled",
                                   fillcolor="#f2f2f2", color="#777777"))
    edges: list[str] = []
    seen: set[tuple[str, str]] = set()
    for n in shown:
        for k, ref in enumerate(n.inputs):
            src = ids.get(ref.node)
            dst = ids[n.id]
            if src is None or src == dst or (src, dst) in seen:
                continue
            seen.add((src, dst))
            p = phys.nodes[ref.node]
            label = _edge_label(p, ref.out, n, k)
            if p.rank != n.rank:  # a point-to-point transfer between ranks
                edges.append(edge(src, dst, label=label, color="#d55e00", style="bold", constraint="false"))
            else:
                edges.append(edge(src, dst, label=label))
    for c in phys.collectives:  # tie the members of each collective together across ranks
        members = [ids[i] for i in c.nodes if i in ids and phys.nodes[i].rank in want]
        for a, b in zip(members, members[1:]):
            if (a, b) not in seen and a != b:
                seen.add((a, b))
                edges.append(edge(a, b, dir="none", style="dashed", color="#e69f00", constraint="false"))
    stage_of = _stages(phys)
    body: list[str] = []
    stages = sorted({stage_of.get(r, 0) for r in want})
    rank_ids: dict[int, list[str]] = {}
    for n in shown:
        if ids[n.id] not in rank_ids.setdefault(n.rank, []):
            rank_ids[n.rank].append(ids[n.id])
    same_rank = {(ids[r.node], ids[n.id]) for n in shown for r in n.inputs
                 if r.node in ids and phys.nodes[r.node].rank == n.rank}
    for s in stages:
        inner: list[str] = []
        members = [r for r in sorted(want) if stage_of.get(r, 0) == s]
        edges.extend(_stack(rank_ids, same_rank, [members[i:i + columns] for i in range(0, len(members), columns)]))
        for r in members:
            lines = per_rank[r]
            inner.append(f"subgraph {q(f'cluster_rank{r}')} {{")
            inner.append(f'  label={q(names[r])}; style="rounded"; '
                         f'color={q(device_color(r))}; penwidth=2;')
            inner.extend("  " + x for x in lines)
            inner.append("}")
        if len(stages) > 1:
            body.append(f"subgraph {q(f'cluster_stage{s}')} {{")
            body.append(f'  label={q(f"stage {s}")}; style="dashed"; color="#888888";')
            body.extend("  " + x for x in inner)
            body.append("}")
        else:
            body.extend(inner)
    label = title or f"physical graph: ranks {listed}, {', '.join(phases)}"
    return digraph(body + edges, name="physical", label=label)


def physical_picture(phys: Any, graph: Any = None, *, group: bool | None = None, depth: int | None = None,
                     **kwargs: Any) -> DotPicture:
    """The physical graph for display. group: draw it grouped by module and by alike ranks
    (``module_dot``); None: when op by op it would have more than ``dot.MAX_NODES`` nodes (a large model,
    many ranks), which graphviz draws slowly or not at all. depth: the module depth when grouped."""
    if group is None:
        source = physical_dot(phys, graph, **kwargs)
        if node_count(source) <= MAX_NODES or graph is None:
            return DotPicture(source)
    if group or group is None:
        from .module_dot import physical_module_dot

        keep = {k: v for k, v in kwargs.items() if k in ("phases", "title")}
        return DotPicture(physical_module_dot(phys, graph, depth=depth, **keep))
    return DotPicture(physical_dot(phys, graph, **kwargs))
