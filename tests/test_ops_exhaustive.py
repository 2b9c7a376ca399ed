"""Every op lists exactly its valid 1-D signatures: none missing, none wrong.

On a mesh of 2 ranks, each example tries every candidate signature (each input and output one of
B, S(d), P, P(max), P(min); integer inputs only B or S) and runs it on random shards. The
candidates that reproduce plain PyTorch must be exactly the op's signatures (all-B aside, and
apart from outputs that hold the value on every rank, which any op can claim by copying).
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from sbplab.ops import NdSignature, TensorMeta, get_op, nd_signatures, run_signature
from sbplab.placement import Placement
from sbplab.sbp import B, Broadcast, Partial, S

MESH = Placement("cpu", [1, 0])  # rank order deliberately not sorted
PARTIALS = [Partial("sum"), Partial("max"), Partial("min")]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _examples():
    """(op, input shapes or int-index specs, attrs, torch reference). ``("i", high, shape)`` is an index."""
    yield "add", [(3, 5), (3, 5)], {}, torch.add
    yield "add", [(3, 5), (1, 5)], {}, torch.add
    yield "sub", [(3, 5), (5,)], {}, torch.sub
    yield "mul", [(4, 1), (1, 5)], {}, torch.mul
    yield "div", [(3, 5), (3, 5)], {}, torch.div
    for name, ref in [("neg", torch.neg), ("relu", torch.relu), ("tanh", torch.tanh), ("exp", torch.exp)]:
        yield name, [(3, 5)], {}, ref
    yield "gelu", [(3, 5)], {"approximate": "tanh"}, lambda x: F.gelu(x, approximate="tanh")
    yield "sum", [(3, 4, 5)], {"dims": (0, 2), "keepdim": False}, lambda x: x.sum((0, 2))
    yield "sum", [(3, 5)], {"dims": None}, lambda x: x.sum()
    yield "mean", [(3, 5)], {"dims": (1,), "keepdim": True}, lambda x: x.mean(1, keepdim=True)
    yield "max", [(3, 5)], {"dim": 1}, lambda x: x.amax(1)
    yield "min", [(3, 5)], {"dim": 0, "keepdim": True}, lambda x: x.amin(0, keepdim=True)
    yield "softmax", [(3, 5)], {"dim": 1}, lambda x: x.softmax(1)
    yield "log_softmax", [(3, 5)], {"dim": 0}, lambda x: x.log_softmax(0)
    yield ("layer_norm", [(3, 4, 5), (5,), (5,)], {"normalized_shape": (5,), "eps": 1e-5},
           lambda x, w, b: F.layer_norm(x, (5,), w, b))
    yield "embedding", [("i", 7, (3, 4)), (7, 5)], {}, F.embedding
    yield "gather", [(3, 5), ("i", 5, (3, 4))], {"dim": 1}, lambda x, i: torch.gather(x, 1, i)
    yield "gather", [(5, 4), ("i", 4, (3, 4))], {"dim": 1}, lambda x, i: torch.gather(x, 1, i)
    yield "transpose", [(3, 4, 5)], {"dim0": 0, "dim1": 2}, lambda x: x.transpose(0, 2)
    yield "permute", [(3, 4, 5)], {"dims": (2, 0, 1)}, lambda x: x.permute(2, 0, 1)
    yield "reshape", [(6, 5)], {"shape": (3, 2, 5)}, lambda x: x.reshape(3, 2, 5)
    yield "reshape", [(6, 5)], {"shape": (2, -1, 5)}, lambda x: x.reshape(2, 3, 5)
    yield "view", [(3, 4)], {"shape": (12,)}, lambda x: x.reshape(12)
    yield "concat", [(3, 4), (3, 2), (3, 5)], {"dim": 1}, lambda *xs: torch.cat(xs, 1)
    yield "slice", [(5, 8)], {"dim": 1, "start": 1, "stop": 7, "step": 2}, lambda x: x[:, 1:7:2]
    yield "cross_entropy", [(5, 4), ("i", 4, (5,))], {}, F.cross_entropy
    yield ("conv2d", [(3, 4, 5, 5), (5, 4, 3, 3), (5,)], {"stride": (2, 2), "padding": (1, 1)},
           lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1))
    yield "conv2d", [(3, 4, 5, 5), (5, 4, 1, 1)], {}, F.conv2d
    yield "matmul", [(3, 5), (5, 4)], {}, torch.matmul
    yield "matmul", [(3, 4, 5), (3, 5, 4)], {}, torch.matmul
    yield "matmul", [(3, 4, 5), (5, 3)], {}, torch.matmul
    yield "linear", [(3, 4, 5), (3, 5), (3,)], {}, F.linear
    yield "linear", [(3, 5), (4, 5)], {}, F.linear


def make_inputs(specs, gen: torch.Generator) -> list[torch.Tensor]:
    """Random inputs; floats are kept away from 0 so that no sign or division rule holds by luck."""
    out = []
    for spec in specs:
        if spec[0] == "i":
            out.append(torch.randint(0, spec[1], spec[2], generator=gen))
        else:
            x = torch.randn(spec, generator=gen)
            out.append(x.sign() * (x.abs() + 0.25))
    return out


EXAMPLES = list(_examples())


def _options(ndim: int, floating: bool) -> list:
    return [B] + [S(d) for d in range(ndim)] + (PARTIALS if floating else [])


def _passes(name, trials, attrs, sig) -> bool:
    for seed, (inputs, want) in enumerate(trials):
        try:
            got = run_signature(name, inputs, attrs, MESH, sig, torch.Generator().manual_seed(100 + seed))[0]
        except (ValueError, RuntimeError, IndexError):
            return False
        if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-4, atol=1e-4):
            return False
    return True


def _covered(s: NdSignature, listed: set[NdSignature]) -> bool:
    """B inputs beside P(max) inputs are P(max) whose candidates agree (free to box): covered by
    the signature with those inputs P(max), if that one is listed."""
    out = s.outputs[0][0]
    if out not in (Partial("max"), Partial("min")):
        return False
    lifted = NdSignature(tuple((out,) if x == (B,) else x for x in s.inputs), s.outputs)
    return lifted != s and lifted in listed


@pytest.mark.parametrize("case", range(len(EXAMPLES)),
                         ids=[f"{e[0]}-{i}" for i, e in enumerate(EXAMPLES)])
def test_listed_signatures_are_exactly_the_valid_ones(case):
    name, specs, attrs, ref = EXAMPLES[case]
    trials = []
    for seed in range(3):
        inputs = make_inputs(specs, torch.Generator().manual_seed(seed))
        trials.append((inputs, ref(*inputs)))
    inputs, want = trials[0]
    metas = [TensorMeta.of(t) for t in inputs]
    out_meta = get_op(name).infer(metas, attrs)[0]
    assert (out_meta.shape, out_meta.dtype) == (tuple(want.shape), want.dtype)
    listed = {s for s in nd_signatures(name, metas, attrs, MESH) if any(x != (B,) for x in s.inputs)}
    found = set()
    per_input = [_options(len(t.shape), t.dtype.is_floating_point) for t in inputs]
    for ins in itertools.product(*per_input):
        if all(isinstance(x, Broadcast) for x in ins):
            continue
        for out in _options(len(want.shape), True):
            s = NdSignature(tuple((x,) for x in ins), ((out,),))
            if _passes(name, trials, attrs, s):
                found.add(s)
    # an output every rank holds whole is also a valid P(max)/P(min); ops never list that
    copies = {s for s in found if s.outputs[0][0] in (Partial("max"), Partial("min"))
              and NdSignature(s.inputs, ((B,),)) in found}
    found -= copies
    found = {s for s in found if not _covered(s, listed)}
    assert listed, f"{name} lists no signature besides all-B"
    assert found - listed == set(), f"{name}: valid but not listed: {sorted(map(repr, found - listed))}"
    assert listed - found == set(), f"{name}: listed but wrong: {sorted(map(repr, listed - found))}"
