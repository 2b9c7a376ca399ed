"""Random input to the public API: every case equals single-device torch or raises an SbplabError.

Random meshes (1-, 2- and 3-D, ranks in any order), shapes with uneven splits (and dims too small to
split), SBPs (valid, out of range, partial kinds), dtypes (float32, float64, bfloat16, int64, bool,
complex64) and ops of the eager API. The oracle is plain torch on the full values. A case may also be
refused, but only with an ``SbplabError`` whose message names the problem; an internal TypeError,
IndexError, AssertionError or KeyError escaping is a bug, and so is a value that differs from torch.
Refusing is not a way to pass: each test has an acceptance floor (``floor``), so an API that refused
every ``+ - * / @`` would fail here.

A small hypothesis profile runs by default; ``SBPLAB_HYPOTHESIS_PROFILE=large`` runs >= 10,000
examples per test (profiles in tests/conftest.py).
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

import sbplab as sl
from sbplab.sbp import B, P, S

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool, torch.complex64]
MESH_SHAPES = [(1,), (2,), (3,), (4,), (1, 2), (2, 1), (2, 2), (2, 3), (3, 2), (2, 2, 2), (1, 2, 2), (2, 1, 3)]
PARTIALS = [P, P("max"), P("min")]


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) fit for the dtype: ints and bools exact, floats (and complex) by their precision."""
    if not (dtype.is_floating_point or dtype.is_complex):
        return 0.0, 0.0
    if dtype in (torch.float64, torch.complex128):
        return 1e-10, 1e-12
    if dtype in (torch.bfloat16, torch.float16):
        return 3e-2, 3e-2
    return 1e-4, 1e-5


# --- what we draw ----------------------------------------------------------------------------------


@st.composite
def meshes(draw) -> sl.Placement:
    """A mesh of any rank order (kept as written), sometimes not starting at rank 0."""
    shape = draw(st.sampled_from(MESH_SHAPES))
    n = int(np.prod(shape))
    ranks = np.array(draw(st.permutations(range(n)))) + draw(st.sampled_from([0, 0, 0, 3]))
    names = draw(st.sampled_from([None, tuple(f"ax{i}" for i in range(len(shape)))]))
    return sl.Placement("cpu", ranks.reshape(shape).tolist(), axis_names=names)


def shapes(min_dims: int = 0, max_dims: int = 3, max_side: int = 7):
    """Small shapes: uneven splits (7 over 2 or 3), and dims of 1 too small to split."""
    return st.lists(st.integers(1, max_side), min_size=min_dims, max_size=max_dims).map(tuple)


def sbp_entries(ndim: int, in_range: bool = False):
    """Splits of every dim (negative too), B, the three partials, and (unless ``in_range``) now and then
    a dim out of range."""
    valid = st.sampled_from([S(d) for d in range(-ndim, ndim)] * 3 + [B] * 3 + PARTIALS)
    if in_range:
        return valid
    return st.one_of(valid, valid, valid, st.sampled_from([S(ndim), S(-ndim - 1)]))


@st.composite
def nd_sbps(draw, mesh: sl.Placement, ndim: int, in_range: bool = False) -> tuple:
    """An n-D SBP; ``in_range`` for operands of the op under test (their refusal is tested elsewhere)."""
    return tuple(draw(sbp_entries(ndim, in_range)) for _ in range(mesh.ndim))


@st.composite
def spelled(draw, nd: tuple) -> Any:
    """The same SBP as a tuple, as text (fmt_sbp's or without parentheses), or a lone entry on 1-D meshes."""
    forms = [nd, sl.fmt_sbp(nd), ", ".join(map(repr, nd)), list(nd)]
    if len(nd) == 1:
        forms.append(nd[0])
    return draw(st.sampled_from(forms))


