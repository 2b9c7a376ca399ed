"""Every op under every valid n-D signature gives the single-device PyTorch result.

Random shapes (uneven ones included), random attrs, 1-D/2-D/3-D meshes of up to 8 ranks in a
shuffled rank order; each valid signature from ``nd_signatures`` shards the inputs (P inputs as
rank-0 value plus zeros, or as random addends / random max-min candidates), runs every rank's
kernel and assembles the outputs, which must match the op on plain torch tensors.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sbplab.ops import REGISTRY, TensorMeta, check_signature_numerics, get_op, nd_signatures
from sbplab.placement import Placement

MESHES = [(1,), (2,), (3,), (4,), (5,), (8,), (2, 2), (2, 3), (3, 2), (4, 2), (1, 2), (2, 2, 2), (2, 1, 2)]
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@st.composite
def placements(draw, max_ndim: int = 3) -> Placement:
    ndim = draw(st.integers(1, max_ndim))
    shape = draw(st.sampled_from([m for m in MESHES if len(m) == ndim]))
    n = int(np.prod(shape))
    ranks = draw(st.permutations(list(range(n))))
    return Placement("cpu", np.array(ranks).reshape(shape).tolist())


def dims(lo: int = 1, hi: int = 6):
    return st.integers(lo, hi)


def shapes(min_rank: int = 1, max_rank: int = 3, lo: int = 1, hi: int = 6):
    return st.lists(dims(lo, hi), min_size=min_rank, max_size=max_rank).map(tuple)


def rand(gen: torch.Generator, shape, away_from_zero: bool = False) -> torch.Tensor:
    x = torch.randn(tuple(shape), generator=gen)
    return x.sign() * (x.abs() + 0.5) if away_from_zero else x


def index(gen: torch.Generator, high: int, shape) -> torch.Tensor:
    return torch.randint(0, high, tuple(shape), generator=gen)


# ---- cases: (op name, inputs, attrs, torch reference) ---------------------------------------


@st.composite
def binary_case(draw, gen):
    name = draw(st.sampled_from(["add", "sub", "mul", "div"]))
    out = draw(shapes())
    a_shape, b_shape = [], []
    for shape in (a_shape, b_shape):
        keep = draw(st.integers(0, len(out)))  # drop leading dims to broadcast them
        shape.extend(1 if draw(st.booleans()) and draw(st.booleans()) else n for n in out[len(out) - keep:])
    a, b = rand(gen, a_shape), rand(gen, b_shape, away_from_zero=name == "div")
    ref = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}[name]
    return name, [a, b], {}, ref


@st.composite
def unary_case(draw, gen):
    name = draw(st.sampled_from(["neg", "relu", "gelu", "tanh", "exp"]))
    x = rand(gen, draw(shapes()))
    if name == "gelu":
        approx = draw(st.sampled_from(["none", "tanh"]))
        return name, [x], {"approximate": approx}, lambda t: F.gelu(t, approximate=approx)
    return name, [x], {}, getattr(torch, name)


@st.composite
def reduce_case(draw, gen):
    name = draw(st.sampled_from(["sum", "mean", "max", "min"]))
    shape = draw(shapes())
    x = rand(gen, shape)
    keepdim = draw(st.booleans())
    if name in ("max", "min"):
        d = draw(st.integers(-len(shape), len(shape) - 1))
        fn = torch.amax if name == "max" else torch.amin
        return name, [x], {"dim": d, "keepdim": keepdim}, lambda t: fn(t, d, keepdim=keepdim)
    ds = draw(st.none() | st.sets(st.integers(0, len(shape) - 1), min_size=1).map(lambda s: tuple(sorted(s))))
    fn = torch.sum if name == "sum" else torch.mean
    all_dims = tuple(range(len(shape)))
    return name, [x], {"dims": ds, "keepdim": keepdim}, lambda t: fn(t, ds or all_dims, keepdim=keepdim)


@st.composite
def norm_case(draw, gen):
    name = draw(st.sampled_from(["softmax", "log_softmax", "layer_norm"]))
    shape = draw(shapes())
    x = rand(gen, shape)
    if name == "layer_norm":
        k = draw(st.integers(1, len(shape)))
        ns = shape[len(shape) - k:]
        w, b = rand(gen, ns), rand(gen, ns)
        attrs = {"normalized_shape": ns, "eps": 1e-5}
        return name, [x, w, b], attrs, lambda t, w_, b_: F.layer_norm(t, ns, w_, b_)
    d = draw(st.integers(-len(shape), len(shape) - 1))
    return name, [x], {"dim": d}, lambda t: getattr(t, name)(d)


@st.composite
def linalg_case(draw, gen):
    name = draw(st.sampled_from(["matmul", "linear"]))
    m, k, n = draw(dims()), draw(dims()), draw(dims())
    batch = draw(shapes(0, 1))
    if name == "matmul":
        a = rand(gen, batch + (m, k))
        b = rand(gen, (batch if draw(st.booleans()) else ()) + (k, n))
        return name, [a, b], {}, torch.matmul
    x = rand(gen, batch + draw(shapes(0, 1)) + (k,))
    ins = [x, rand(gen, (n, k))] + ([rand(gen, (n,))] if draw(st.booleans()) else [])
    return name, ins, {}, F.linear


@st.composite
def index_case(draw, gen):
    name = draw(st.sampled_from(["embedding", "gather", "cross_entropy"]))
    if name == "embedding":
        v, d = draw(dims(1, 8)), draw(dims())
        return name, [index(gen, v, draw(shapes(1, 2))), rand(gen, (v, d))], {}, F.embedding
    if name == "cross_entropy":
        n, c = draw(dims()), draw(dims(2, 5))
        return name, [rand(gen, (n, c)), index(gen, c, (n,))], {}, F.cross_entropy
    shape = draw(shapes())
    d = draw(st.integers(-len(shape), len(shape) - 1))
    ishape = [draw(st.integers(1, s)) if draw(st.booleans()) else s for s in shape]
    ishape[d] = draw(dims())
    x, i = rand(gen, shape), index(gen, shape[d], ishape)
    return name, [x, i], {"dim": d}, lambda a, b: torch.gather(a, d, b)


def _factor(draw, n: int) -> tuple[int, ...]:
    """A random shape with ``n`` elements."""
    out, rest = [], n
    for _ in range(draw(st.integers(0, 2))):
        divs = [q for q in range(1, rest + 1) if rest % q == 0]
        q = draw(st.sampled_from(divs))
        out.append(q)
        rest //= q
    return tuple(out) + (rest,)


@st.composite
def shape_case(draw, gen):
    name = draw(st.sampled_from(["transpose", "permute", "reshape", "view", "concat", "slice"]))
    shape = draw(shapes())
    r = len(shape)
    x = rand(gen, shape)
    if name == "transpose":
        d0, d1 = draw(st.integers(-r, r - 1)), draw(st.integers(-r, r - 1))
        return name, [x], {"dim0": d0, "dim1": d1}, lambda t: t.transpose(d0, d1)
    if name == "permute":
        p = tuple(draw(st.permutations(list(range(r)))))
        return name, [x], {"dims": p}, lambda t: t.permute(p)
    if name in ("reshape", "view"):
        target = _factor(draw, x.numel())
        ref_shape = target
        if draw(st.booleans()):
            j = draw(st.integers(0, len(target) - 1))
            target = target[:j] + (-1,) + target[j + 1:]
        return name, [x], {"shape": target}, lambda t: t.reshape(ref_shape)
    d = draw(st.integers(-r, r - 1))
    if name == "concat":
        xs = [x]
        for _ in range(draw(st.integers(0, 2))):
            s = list(shape)
            s[d] = draw(dims())
            xs.append(rand(gen, s))
        return name, xs, {"dim": d}, lambda *ts: torch.cat(ts, d)
    n = shape[d]
    start = draw(st.none() | st.integers(-n, n - 1))
    stop = draw(st.none() | st.integers(-n, n))
    step = draw(st.integers(1, 3))
    if len(range(n)[slice(start, stop, step)]) == 0:
        start, stop = None, None
    sl = (slice(None),) * (d % r) + (slice(start, stop, step),)
    return name, [x], {"dim": d, "start": start, "stop": stop, "step": step}, lambda t: t[sl]


@st.composite
def conv_case(draw, gen):
    groups = draw(st.sampled_from([1, 1, 2]))
    n, c, o = draw(dims(1, 4)), groups * draw(dims(1, 3)), groups * draw(dims(1, 3))
    kh, kw = draw(dims(1, 3)), draw(dims(1, 3))
    stride = (draw(dims(1, 2)), draw(dims(1, 2)))
    padding = (draw(dims(0, 1)), draw(dims(0, 1)))
    dilation = (draw(dims(1, 2)), 1)
    if kh == kw == 1 and draw(st.booleans()):
        stride, padding = (1, 1), (0, 0)
    h, w = draw(dims(dilation[0] * (kh - 1) + 1, 2 * kh + 3)), draw(dims(kw, kw + 4))
    ins = [rand(gen, (n, c, h, w)), rand(gen, (o, c // groups, kh, kw))]
    if draw(st.booleans()):
        ins.append(rand(gen, (o,)))
    attrs = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    return "conv2d", ins, attrs, lambda *t: F.conv2d(*t, **attrs)


FAMILIES = {
    "binary": binary_case, "unary": unary_case, "reduce": reduce_case, "norm": norm_case,
    "linalg": linalg_case, "index": index_case, "shape": shape_case, "conv": conv_case,
}


def test_every_registered_op_has_a_family():
    """A new op of the library must be added to a family here, so that it is checked like the others.

    (Constants, accumulation and optimizer ops, ``sbplab.ops.scalars`` and ``optim_ops``, are checked
    against torch.optim in the compiler's tests; gradients come from torch's autograd as ATen ops, which,
    made from torch.ops on first use, are checked on shards per family instance by
    ``tests/test_aten_rules.py``.)"""
    covered = {"add", "sub", "mul", "div", "neg", "relu", "gelu", "tanh", "exp", "sum", "mean", "max",
               "min", "softmax", "log_softmax", "layer_norm", "matmul", "linear", "embedding", "gather",
               "cross_entropy", "transpose", "permute", "reshape", "view", "concat", "slice", "conv2d"}
    training = ("sbplab.ops.scalars", "sbplab.ops.optim_ops", "sbplab.ops.control")
    aten = "sbplab.ops.aten.opdef"
    library = {n for n, op in REGISTRY.items()
               if op.kernel.__module__.startswith("sbplab.ops") and op.kernel.__module__ not in (*training, aten)}
    assert len(library) >= 28
    assert library <= covered, f"ops without a numeric check: {library - covered}"


@pytest.mark.parametrize("family", sorted(FAMILIES))
@SETTINGS
@given(data=st.data())
def test_every_valid_signature_matches_torch(family, data):
    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    gen = torch.Generator().manual_seed(seed)
    name, inputs, attrs, ref = data.draw(FAMILIES[family](gen), label="case")
    placement = data.draw(placements(), label="placement")
    metas = [TensorMeta.of(t) for t in inputs]
    want = ref(*inputs)
    out = get_op(name).infer(metas, attrs)[0]
    assert (out.shape, out.dtype) == (tuple(want.shape), want.dtype), f"{name}: infer disagrees with torch"
    sigs = nd_signatures(name, metas, attrs, placement)
    addends = torch.Generator().manual_seed(seed + 1) if data.draw(st.booleans(), label="random P") else None
    checked = check_signature_numerics(name, inputs, attrs, placement, sigs, addends, reference=ref)
    assert checked == len(sigs) >= 1
    bucket = "1" if checked == 1 else "2-9" if checked < 10 else "10+"
    event(f"{placement.ndim}-D mesh, signatures checked: {bucket}")


CUBE = Placement("cpu", [[[3, 1], [0, 2]], [[7, 5], [4, 6]]])
GRID = Placement("cpu", [[0, 1, 2], [3, 4, 5]])

FIXED = [
    # the signatures whose shards need localize, on uneven n-D layouts
    ("embedding", lambda g: [index(g, 11, (3, 5)), rand(g, (11, 6))], {}, F.embedding, CUBE),
    ("mean", lambda g: [rand(g, (5, 3))], {"dims": None}, lambda t: t.mean(), GRID),
    ("mean", lambda g: [rand(g, (7, 4, 3))], {"dims": (0, 2), "keepdim": True},
     lambda t: t.mean((0, 2), keepdim=True), CUBE),
    ("cross_entropy", lambda g: [rand(g, (9, 4)), index(g, 4, (9,))], {}, F.cross_entropy, CUBE),
    ("reshape", lambda g: [rand(g, (6, 4))], {"shape": (2, 3, 4)}, lambda t: t.reshape(2, 3, 4), GRID),
    ("reshape", lambda g: [rand(g, (12, 5))], {"shape": (3, -1)}, lambda t: t.reshape(3, 20), CUBE),
    ("matmul", lambda g: [rand(g, (2, 5, 7)), rand(g, (2, 7, 3))], {}, torch.matmul, CUBE),
    ("linear", lambda g: [rand(g, (5, 7)), rand(g, (6, 7)), rand(g, (6,))], {}, F.linear, GRID),
]


@pytest.mark.parametrize("case", range(len(FIXED)), ids=[f"{c[0]}-{i}" for i, c in enumerate(FIXED)])
def test_localized_signatures_on_uneven_nd_meshes(case):
    name, make, attrs, ref, placement = FIXED[case]
    inputs = make(torch.Generator().manual_seed(case))
    sigs = nd_signatures(name, [TensorMeta.of(t) for t in inputs], attrs, placement)
    assert len(sigs) > placement.ndim  # more than all-B and a few splits
    for addends in (None, torch.Generator().manual_seed(100 + case)):
        checked = check_signature_numerics(name, inputs, attrs, placement, sigs, addends, reference=ref)
        assert checked == len(sigs)


def test_loss_and_relu_gradients_are_autograds():
    """The backward of cross_entropy and relu is torch's own autograd, traced: relu's is torch's ATen op, the
    cross entropy's the fused one autograd runs for its kernel (``cross_entropy_rows``: softmax minus the
    one-hot target in one buffer), equal to single-device torch's gradient to rounding. (Each op's shards
    are checked against the whole op by ``tests/test_aten_rules.py``.)"""
    from sbplab.compiler import GraphBuilder, interpret
    from sbplab.compiler.training.autodiff import differentiate

    torch.manual_seed(0)
    logits, target = torch.randn(12, 7), torch.randint(0, 7, (12,))
    x = logits.clone().requires_grad_()
    F.cross_entropy(torch.relu(x), target).backward()
    b = GraphBuilder()
    graph = b.build(b.cross_entropy(b.relu(b.param("w", (12, 7), init=logits)), b.input("t", (12,), torch.int64)))
    grads = differentiate(graph, graph.loss)
    kinds = {op.type for op in graph.ops_in("backward")}
    assert {"aten.threshold_backward.default", "sbplab.cross_entropy_rows_backward.default"} <= kinds
    torch.testing.assert_close(interpret(graph, {"t": target})[grads["w"]], x.grad, rtol=1e-6, atol=1e-7)
