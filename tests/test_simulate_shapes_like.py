"""Shape inference shared within a lowering group (``sim.shapes.infer_like``): a rank lowered from the same
representative as another takes that rank's shapes where its actor does the same work on the same metas,
and infers the rest; what it gives is what inferring the rank on its own gives, actor by actor."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sbplab.compiler import Adam, compile, presets
from sbplab.models import GPT, GPTConfig
from sbplab.sim.predict import plan_of
from sbplab.sim.shapes import infer_like, infer_rank_shapes


def _gpt(strategy):
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=4, n_embd=16))
    x = torch.randint(0, 32, (8, 8))
    return compile(m, (x,), loss_fn=GPT.loss_fn, target=x, optimizer=Adam(lr=1e-3), strategy=strategy)


@pytest.mark.parametrize("strategy", [presets.zero(4), presets.dp_tp((2, 2), micro_batches=2)], ids=["zero-3 x4",
                                                                                                   "dp x tp 2x2"])
def test_shapes_shared_in_a_lowering_group_equal_the_rank_s_own(strategy):
    plan, batch, _ = plan_of(_gpt(strategy))
    M = plan.micro_batches
    assert plan.alike
    shared = 0
    for rep, members in plan.alike.items():
        rep_shapes = infer_rank_shapes(plan.ranks[rep].actors, rep, M, batch)
        for m in members[1:]:
            acts = plan.ranks[m].actors
            got = infer_like(acts, plan.ranks[rep].actors, rep_shapes, m, M, batch)
            own = infer_rank_shapes(acts, m, M, batch)
            assert got == own, f"rank {m}: shapes differ from its own inference"
            shared += sum(got[a.name] is rep_shapes[b.name] for a, b in zip(acts, plan.ranks[rep].actors))
    assert shared > 0


def test_an_actor_unlike_its_counterpart_is_inferred():
    """A counterpart whose kernel attributes differ (made by hand) is not shared: the actor is inferred, and
    the shapes are still the rank's own."""
    plan, batch, _ = plan_of(_gpt(presets.zero(4)))
    rep, members = next(iter(plan.alike.items()))
    m = members[1]
    like = list(plan.ranks[rep].actors)
    rep_shapes = infer_rank_shapes(like, rep, 1, batch)
    acts = plan.ranks[m].actors
    i = next(i for i, a in enumerate(like) if type(a).__name__ == "Compute" and a.attrs)
    like[i] = dataclasses.replace(like[i], attrs={**like[i].attrs, "changed": 1})
    got = infer_like(acts, like, rep_shapes, m, 1, batch)
    assert got[acts[i].name] is not rep_shapes[like[i].name]
    assert got == infer_rank_shapes(acts, m, 1, batch)
    assert sum(got[a.name] is rep_shapes[b.name] for a, b in zip(acts, like)) > len(acts) // 2