def value(shape: tuple, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Small integer values (exact sums in every dtype), as ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    ints = torch.randint(-6, 7, shape, generator=g)
    if dtype == torch.bool:
        return ints > 0
    if dtype.is_complex:
        return torch.complex(ints.float(), torch.randint(-6, 7, shape, generator=g).float()).to(dtype)
    return ints.to(dtype)


seeds = st.integers(0, 2**16)
dtypes = st.sampled_from(DTYPES)


# --- the acceptance floor ------------------------------------------------------------------------
# A property "equal to torch or refused" passes vacuously if everything is refused. Each test counts,
# per example, whether the operation under test was attempted and whether it ran; ``floor`` fails the
# test when too few examples reached the operation or too few of those ran.

TALLY: Counter = Counter()


def tally(ran: bool) -> bool:
    TALLY["attempted"] += 1
    TALLY["ran"] += ran
    return ran


def floor(attempted: float, ran: float):
    """At least ``attempted`` of the examples reach the operation, and at least ``ran`` of those run."""
    def wrap(test):
        def test_with_floor():
            TALLY.clear()
            test()
            examples = settings().max_examples
            assert TALLY["attempted"] >= attempted * examples, (
                f"{test.__name__}: only {TALLY['attempted']} of {examples} examples reached the operation")
            assert TALLY["ran"] >= ran * TALLY["attempted"], (
                f"{test.__name__}: only {TALLY['ran']} of {TALLY['attempted']} attempts ran; the rest were refused")
        test_with_floor.__name__ = test_with_floor.__qualname__ = test.__name__
        test_with_floor.__doc__ = test.__doc__
        return test_with_floor
    return wrap


# --- the oracle ------------------------------------------------------------------------------------


def check_error(e: sl.SbplabError, *names: str) -> None:
    """A refusal must say something specific: a sentence, naming the tensor, op or argument if given."""
    msg = str(e)
    assert len(msg) > 15, f"{type(e).__name__} with too short a message: {msg!r}"
    if names:
        assert any(n in msg for n in names), f"{type(e).__name__} names none of {names}: {msg}"


def outcome(fn: Callable[[], Any], *names: str) -> tuple[bool, Any]:
    """(True, result) or (False, the SbplabError); any other exception fails the test."""
    try:
        out = fn()
    except sl.SbplabError as e:
        check_error(e, *names)
        event(f"refused: {type(e).__name__}")
        return False, e
    event("ran")
    return True, out


def torch_ref(fn: Callable[[], torch.Tensor]) -> torch.Tensor | None:
    """torch's answer, or None where torch itself refuses (then sbplab must refuse too)."""
    try:
        return fn()
    except (RuntimeError, TypeError, ValueError, IndexError):
        return None


def assert_same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, torch gives {want.dtype}"
    assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {tuple(got.shape)}, torch {tuple(want.shape)}"
    rtol, atol = tolerance(want.dtype)
    if rtol == 0:
        assert torch.equal(got, want), f"{what}: {got} != {want}"
        return
    # where torch overflows or divides by zero, sbplab must too; which of inf, -inf or nan it gets may differ,
    # because partial addends of an infinity (3/0 + -5/0) sum to nan where the sum first (-2/0) gives -inf
    finite = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), finite), f"{what}: non-finite at other places: {got} != {want}"
    assert torch.allclose(got[finite], want[finite], rtol=rtol, atol=atol), f"{what}: {got} != {want}"


def agree(sbplab_fn: Callable[[], Any], torch_fn: Callable[[], torch.Tensor], what: str, *names: str) -> bool:
    """sbplab's ``.full()`` equals torch's value, or sbplab refused with an SbplabError."""
    want = torch_ref(torch_fn)
    ok, got = outcome(lambda: sbplab_fn().full(), *names)
    if ok:
        assert want is not None, f"{what}: torch refuses this case but sbplab returned {got}"
        assert_same(got, want, what)
    elif want is not None:  # allowed, but shown in the statistics: sbplab is stricter than torch here
        event(f"refused where torch runs: {type(got).__name__}")
    return tally(ok)


def global_tensor(full: torch.Tensor, mesh: sl.Placement, nd: tuple, seed: int, name: str):
    """A global tensor holding ``full``, built from honest random shards (random addends under P)."""
    def make():
        shards = sl.random_shards(full, mesh, nd, torch.Generator().manual_seed(seed))
        return sl.from_local(shards, mesh, nd, name=name)
    return outcome(make, name, "random_shards")


# --- the tests -------------------------------------------------------------------------------------


