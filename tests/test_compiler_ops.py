"""The compiler's own ops (gradients, optimizer updates): every signature reproduces the op on
whole tensors, and every gradient op computes the gradient torch.autograd computes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import sbplab.compiler  # noqa: F401  (registers the ops)
from sbplab.ops import TensorMeta, check_signature_numerics, get_op
from sbplab.placement import Placement

MESHES = [Placement("cpu", [2, 0, 1]), Placement("cpu", [[0, 1], [3, 2]])]


GEN = torch.Generator().manual_seed(0)


def _r(*shape):
    return torch.randn(shape, generator=GEN)


def _cases():
    ids = torch.randint(0, 7, (4, 3), generator=GEN)
    return [
        ("relu_grad", [_r(4, 6), _r(4, 6)], {}),
        ("gelu_grad", [_r(4, 6), _r(4, 6)], {"approximate": "tanh"}),
        ("tanh_grad", [_r(4, 6), _r(4, 6).tanh()], {}),
        ("softmax_grad", [_r(4, 6), _r(4, 6).softmax(1)], {"dim": 1}),
        ("log_softmax_grad", [_r(4, 6), _r(4, 6).log_softmax(-1)], {"dim": -1}),
        ("scale", [_r(4, 6)], {"factor": 0.5}),
        ("add_scalar", [_r(4, 6)], {"value": 0.5}),
        ("acc", [_r(4, 6)], {"scale": 0.25}),
        ("sum_grad", [_r(4)], {"out_shape": (4, 6, 5), "dims": (1, 2), "keepdim": False, "scale": 0.1}),
        ("sum_grad", [_r(4, 1, 5)], {"out_shape": (4, 6, 5), "dims": (1,), "keepdim": True}),
        ("grad_sum", [_r(4, 6, 5)], {"dims": (0, 2), "squeeze": (0,)}),
        ("grad_sum", [_r(4, 6, 5, 3)], {"dims": (0, 2, 3), "squeeze": (0, 2, 3)}),
        ("max_grad", [_r(4, 5), _r(4, 6, 5)], {"dim": 1, "keepdim": False}),
        ("max_grad", [_r(4, 1), _r(4, 6)], {"dim": 1, "keepdim": True, "mode": "min"}),
        ("slice_grad", [_r(4, 2)], {"out_shape": (4, 6), "dim": 1, "start": 1, "stop": 5, "step": 2}),
        ("gather_grad", [_r(4, 3), torch.randint(0, 6, (4, 3), generator=GEN)], {"out_shape": (4, 6), "dim": 1}),
        ("layer_norm_grad", [_r(4, 3, 6), _r(4, 3, 6), _r(6)], {"normalized_shape": (6,), "eps": 1e-5}),
        ("linear_grad_input", [_r(4, 3, 6), _r(6, 5)], {}),
        ("linear_grad_weight", [_r(4, 3, 6), _r(4, 3, 5)], {}),
        ("embedding_grad", [_r(4, 3, 6), ids], {"num_embeddings": 7}),
        ("embedding_grad", [_r(4, 3, 6), ids], {"num_embeddings": 7, "padding_idx": 2}),
        ("cross_entropy_grad", [_r(), _r(6, 5), torch.randint(0, 5, (6,), generator=GEN)], {}),
        ("conv2d_grad_input", [_r(4, 6, 3, 3), _r(6, 4, 3, 3)],
         {"out_shape": (4, 4, 5, 5), "stride": (2, 2), "padding": (1, 1)}),
        ("conv2d_grad_weight", [_r(4, 6, 3, 3), _r(4, 4, 5, 5)],
         {"out_shape": (6, 4, 3, 3), "stride": (2, 2), "padding": (1, 1)}),
        ("sgd_update", [_r(6, 4), _r(6, 4)], {"lr": 0.1, "weight_decay": 0.01}),
        ("sgd_momentum_update", [_r(6, 4), _r(6, 4), _r(6, 4)], {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
        ("adam_update", [_r(6, 4), _r(6, 4), _r(6, 4), _r(6, 4).abs(), torch.tensor(3.0)],
         {"lr": 0.1, "beta1": 0.9, "beta2": 0.99, "eps": 1e-8}),
        ("step_count", [torch.tensor(2.0)], {}),
        ("fill", [], {"shape": (2, 3), "value": 1.5}),
    ]


@pytest.mark.parametrize("name,inputs,attrs", _cases(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_signature_matches_the_whole_op(name, inputs, attrs):
    gen = torch.Generator().manual_seed(1)
    checked = sum(check_signature_numerics(name, inputs, attrs, mesh, gen=gen) for mesh in MESHES)
    assert checked >= 2  # at least the all-B signature on each mesh


def test_partial_gradient_signatures_exist_where_the_op_is_linear():
    """relu_grad is linear in g: (P, B) -> P must be listed, and (B, P) must not."""
    from sbplab.ops import one_d_signatures
    from sbplab.sbp import B, P

    m = TensorMeta((4, 6))
    sigs = {(s.inputs, s.outputs) for s in one_d_signatures(get_op("relu_grad"), [m, m], {})}
    assert ((P, B), (P,)) in sigs
    assert ((B, P), (P,)) not in sigs


def _vjp(fn, inputs, g):
    xs = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]
    out = fn(*xs)
    return torch.autograd.grad(out, [x for x in xs if x.requires_grad], g)


def test_gradient_kernels_equal_autograd():
    x, g, w = _r(4, 3, 6), _r(4, 3, 6), _r(6)
    k = lambda name, ins, a={}: get_op(name).kernel(ins, a)  # noqa: E731
    torch.testing.assert_close(k("relu_grad", [g, x.relu()])[0], _vjp(torch.relu, [x], g)[0])
    torch.testing.assert_close(k("gelu_grad", [g, x], {"approximate": "none"})[0], _vjp(F.gelu, [x], g)[0])
    torch.testing.assert_close(k("tanh_grad", [g, x.tanh()])[0], _vjp(torch.tanh, [x], g)[0])
    torch.testing.assert_close(k("softmax_grad", [g, x.softmax(-1)], {"dim": -1})[0],
                               _vjp(lambda t: t.softmax(-1), [x], g)[0])
    torch.testing.assert_close(k("log_softmax_grad", [g, x.log_softmax(1)], {"dim": 1})[0],
                               _vjp(lambda t: t.log_softmax(1), [x], g)[0])
    ln = lambda t, w, b: F.layer_norm(t, (6,), w, b)  # noqa: E731
    b = _r(6)
    dx, dw, db = k("layer_norm_grad", [g, x, w], {"normalized_shape": (6,), "eps": 1e-5})
    for got, want in zip((dx, dw, db), _vjp(ln, [x, w, b], g)):
        torch.testing.assert_close(got, want)
    lw = _r(5, 6)
    gy = _r(4, 3, 5)
    want = _vjp(F.linear, [x, lw], gy)
    torch.testing.assert_close(k("linear_grad_input", [gy, lw])[0], want[0])
    torch.testing.assert_close(k("linear_grad_weight", [gy, x])[0], want[1])
    ids = torch.randint(0, 7, (4, 3), generator=GEN)
    table = _r(7, 6)
    want = _vjp(lambda t: F.embedding(ids, t, padding_idx=1), [table], g)[0]
    torch.testing.assert_close(k("embedding_grad", [g, ids], {"num_embeddings": 7, "padding_idx": 1})[0], want)
    logits, tgt, s = _r(6, 5), torch.randint(0, 5, (6,), generator=GEN), torch.tensor(0.7)
    want = _vjp(lambda t: F.cross_entropy(t, tgt), [logits], s)[0]
    torch.testing.assert_close(k("cross_entropy_grad", [s, logits, tgt])[0], want)
    img, cw, gc = _r(2, 4, 5, 5), _r(6, 2, 3, 3), _r(2, 6, 3, 3)
    conv = {"stride": (2, 2), "padding": (1, 1), "groups": 2}
    want = _vjp(lambda a, b: F.conv2d(a, b, stride=2, padding=1, groups=2), [img, cw], gc)
    torch.testing.assert_close(k("conv2d_grad_input", [gc, cw], {"out_shape": (2, 4, 5, 5), **conv})[0], want[0])
    torch.testing.assert_close(k("conv2d_grad_weight", [gc, img], {"out_shape": (6, 2, 3, 3), **conv})[0], want[1])
    gm = _r(4)
    want = _vjp(lambda t: t.amax(1), [x[:, 0]], gm)[0]
    torch.testing.assert_close(k("max_grad", [gm, x[:, 0]], {"dim": 1})[0], want)


def test_optimizer_kernels_follow_torch_optim():
    p0, grads = _r(5, 3), [_r(5, 3) for _ in range(3)]
    for attrs, make in [
        ({"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01, "nesterov": True},
         lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True)),
    ]:
        p, buf = p0.clone(), torch.zeros_like(p0)
        ref = p0.clone().requires_grad_()
        opt = make([ref])
        for g in grads:
            p, buf = get_op("sgd_momentum_update").kernel([p, g, buf], attrs)
            ref.grad = g.clone()
            opt.step()
        torch.testing.assert_close(p, ref.detach())
    p, m, v, t = p0.clone(), torch.zeros_like(p0), torch.zeros_like(p0), torch.zeros(())
    ref = p0.clone().requires_grad_()
    opt = torch.optim.AdamW([ref], lr=0.05, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1)
    attrs = {"lr": 0.05, "beta1": 0.8, "beta2": 0.9, "eps": 1e-6, "weight_decay": 0.1, "decoupled": True}
    for g in grads:
        t = get_op("step_count").kernel([t], {})[0]
        p, m, v = get_op("adam_update").kernel([p, g, m, v, t], attrs)
        ref.grad = g.clone()
        opt.step()
    torch.testing.assert_close(p, ref.detach())
    assert float(t) == 3.0


@pytest.mark.parametrize("momentum,nesterov,wd", [(0.0, False, 0.0), (0.0, False, 0.01), (0.9, False, 0.0),
                                                   (0.9, True, 0.01)])
def test_sgd_kernels_are_torch_optim_bit_for_bit(momentum, nesterov, wd):
    """The single-tensor formulas of torch.optim.SGD (``add`` with ``alpha``), so results are its bits."""
    p0, grads = _r(5, 3), [_r(5, 3) for _ in range(3)]
    ref = p0.clone().requires_grad_()
    opt = torch.optim.SGD([ref], lr=0.1, momentum=momentum, nesterov=nesterov, weight_decay=wd, foreach=False)
    p, buf = p0.clone(), torch.zeros_like(p0)
    for g in grads:
        if momentum:
            p, buf = get_op("sgd_momentum_update").kernel(
                [p, g, buf], {"lr": 0.1, "momentum": momentum, "nesterov": nesterov, "weight_decay": wd})
        else:
            (p,) = get_op("sgd_update").kernel([p, g], {"lr": 0.1, "weight_decay": wd})
        ref.grad = g.clone()
        opt.step()
        assert torch.equal(p, ref.detach())


def test_bad_shapes_name_the_op():
    with pytest.raises(ValueError, match="linear_grad_input"):
        get_op("linear_grad_input").infer([_r(4, 5), _r(6, 3)], {})
    m = TensorMeta((2,))
    with pytest.raises(ValueError, match="adam_update: the step counter must be a scalar"):
        get_op("adam_update").infer([m] * 5, {})
