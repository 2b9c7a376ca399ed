"""Deriving and checking a communication order leaves no reference cycles behind.

A State and its update read each other, so a firing graph's nodes form cycles; the schedule unlinks
its graphs when it is done, so reference counting frees them and a large plan does not hand the
cyclic collector tens of thousands of nodes to walk. The order itself is unchanged by unlinking.
"""

from __future__ import annotations

import gc

import torch

from sbplab.compiler import Adam, compile, presets
from sbplab.models import MLP, MLPConfig
from sbplab.runtime.firing import FiringGraph, Node
from sbplab.runtime.schedule import check_comm_order, derive_comm_order


def _plan():
    m = MLP(MLPConfig(in_dim=8, width=16, hidden=32, n_blocks=2, n_classes=4))
    x, y = torch.randn(8, 8), torch.randint(0, 4, (8,))
    step = compile(m, (x,), loss_fn=torch.nn.functional.cross_entropy, target=y, optimizer=Adam(lr=1e-3),
                   strategy=presets.data_parallel(2, micro_batches=2))
    return step.plan()


def _cyclic_nodes(fn) -> int:
    """Firing nodes that only the cyclic collector could free after ``fn()``."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        fn()
        gc.collect()
        return sum(isinstance(o, Node) for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()


def test_a_graph_with_states_has_cycles_until_unlinked():
    plan = _plan()
    assert any(type(a).__name__ == "State" and a.update is not None for rp in plan.ranks.values()
               for a in rp.actors)
    assert _cyclic_nodes(lambda: FiringGraph(plan.ranks[0].actors, plan.micro_batches, 1)) > 0

    def unlinked():
        FiringGraph(plan.ranks[0].actors, plan.micro_batches, 1).unlink()

    assert _cyclic_nodes(unlinked) == 0


def test_derive_and_check_leave_no_cyclic_garbage():
    plan = _plan()
    order = derive_comm_order(plan)
    assert order == plan.comm_order and len(order) > 0
    assert _cyclic_nodes(lambda: derive_comm_order(plan)) == 0
    assert _cyclic_nodes(lambda: check_comm_order(plan)) == 0