@floor(attempted=0.25, ran=0.1)
@given(mesh=meshes(), shape=shapes(), dtype=dtypes, seed=seeds, data=st.data())
def test_tensor_and_from_local_hold_the_value(mesh, shape, dtype, seed, data):
    full = value(shape, dtype, seed)
    nd = data.draw(nd_sbps(mesh, len(shape)))
    sbp = data.draw(spelled(nd))
    ok, x = outcome(lambda: sl.tensor(full, mesh, sbp, name="x"), "x")
    if tally(ok):
        assert_same(x.full(), full, f"sl.tensor {sl.fmt_sbp(nd)}")
        assert x.local_shapes == {r: sl.local_shape(shape, mesh, x.sbp, r) for r in mesh.rank_list}
    as_list = data.draw(st.booleans())

    def rebuilt():
        shards = sl.random_shards(full, mesh, nd, torch.Generator().manual_seed(seed))
        passed = [shards[r] for r in mesh.rank_list] if as_list else shards
        return sl.from_local(passed, mesh, sbp, name="y")

    ok2, y = outcome(rebuilt, "y", "random_shards")
    assert ok2 == ok, f"sl.tensor and sl.from_local disagree on {sl.fmt_sbp(nd)} for {shape}: {x} / {y}"
    if ok2:
        assert_same(y.full(), full, f"sl.from_local {sl.fmt_sbp(nd)}")


@floor(attempted=0.25, ran=0.1)
@given(mesh=meshes(), shape=shapes(), dtype=dtypes, seed=seeds, data=st.data())
def test_to_global_keeps_the_value(mesh, shape, dtype, seed, data):
    full = value(shape, dtype, seed)
    src = data.draw(nd_sbps(mesh, len(shape), in_range=True))
    ok, x = global_tensor(full, mesh, src, seed, "x")
    if not ok:
        return
    other = data.draw(st.one_of(st.just(mesh), meshes()))
    dst = data.draw(nd_sbps(other, len(shape)))
    agree(lambda: x.to_global(placement=other, sbp=data.draw(spelled(dst))), lambda: full,
          f"{sl.fmt_sbp(src)} on {mesh} -> {sl.fmt_sbp(dst)} on {other}", "x", "dst_sbp", "sbp")


@floor(attempted=0.25, ran=0.1)
@given(mesh=meshes(), shape=shapes(), dtype=dtypes, seed=seeds, data=st.data())
def test_plan_boxing_runs_to_the_same_value(mesh, shape, dtype, seed, data):
    full = value(shape, dtype, seed)
    src = data.draw(nd_sbps(mesh, len(shape)))
    other = data.draw(st.one_of(st.just(mesh), meshes()))
    dst = data.draw(nd_sbps(other, len(shape)))
    ok, plan = outcome(lambda: sl.plan_boxing(shape, src, dst, mesh, dst_placement=other, dtype=dtype),
                       "plan_boxing")
    if not tally(ok):
        return
    shards = sl.random_shards(full, mesh, plan.src_sbp, torch.Generator().manual_seed(seed))
    out = plan.run(shards)
    assert set(out) == set(other.rank_list)
    assert_same(sl.assemble(out, other, plan.dst_sbp), full, f"plan {plan}")


BINARY = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


@floor(attempted=0.25, ran=0.1)
@given(mesh=meshes(), shape=shapes(), dtype=dtypes, seed=seeds, data=st.data())
def test_arithmetic_matches_torch(mesh, shape, dtype, seed, data):
    sym = data.draw(st.sampled_from(sorted(BINARY)))
    fn = BINARY[sym]
    a_full = value(shape, dtype, seed)
    ok, a = global_tensor(a_full, mesh, data.draw(nd_sbps(mesh, len(shape), in_range=True)), seed, "a")
    if not ok:
        return
    kind = data.draw(st.sampled_from(["global", "global", "scalar", "torch"]))
    if kind == "scalar":
        b = b_full = data.draw(st.sampled_from([2, -3, 0.5, True]))
    else:
        b_shape = data.draw(st.sampled_from([shape, shape[1:], (1,) + shape[1:], data.draw(shapes())]))
        b_dtype = data.draw(st.sampled_from([dtype, dtype, data.draw(dtypes)]))
        b_full = value(b_shape, b_dtype, seed + 1)
        if kind == "torch":
            b = b_full
        else:
            ok, b = global_tensor(b_full, mesh, data.draw(nd_sbps(mesh, len(b_shape), in_range=True)), seed + 1,
                                  "b")
            if not ok:
                return
    left = data.draw(st.booleans())
    agree(lambda: fn(a, b) if left else fn(b, a), lambda: fn(a_full, b_full) if left else fn(b_full, a_full),
          f"a {sym} b", "a", "b", "add", "sub", "mul", "div")


