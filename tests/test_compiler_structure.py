"""What the presets produce: which collectives, where, how many; and how hints are obeyed or refused."""

from __future__ import annotations

import pytest
import torch

from sbplab.compiler import SGD, Adam, HintError, Strategy, compile, presets
from sbplab.compiler.deduction.presets import as_mesh
from sbplab.models import GPT, MLP, GPTConfig, MLPConfig
from sbplab.sbp import B, P, S


def _mlp(n_blocks=1, batch=8):
    m = MLP(MLPConfig(n_blocks=n_blocks))
    xs, y = m.example_batch(batch)
    return m, xs, y


def _compile(strategy, model=None, optimizer=None, n_blocks=1):
    m, xs, y = _mlp(n_blocks) if model is None else model
    return compile(m, xs, loss_fn=m.loss_fn, target=y, optimizer=optimizer or SGD(lr=0.1, momentum=0.9), strategy=strategy)


def test_data_parallel_forward_has_no_collective_and_each_grad_is_all_reduced_once():
    c = _compile(presets.data_parallel(4), n_blocks=2)
    phys, d, g = c.physical, c.deduction, c.graph
    assert phys.count(phase="forward") == 0
    assert {col.kind for col in phys.collectives} == {"all_reduce"}  # no bucketing: one per gradient
    reduced = [b.tensor for b in d.collective_boxings()]
    assert sorted(reduced) == sorted(g.grads.values())  # every gradient, each exactly once
    assert all(b.phase == "backward" and b.plan.kinds == ("all_reduce",) for b in d.collective_boxings())
    assert phys.count("all_reduce") == len(g.params)  # one group on a 1-D mesh


def test_megatron_mlp_block_has_one_all_reduce_forward_and_one_backward():
    c = _compile(presets.tensor_parallel(4))
    phys = c.physical
    assert [(col.phase, col.kind) for col in phys.collectives] == [("forward", "all_reduce"),
                                                                   ("backward", "all_reduce")]
    d = c.deduction
    assert d.sbp["blocks.0.fc1.weight"] == (S(0),) and d.sbp["blocks.0.fc2.weight"] == (S(1),)
    assert d.sbp["blocks.0.fc1"] == (S(1),) and d.produced["blocks.0.fc2"] == (P,) and d.sbp["blocks.0.fc2"] == (B,)


def test_megatron_gpt_has_two_all_reduces_per_layer_each_way():
    m = GPT(GPTConfig(n_layer=2))
    xs, y = m.example_batch(2)
    c = compile(m, xs, loss_fn=m.loss_fn, target=y, optimizer=SGD(lr=0.1), strategy=presets.tensor_parallel(4))
    fwd = [b.tensor for b in c.deduction.collective_boxings("forward")]
    assert sorted(fwd) == ["blocks.0.attn.proj", "blocks.0.mlp.fc2", "blocks.1.attn.proj", "blocks.1.mlp.fc2"]
    assert c.physical.count("all_reduce", "backward") == 4 and len(c.physical.collectives) == 8


def test_dp_tp_reduces_gradients_over_the_dp_axis_only():
    c = _compile(presets.dp_tp((2, 2)))
    d = c.deduction
    assert d.sbp["x"] == (S(0), B) and d.sbp["blocks.0.fc1.weight"] == (B, S(0))
    for b in d.collective_boxings("backward"):
        if b.tensor.endswith(".grad"):
            assert {s.mesh_axis for s in b.plan.steps} == {0}, b.describe()
    tp_forward = [col for col in c.physical.collectives if col.phase == "forward"]
    assert {col.mesh_axis for col in tp_forward} == {1} and {col.kind for col in tp_forward} == {"all_reduce"}


@pytest.mark.parametrize("shard_params", [True, False])
def test_zero_divides_optimizer_state_by_the_mesh_size(shard_params):
    dp = _compile(presets.data_parallel(4), optimizer=Adam())
    z = _compile(presets.zero(4, shard_params=shard_params), optimizer=Adam())
    step = 4  # the broadcast Adam step counter is not sharded
    for r in range(4):
        kd, kz = dp.memory.ranks[r].kept, z.memory.ranks[r].kept  # held between steps (the peak adds in-flight)
        full, shard = kd["optimizer state"] - step, kz["optimizer state"] - step
        assert full == 4 * shard, (full, shard)
        want_params = kd["parameters"] // 4 if shard_params else kd["parameters"]
        assert kz["parameters"] == want_params
    kinds = {(b.kind, b.plan.kinds) for b in z.deduction.collective_boxings()}
    assert ("store", ("reduce_scatter",)) in kinds  # gradients reduce-scattered to S(0)
    if shard_params:
        assert ("use", ("all_gather",)) in kinds and z.physical.count("all_gather", "forward") > 0
    else:
        assert ("write_back", ("all_gather",)) in kinds and z.physical.count(phase="forward") == 0


