"""The derived communication order equals a plain simulation of the firing rule, slot for slot.

``schedule.derive_comm_order`` keeps per-actor facts in flat lists and skips finished actors to be
fast on plans of tens of thousands of actors. Here the simulation is written the plain way (one
tick: every changed actor asks ``can_fire``; complete communication issues in priority order; each
rank's compute lane fires its highest-priority ready actor), and both must give the same order on
compiled plans with pipelines, micro-batches and ZeRO, where ties and waiting are common.
"""

from __future__ import annotations

import heapq
import itertools

import pytest
import torch

from sbplab.compiler import SGD, Adam, compile, presets
from sbplab.models import GPT, MLP, GPTConfig, MLPConfig
from sbplab.runtime.actor_plan import ActorPlan, CommSlot, channel_of, match_key
from sbplab.runtime.firing import FiringGraph
from sbplab.runtime.schedule import derive_comm_order


def _reference_order(plan: ActorPlan, steps: int = 1) -> tuple[CommSlot, ...]:
    micro = plan.micro_batches
    graphs = {r: FiringGraph(rp.actors, micro, steps, rp.schedule) for r, rp in plan.ranks.items()}
    members = {}
    for r, rp in plan.ranks.items():
        for a in rp.comm_actors:
            ch = channel_of(r, a)
            members[ch] = a.group if ch[0] == "group" else ch[1:]

    def priority(g: FiringGraph, i: int) -> tuple:  # the firing rule's key (step, micro-batch, order, index)
        return g.priority(i)

    waiting: dict = {}
    events: list = []
    tie = itertools.count()
    order: list[CommSlot] = []
    dirty = {r: set(range(len(g.nodes))) for r, g in graphs.items()}
    ready: dict = {r: [] for r in graphs}
    queued: dict = {r: set() for r in graphs}
    posted: set = set()
    t = 0
    while not all(g.finished() for g in graphs.values()):
        complete = []
        for r, g in graphs.items():
            for i in sorted(dirty[r]):
                n = g.nodes[i]
                if n.actor.lane != "comm":
                    if i not in queued[r] and g.can_fire(i):
                        queued[r].add(i)
                        heapq.heappush(ready[r], (priority(g, i), i))
                    continue
                if (r, i, n.started) in posted or not g.can_fire(i):
                    continue
                posted.add((r, i, n.started))
                key = match_key(r, n.actor, g.micro_of(n, n.started))
                parts = waiting.setdefault(key, {})
                parts[r] = (i, n.started)
                if len(parts) == len(members[channel_of(r, n.actor)]):
                    complete.append((priority(g, i), key))
            dirty[r].clear()
        for _, key in sorted(complete):
            for r, (i, k) in sorted(waiting.pop(key).items()):
                g = graphs[r]
                g.start(i)
                dirty[r].add(i)
                posted.discard((r, i, k))
                node = g.nodes[i]
                if g.step_of(node, k) == 0:
                    order.append(CommSlot(r, node.actor.name, g.micro_of(node, k)))
                heapq.heappush(events, (t + 1, next(tie), r, i, k))
        for r, g in graphs.items():
            if ready[r]:
                i = heapq.heappop(ready[r])[1]
                queued[r].discard(i)
                k = g.start(i)
                dirty[r].add(i)
                heapq.heappush(events, (t + 1, next(tie), r, i, k))
        assert events, "the reference simulation deadlocked"
        t = events[0][0]
        while events and events[0][0] == t:
            _, _, r, i, k = heapq.heappop(events)
            dirty[r].update(graphs[r].finish(i, k))
    return tuple(order)


def _gpt():
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=2, n_embd=16))
    return m, *m.example_batch(8), GPT.loss_fn


def _mlp():
    torch.manual_seed(0)
    m = MLP(MLPConfig(in_dim=8, width=16, hidden=32, n_blocks=3, n_classes=4))
    return m, *m.example_batch(8), torch.nn.functional.cross_entropy


CASES = [
    ("gpt", lambda: presets.dp_tp((2, 2), micro_batches=2), Adam(lr=1e-3)),
    ("gpt", lambda: presets.pipeline(2, 4, ranks_per_stage=2, inner="tp"), Adam(lr=1e-3)),
    ("gpt", lambda: presets.pipeline(2, 2, ranks_per_stage=(2, 2), inner="dp_tp"), SGD(lr=1e-2)),
    ("mlp", lambda: presets.zero(4, micro_batches=2), SGD(lr=1e-2, momentum=0.9)),
    ("mlp", lambda: presets.pipeline(4, 4), SGD(lr=1e-2)),
    ("mlp", lambda: presets.data_parallel(3), Adam(lr=1e-3)),
]


@pytest.mark.parametrize("model,strategy,opt", CASES,
                         ids=["gpt-dp_tp-micro2", "gpt-pipeline-tp", "gpt-pipeline-dp_tp", "mlp-zero-micro2",
                              "mlp-pipeline4", "mlp-dp3"])
def test_derived_order_equals_the_plain_simulation(model, strategy, opt):
    m, xs, y, loss = (_gpt if model == "gpt" else _mlp)()
    step = compile(m, xs, loss_fn=loss, target=y, optimizer=opt, strategy=strategy())
    plan = step.plan()
    want = _reference_order(plan)
    assert plan.comm_order == want
    assert derive_comm_order(plan) == want
    assert len(want) == sum(len(plan.expected_slots(r)) for r in plan.ranks)  # every comm firing, once
