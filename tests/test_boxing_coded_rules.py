"""The route search's int-coded rules answer exactly as the rules they stand for.

``coded_rules.code_ok`` must equal ``costs.state_ok`` (``layout.check_layout``) and ``code_nests`` must
equal ``costs.step_problem(...) is None``, on every layout and every one-axis step of several tensor
shapes (uneven, too small to split, 1-D to 3-D) and meshes (1-D to 3-D), with every reduce op and with
entries a caller may bring that are not candidates (a split of a dim the tensor lacks).
"""

from __future__ import annotations

import itertools

import pytest

from sbplab.boxing.coded_rules import EntryFacts, code_nests, code_ok
from sbplab.boxing.costs import state_ok, step_problem
from sbplab.boxing.state_graph import candidates
from sbplab.sbp import S

CASES = [((12, 10), (2, 3, 2)), ((3, 8), (2, 2)), ((5,), (2, 3)), ((7, 6, 4), (3, 2)), ((4, 4), (4,)),
         ((2, 9, 3), (2, 2, 2))]


@pytest.mark.parametrize("shape,mesh", CASES)
def test_coded_rules_equal_the_rules(shape, mesh):
    entries = list(candidates(len(shape), ("max", "min", "sum"))) + [S(len(shape))]  # the last splits no dim
    facts = EntryFacts()
    for x in entries:
        facts.add(x)
    n_ok = n_steps = n_nest = 0
    for code in itertools.product(range(len(entries)), repeat=len(mesh)):
        state = tuple(entries[c] for c in code)
        good = state_ok(shape, mesh, state)
        assert code_ok(code, shape, mesh, facts) == good, state
        n_ok += good
        for axis, new in itertools.product(range(len(mesh)), range(len(entries))):
            if new == code[axis]:
                continue
            want = step_problem(state, axis, entries[new]) is None
            assert code_nests(code[axis], new, code[axis + 1:], facts) == want, (state, axis, entries[new])
            n_steps += 1
            n_nest += want
    assert 0 < n_ok < len(entries) ** len(mesh) or len(shape) == 1
    assert 0 < n_nest < n_steps or len(mesh) == 1


def test_a_layout_of_the_wrong_length_is_refused():
    facts = EntryFacts()
    facts.add(S(0))
    assert not code_ok((0,), (8,), (2, 2), facts)
    assert not state_ok((8,), (2, 2), (S(0),))
