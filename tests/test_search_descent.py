"""Coordinate descent's restarts share what earlier ones found (``descent.descend``'s ``seen``): a descent
that reaches a point another one started a sweep from ends where that one did, as if it had swept on."""

from __future__ import annotations

import torch

import sbplab as sl
from sbplab.search.clock import Clock
from sbplab.search.descent import coordinate_descent, descend
from sbplab.search.greedy import greedy_starts
from sbplab.search.local_moves import LocalView
from sbplab.search.mesh import MeshChoice
from sbplab.search.search_api import Space
from sbplab.search.shrink import reduce_problem


def test_restarts_sharing_their_sweeps_end_where_each_would_alone():
    torch.manual_seed(0)
    m = sl.models.GPT(sl.models.GPTConfig(vocab_size=256, block_size=64, n_layer=2, n_head=4, n_embd=128))
    (idx,), y = m.example_batch(16)
    space = Space(m, (idx,), m.loss_fn, y, sl.Adam(), sl.Hardware.h100_node())
    checked = 0
    for mesh in (MeshChoice((8,), (0,)), MeshChoice((2, 4), (0, 0))):
        pr = space.problem(mesh)
        for zero, limit in ((0, None), (3, None), (0, 0.5 * pr.memory([0] * len(pr.ops), 0))):
            r = reduce_problem(pr, zero, merge=True, tie=True)
            starts = [[0] * len(r.cost)] + greedy_starts(r)
            seen: dict = {}
            shared = [descend(r, s, limit, Clock(), seen=seen) for s in starts]
            alone = [descend(r, s, limit, Clock()) for s in starts]
            assert shared == alone, (mesh, zero, limit)
            assert len(set(map(tuple, alone))) < len(starts)  # restarts meet: there is something to share
            view = LocalView(r, limit)
            best = min(alone, key=view.score)
            assert view.score(coordinate_descent(r, starts, limit, Clock())) == view.score(best)
            checked += 1
    assert checked == 6