def test_pipeline_stages_exchange_only_send_recv():
    m = GPT(GPTConfig(n_layer=2))
    xs, y = m.example_batch(4)
    c = compile(m, xs, loss_fn=m.loss_fn, target=y, optimizer=Adam(eps=1e-4), strategy=presets.pipeline(2, 2))
    phys = c.physical
    assert {col.kind for col in phys.collectives} == {"send_recv"}
    assert {col.group for col in phys.collectives} <= {(0, 1), (1, 0)}
    assert phys.count(phase="forward") >= 1 and phys.count(phase="backward") >= 1
    stages = {op.stage for op in c.graph.ops}
    assert stages == {0, 1}
    assert c.deduction.placement["wte.weight"].rank_list == (0,)
    assert c.deduction.placement["lm_head.weight"].rank_list == (1,)
    assert all(n.when == "each" for n in phys.nodes if n.op == "send" and n.phase == "forward")
    assert all(m.kept["parameters"] > 0 for m in c.memory.ranks.values())  # each stage keeps its own layers


def test_explicit_stages_follow_module_prefixes():
    st = presets.pipeline(2, 1, stage_of={"blocks.0": 0, "blocks.1": 1, "head": 1})
    c = _compile(st, n_blocks=2)
    for op in c.graph.ops_in("forward"):
        if op.module.startswith("blocks.1") or op.module == "head":
            assert op.stage == 1, op.name
        if op.module.startswith("blocks.0") or op.module == "proj_in":
            assert op.stage == 0, op.name


def test_hints_are_obeyed_and_explained():
    st = Strategy(as_mesh(4)).hint("x", "S(0)", "batch").hint("head.weight", "S(1)", "my choice", role="param")
    c = _compile(st)
    assert c.deduction.sbp["head.weight"] == (S(1),)
    assert c.deduction.sbp["x"] == (S(0),)
    text = c.explain("blocks.0.fc1")
    assert "chosen (S(0)), (B), (B) -> (S(0))" in text and "keeps every input's SBP" in text
    assert "rejected" in text


def test_contradictory_hints_name_the_tensor_and_both_demands():
    st = Strategy(as_mesh(4)).hint("*.weight", "S(0)", "rows", role="param").hint("head.weight", "B", "replicate")
    with pytest.raises(HintError) as e:
        _compile(st)
    msg = str(e.value)
    assert "'head.weight'" in msg and "(S(0)) from store hint '*.weight'" in msg and "[rows]" in msg
    assert "(B) from store hint 'head.weight' [replicate]" in msg


def test_impossible_hints_are_refused_clearly():
    with pytest.raises(HintError, match="tensor 'head.bias'.*8 elements.*16 parts.*too small"):
        _compile(Strategy(as_mesh(16)).hint("head.bias", "S(0)", "too small"))
    st = Strategy(as_mesh(4)).hint("head.weight", "P", "pinned partial", pin=True)
    # linear can read a P weight (B, P, P -> P), the SGD update cannot
    with pytest.raises(HintError, match="'head.weight' is pinned to \\(P\\).*\\(sgd_momentum_update\\) has no signature"):
        _compile(st)


def test_physical_graph_is_self_consistent():
    c = _compile(presets.pipeline(2, 2, 2, "dp"), n_blocks=2)
    phys = c.physical
    for n in phys.nodes:
        for ref in n.inputs:
            assert ref.node < n.id
            src = phys.nodes[ref.node]
            assert src.rank == n.rank or (src.op == "send" and n.op == "recv")
    for col in phys.collectives:
        assert [phys.nodes[i].rank for i in col.nodes] == list(col.group)
    for r in phys.ranks:  # each rank meets its collectives in the global order
        seen = [n.collective for n in phys.rank_nodes(r) if n.collective is not None and n.op not in ("send", "recv")]
        assert seen == sorted(seen)
    ranks0 = {n.rank for n in phys.nodes if n.stage == 0 and n.kind == "compute"}
    assert ranks0 == {0, 1}
    assert phys.comm_bytes_per_rank()[0] > 0
    assert "send_recv" in phys.summary()


@pytest.mark.parametrize("shape", [(2, 2), (2, 2, 2)])
def test_zero_cost_shortcut_agrees_with_the_planner(shape):
    """Deduction skips planning when a change is local on every rank; the planner must agree."""
    import itertools

    from sbplab.boxing import plan_boxing
    from sbplab.compiler.deduction.deduce import is_local_change

    mesh = as_mesh(shape)
    states = list(itertools.product([B, P, S(0), S(1)], repeat=len(shape)))
    local = 0
    for src in states:
        for dst in states:
            if is_local_change(src, dst):
                local += 1
                assert plan_boxing((8, 8), src, dst, mesh).total_bytes == 0, (src, dst)
    assert local > len(states)  # more than the identities


def test_compiled_summary_mentions_every_part():
    c = _compile(presets.data_parallel(2))
    text = c.summary()
    for part in ("data parallel x2", "logical ops", "boxings", "physical graph", "parameters", "optimizer state"):
        assert part in text
    assert torch.is_tensor(c.executor().value("head.weight"))
