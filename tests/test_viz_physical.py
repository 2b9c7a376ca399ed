"""The physical graph picture: a cluster per rank (and stage), every op instance, boxing highlighted."""

from __future__ import annotations

import re

import pytest

from sbplab.compiler import add_backward, from_torch, presets
from sbplab.compiler.deduction.deduce import deduce
from sbplab.compiler.physical.expand import lower
from sbplab.models import MLP, MLPConfig
from sbplab.sbp import fmt_sbp
from sbplab.viz.dot import dot_available
from sbplab.viz.graph_dot import fmt_bytes
from sbplab.viz.physical_dot import physical_dot, physical_picture

NODE = re.compile(r'^\s*"([^"]+)" \[(.*)\];$', re.M)
EDGE = re.compile(r'^\s*"([^"]+)" -> "([^"]+)"(?: \[(.*)\])?;$', re.M)


def label(attrs: str) -> str:
    return re.search(r'label="((?:[^"\\]|\\.)*)"', attrs).group(1)


def compiled(strategy, n_blocks: int = 2):
    m = MLP(MLPConfig(n_blocks=n_blocks))
    (x,), y = m.example_batch()
    g = from_torch(m, x, m.loss_fn, y)
    add_backward(g, micro_batches=strategy.micro_batches)
    d = deduce(g, strategy)
    return d, lower(d)


@pytest.fixture(scope="module")
def dp_tp():
    return compiled(presets.dp_tp([2, 2]))


def test_every_forward_instance_in_its_rank_cluster(dp_tp):
    d, phys = dp_tp
    dot = physical_dot(phys, d, collapse=False)
    clusters = dict(re.findall(r'subgraph "cluster_rank(\d+)" \{(.*?)\n  \}', dot, re.S))
    assert sorted(map(int, clusters)) == list(phys.ranks)
    for n in phys.nodes:
        drawn = f'"n{n.id}" [' in dot
        assert drawn == (n.phase == "forward" and n.kind != "source"), n.describe()
        if drawn:
            assert f'"n{n.id}" [' in clusters[str(n.rank)]


def test_boxing_nodes_show_collective_and_bytes(dp_tp):
    d, phys = dp_tp
    dot = physical_dot(phys, d, collapse=False, phases=("forward", "backward"))
    nodes = {m.group(1): m.group(2) for m in NODE.finditer(dot)}
    orange = {k for k, v in nodes.items() if 'fillcolor="#f9c784"' in v}
    talking = {f"n{i}" for c in phys.collectives if c.phase in ("forward", "backward") for i in c.nodes}
    assert orange == talking and talking
    for c in phys.collectives:
        for i in c.nodes:
            n = phys.nodes[i]
            lab = label(nodes[f"n{i}"])
            assert lab.startswith(f"{n.op} #{c.index}")
            assert f"{fmt_bytes(c.bytes_sent[n.rank])} sent" in lab
            assert f"group ({','.join(map(str, c.group))})" in lab
        # members of one collective are tied together across ranks
        ties = [(a, b) for a, b, attrs in (m.groups() for m in EDGE.finditer(dot))
                if attrs and 'dir="none"' in attrs and a in {f"n{i}" for i in c.nodes}]
        assert len(ties) == len(c.nodes) - 1
    # edges carry the producer's local shape and SBP
    checked = 0
    for a, _, attrs in (m.groups() for m in EDGE.finditer(dot)):
        if attrs and 'dir="none"' not in attrs and 'style="invis"' not in attrs and a.startswith("n"):
            p = phys.nodes[int(a[1:])]
            if p.out_shapes:
                checked += 1
                assert label(attrs) in {f"[{','.join(map(str, s))}] {fmt_sbp(x)}"
                                        for s, x in zip(p.out_shapes, p.out_sbps)}
    assert checked > 20


def test_repeated_layers_collapse_per_rank():
    d, phys = compiled(presets.dp_tp([2, 2]), n_blocks=5)
    dot = physical_dot(phys, d, ranks=[0, 1])
    nodes = {m.group(1): m.group(2) for m in NODE.finditer(dot)}
    summary = {k: label(v) for k, v in nodes.items() if ":repeat:" in k}
    assert set(summary) == {"r0:repeat:blocks.1-3", "r1:repeat:blocks.1-3"}
    g = d.graph

    def module(name: str) -> str:
        t = g.tensors.get(name)
        return g.op_by_name[name].module if name in g.op_by_name else g.op_by_name[t.producer].module

    inside = [c for c in phys.collectives if c.phase == "forward" and 0 in c.group
              and module(phys.nodes[c.nodes[0]].logical).split(".")[:2] in (["blocks", "1"], ["blocks", "2"],
                                                                            ["blocks", "3"])]
    assert inside
    sent = sum(c.bytes_sent[0] for c in inside)
    assert summary["r0:repeat:blocks.1-3"].endswith(f"{len(inside)} collectives, {fmt_bytes(sent)} sent")
    assert not any(k.startswith("n") and phys.nodes[int(k[1:])].rank not in (0, 1) for k in nodes)


def test_pipeline_stages_and_point_to_point_edges():
    d, phys = compiled(presets.pipeline(2, 2))
    dot = physical_dot(phys, d, phases=("forward", "backward"), collapse=False)
    assert re.findall(r'subgraph "cluster_stage(\d+)"', dot) == ["0", "1"]
    stage0 = dot[dot.index('cluster_stage0'):dot.index('cluster_stage1')]
    assert 'cluster_rank0' in stage0 and 'cluster_rank1' not in stage0
    p2p = [(a, b) for a, b, attrs in (m.groups() for m in EDGE.finditer(dot)) if attrs and "#d55e00" in attrs]
    sends = [c for c in phys.collectives if c.kind == "send_recv"]
    assert len(p2p) == len(sends) and sends
    for a, b in p2p:
        assert phys.nodes[int(a[1:])].op == "send" and phys.nodes[int(b[1:])].op == "recv"
        assert phys.nodes[int(a[1:])].rank != phys.nodes[int(b[1:])].rank
    if dot_available():
        svg = physical_picture(phys, d).svg()
        assert "stage 1" in svg and "rank 1" in svg


def test_many_ranks_draw_each_class_of_alike_ranks_once_labelled_by_its_ranks():
    """16 ranks in two pipeline stages of 8 data-parallel replicas: two clusters, ``ranks 0-7 (alike)``
    and ``ranks 8-15 (alike)``, joined by the stages' transfer; alike=False draws every rank."""
    import sbplab as sl

    m = MLP(MLPConfig(n_blocks=2))
    (x,), y = m.example_batch(32)
    st = sl.Strategy(sl.mesh(pp=2, dp=8), [sl.Pipeline("pp", micro_batches=2), sl.DataParallel("dp")])
    c = sl.compile(m, (x,), loss_fn=m.loss_fn, target=y, optimizer=sl.SGD(lr=0.1), strategy=st)
    clusters = lambda d: re.findall(r'label="(ranks? [^"]*)"; style="rounded"', d)  # noqa: E731
    dot = physical_dot(c.physical, c.graph)
    assert clusters(dot) == ["ranks 0-7 (alike)", "ranks 8-15 (alike)"]
    assert 'color="#d55e00"' in dot  # stage 0's send to stage 1's receive
    every = physical_dot(c.physical, c.graph, alike=False)
    assert clusters(every) == [f"rank {r}" for r in range(16)]
    few = physical_dot(c.physical, c.graph, ranks=[0, 1, 8])  # 8 ranks or fewer: each its own cluster
    assert clusters(few) == ["rank 0", "rank 1", "rank 8"]