@floor(attempted=0.25, ran=0.1)
@given(mesh=meshes(), dtype=dtypes, seed=seeds, data=st.data())
def test_matmul_matches_torch(mesh, dtype, seed, data):
    m, k, n = (data.draw(st.integers(1, 6)) for _ in range(3))
    batch = data.draw(st.sampled_from([(), (2,), (3,)]))
    a_full = value(batch + (m, k), dtype, seed)
    b_shape = data.draw(st.sampled_from([(k, n), batch + (k, n), (k + 1, n), (k,)]))
    b_full = value(b_shape, data.draw(st.sampled_from([dtype, dtype, data.draw(dtypes)])), seed + 1)
    ok, a = global_tensor(a_full, mesh, data.draw(nd_sbps(mesh, a_full.ndim, in_range=True)), seed, "a")
    ok2, b = global_tensor(b_full, mesh, data.draw(nd_sbps(mesh, b_full.ndim, in_range=True)), seed + 1, "b")
    if ok and ok2:
        agree(lambda: a @ b, lambda: a_full @ b_full, "a @ b", "matmul")


REDUCTIONS = ["sum", "mean", "max", "min_of_neg", "relu", "tanh", "exp", "softmax"]


def _reduce(x, how: str, dim, keepdim: bool):
    if how == "sum":
        return x.sum(dim=dim, keepdim=keepdim)
    if how == "mean":
        return x.mean(dim=dim, keepdim=keepdim)
    if how == "max":
        out = x.max(dim, keepdim=keepdim)
        return out.values if isinstance(x, torch.Tensor) else out
    if how == "min_of_neg":
        return _reduce(-x, "max", dim, keepdim)
    if how == "softmax":
        return x.softmax(dim)
    return getattr(x, how)()


@floor(attempted=0.25, ran=0.1)
@given(mesh=meshes(), shape=shapes(min_dims=1), dtype=dtypes, seed=seeds, data=st.data())
def test_reductions_and_unary_ops_match_torch(mesh, shape, dtype, seed, data):
    full = value(shape, dtype, seed)
    ok, x = global_tensor(full, mesh, data.draw(nd_sbps(mesh, len(shape), in_range=True)), seed, "x")
    if not ok:
        return
    how = data.draw(st.sampled_from(REDUCTIONS))
    if how in ("max", "min_of_neg", "softmax"):
        dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    else:
        dim = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1),
                                  st.lists(st.integers(0, len(shape) - 1), min_size=1, max_size=2, unique=True)
                                  .map(tuple)))
    keepdim = data.draw(st.booleans())
    names = ("x", "sum", "mean", "max", "neg", "relu", "tanh", "exp", "softmax")
    agree(lambda: _reduce(x, how, dim, keepdim), lambda: _reduce(full, how, dim, keepdim),
          f"{how}(dim={dim}, keepdim={keepdim}) of {sl.fmt_sbp(x.sbp)}", *names)


@given(mesh=meshes(), ndim=st.integers(0, 3), data=st.data())
def test_fmt_sbp_and_parse_sbp_round_trip(mesh, ndim, data):
    nd = data.draw(nd_sbps(mesh, max(ndim, 1)))
    text = sl.fmt_sbp(nd)
    assert sl.parse_sbp(text) == nd
    assert sl.fmt_sbp(sl.parse_sbp(text)) == text
    assert sl.parse_sbp(", ".join(map(repr, nd))) == nd  # the papers' spelling, no parentheses
    assert sl.parse_sbp(sl.fmt_sbp(nd[0])) == (nd[0],)


TOKENS = ["S(0)", "S(1)", "S(-1)", "S( 2 )", "B", "P", "P(max)", "P(min)", "P(sum)", "P(avg)", "S", "X", " ",
          ",", ", ", "(", ")", "[", "]"]
texts = st.one_of(st.text(alphabet="SBP()[]0123-, maxinsu", max_size=24),
                  st.lists(st.sampled_from(TOKENS), max_size=8).map("".join),
                  st.lists(st.sampled_from(TOKENS[:9]), min_size=1, max_size=3).map(", ".join))


@floor(attempted=0.25, ran=0.1)
@given(text=texts)
def test_parse_sbp_of_any_text_parses_or_says_why(text):
    ok, nd = outcome(lambda: sl.parse_sbp(text), repr(text))
    if tally(ok):
        assert nd and all(isinstance(x, (sl.Split, sl.Broadcast, sl.Partial)) for x in nd)
        assert sl.parse_sbp(sl.fmt_sbp(nd)) == nd
