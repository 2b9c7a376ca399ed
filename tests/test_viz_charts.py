"""Memory and communication charts add up to the compiler's own per-device figures."""

from __future__ import annotations

import pytest

from sbplab.compiler import add_backward, from_torch, presets
from sbplab.compiler.deduction.deduce import deduce
from sbplab.compiler.physical.expand import lower
from sbplab.compiler.physical.memory import memory_report
from sbplab.models import MLP, MLPConfig
from sbplab.viz.charts import comm_by_rank, comm_chart, comm_rows, comm_table, memory_chart, memory_parts


def compiled(strategy):
    m = MLP(MLPConfig(n_blocks=2))
    (x,), y = m.example_batch()
    g = from_torch(m, x, m.loss_fn, y)
    add_backward(g, micro_batches=strategy.micro_batches)
    d = deduce(g, strategy)
    phys = lower(d)
    return d, phys, memory_report(d, phys)


@pytest.fixture(scope="module", params=["dp_tp", "pipeline"])
def plan(request):
    if request.param == "dp_tp":
        return compiled(presets.dp_tp([2, 2]))
    return compiled(presets.pipeline(2, 4))


def _stacks(fig) -> dict[str, float]:
    out: dict[str, float] = {}
    for tr in fig.data:
        for x, y in zip(tr.x, tr.y):
            out[x] = out.get(x, 0) + y
    return out


def test_memory_bars_stack_to_each_ranks_peak(plan):
    _, _, mem = plan
    fig = memory_chart(mem)
    assert _stacks(fig) == {f"rank {r}": m.peak for r, m in mem.ranks.items()}
    assert all(sum(memory_parts(m).values()) == m.peak for m in mem.ranks.values())
    names = [tr.name for tr in fig.data]
    assert names[0] == "parameters" and "activation peak" in names


def test_comm_bars_add_up_to_bytes_per_rank(plan):
    _, phys, _ = plan
    fig = comm_chart(phys)
    want = {f"rank {r}": b for r, b in phys.comm_bytes_per_rank().items()}
    got = _stacks(fig)
    assert {k: v for k, v in got.items()} == want
    per = comm_by_rank(phys)
    kinds = {(c.phase, c.kind) for c in phys.collectives}
    assert {tr.name for tr in fig.data} == {f"{p} {k}" for p, k in kinds}
    assert set().union(*(v.keys() for v in per.values())) == kinds


def test_comm_table_lists_the_global_order(plan):
    _, phys, _ = plan
    rows = comm_rows(phys)
    assert [r["index"] for r in rows] == list(range(len(phys.collectives)))
    for r, c in zip(rows, phys.collectives):
        assert r["group"] == tuple(c.group) and r["kind"].startswith(c.kind)
        mult = phys.micro_batches if c.when == "each" else 1
        assert r["bytes_per_step"] == mult * sum(c.bytes_sent.values())
    text = comm_table(phys).splitlines()
    assert text[0].split()[:3] == ["#", "phase", "collective"] and len(text) == len(rows) + 1


def test_pipeline_sends_only_point_to_point_and_holds_micro_batches():
    d, phys, mem = compiled(presets.pipeline(2, 4))
    assert {r["kind"] for r in comm_rows(phys)} == {"send_recv"}
    assert all(r["mesh_axis"] == "move" for r in comm_rows(phys))
    # the register lifetimes count every micro-batch alive at the peak inside the activations
    assert all(memory_parts(m)["activation peak"] > 0 for m in mem.ranks.values())
    assert "activation peak" in {tr.name for tr in memory_chart(mem).data}
