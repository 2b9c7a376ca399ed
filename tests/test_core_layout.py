"""Balanced splits, blocks per rank, shard/assemble round trips."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sbplab as sl
from sbplab.layout import LayoutError, check_layout, shard


@pytest.mark.parametrize("n,p", [(10, 4), (7, 3), (8, 8), (5, 2), (1, 1)])
def test_balanced_sizes_match_oneflow(n, p):
    sizes = sl.balanced_sizes(n, p)
    assert sum(sizes) == n and len(sizes) == p
    assert sizes == [-(-n // p)] * (n % p) + [n // p] * (p - n % p)
    starts = [sl.split_range(n, p, i)[0] for i in range(p)]
    assert starts == list(itertools.accumulate([0] + sizes[:-1]))


def test_nested_split_on_same_dim():
    mesh = sl.Placement("cpu", [[0, 1], [2, 3]])
    # 7 rows: axis 0 gives 4 + 3, axis 1 splits each: 2+2, 2+1
    blocks = {r: sl.local_block((7, 2), mesh, (sl.S(0), sl.S(0)), r) for r in mesh.rank_list}
    assert [b[0] for b in blocks.values()] == [(0, 2), (2, 4), (4, 6), (6, 7)]


def test_dim_smaller_than_parts_is_a_clear_error():
    mesh = sl.Placement("cpu", 4)
    with pytest.raises(LayoutError, match="x: dim 0 has 3 elements at mesh axis 0 .* must be split into 4 parts"):
        check_layout((3, 8), mesh, (sl.S(0),), "x")


MESHES = [[0, 1, 2], [[0, 1], [2, 3]], [[[0, 1], [2, 3]], [[4, 5], [6, 7]]], [[0, 1, 2], [3, 4, 5]]]
SBPS = [sl.B, sl.P, sl.P("max"), sl.S(0), sl.S(1), sl.S(2)]


@settings(max_examples=60, deadline=None)
@given(mesh_i=st.integers(0, len(MESHES) - 1), data=st.data())
def test_shard_assemble_round_trip(mesh_i, data):
    mesh = sl.Placement("cpu", MESHES[mesh_i])
    shape = tuple(data.draw(st.integers(8, 11)) for _ in range(3))
    nd = tuple(data.draw(st.sampled_from(SBPS)) for _ in range(mesh.ndim))
    full = torch.randn(shape)
    shards = shard(full, mesh, nd)
    for r, t in shards.items():
        assert tuple(t.shape) == sl.local_shape(shape, mesh, nd, r)
    assert torch.equal(sl.assemble(shards, mesh, nd), full)
    # blocks of split tensors tile the tensor exactly once per B/P coordinate
    count = torch.zeros(shape)
    for r in mesh.rank_list:
        count[tuple(slice(s, e) for s, e in sl.local_block(shape, mesh, nd, r))] += 1
    copies = 1
    for a, x in enumerate(nd):
        if not isinstance(x, sl.Split):
            copies *= mesh.shape[a]
    assert torch.all(count == copies)
