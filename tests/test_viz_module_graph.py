"""A large model's graph is drawn grouped by module and by alike ranks, never as a text dump, and the
grouped picture keeps every op, collective and byte of the op-level one."""

from __future__ import annotations

import re

import pytest

import sbplab as sl
from sbplab.viz import logical_picture, physical_picture
from sbplab.viz.dot import MAX_NODES, dot_available, node_count, render_svg
from sbplab.viz.module_dot import module_group, physical_module_dot, rank_classes


def labels(dot: str) -> list[str]:
    return [m.replace("\\n", "\n") for m in re.findall(r'\[label="([^"]*)"', dot)]


def counted(dot: str, what: str) -> int:
    return sum(int(m) for lab in labels(dot) for m in re.findall(rf"(\d+) {what}", lab))


@pytest.fixture(scope="module")
def gpt_8():
    from sbplab.models import GPT, GPTConfig

    m = GPT(GPTConfig())
    (idx,), y = m.example_batch(8)
    return sl.compile(m, (idx,), loss_fn=m.loss_fn, target=y, optimizer=sl.SGD(lr=0.1),
                      strategy=sl.presets.dp_tp((4, 2)))


def test_the_default_gpt_on_8_ranks_is_drawn_grouped(gpt_8):
    c = gpt_8
    assert node_count(physical_picture(c.physical, c.graph, group=False).source) > MAX_NODES  # op by op: too big
    pic = physical_picture(c.physical, c.graph)
    assert "grouped by module" in pic.source and node_count(pic.source) <= 80
    assert rank_classes(c.physical, ("forward",)) == [list(range(8))]  # dp x tp replicas do alike work
    assert "ranks 0-7 (alike)" in pic.source
    fwd = [n for n in c.physical.nodes if n.rank == 0 and n.phase == "forward"]
    assert counted(pic.source, "ops?") == sum(n.kind == "compute" for n in fwd)  # every op in some module
    colls = {n.collective for n in fwd if n.collective is not None}
    assert counted(pic.source, "collectives?") == len(colls)
    if dot_available():
        assert "<svg" in render_svg(pic.source)


def test_a_pipeline_draws_one_class_per_stage_joined_by_its_transfers():
    from sbplab.models import MLP, MLPConfig

    m = MLP(MLPConfig(n_blocks=2))
    (x,), y = m.example_batch(8)
    st = sl.presets.pipeline(stages=2, micro_batches=2, stage_of={"blocks.0": 0, "blocks.1": 1})
    c = sl.compile(m, (x,), loss_fn=m.loss_fn, target=y, optimizer=sl.SGD(lr=0.1), strategy=st)
    dot = physical_module_dot(c.physical, c.graph, depth=1)
    assert "cluster_class0" in dot and "cluster_class1" in dot and "rank 0" in dot and "rank 1" in dot
    assert 'color="#d55e00"' in dot  # the send -> recv edge between the stages
    assert {lab.split("\n")[0] for lab in labels(dot)} >= {"blocks", "head"}
    with pytest.raises(sl.SbplabError, match="depth must be >= 1"):
        physical_module_dot(c.physical, c.graph, depth=0)


def test_logical_grouping_keeps_every_op_and_expands_a_level(gpt_8):
    g = gpt_8.graph
    fwd = [o for o in g.ops if o.phase == "forward"]
    one = logical_picture(g, group=True, depth=1).source
    two = logical_picture(g, group=True, depth=2).source
    assert counted(one, "ops?") == counted(two, "ops?") == len(fwd)
    assert node_count(one) < node_count(two) and "pass depth=2 to expand" in one
    small = logical_picture(g)  # a few hundred nodes op by op: drawn op by op
    assert "grouped" not in small.source
    assert module_group("transformer.h.0.attn", 2) == "transformer.h" and module_group("", 3) == "(top level)"
