"""The compiler's own ops (optimizer updates, micro-batch accumulation, constants): every signature
reproduces the op on whole tensors, and the updates follow torch.optim. (Gradients come from torch's
autograd: ``tests/test_compiler_autodiff.py``.)"""

from __future__ import annotations

import pytest
import torch

import sbplab.compiler  # noqa: F401  (registers the ops)
from sbplab.ops import TensorMeta, check_signature_numerics, get_op
from sbplab.placement import Placement

MESHES = [Placement("cpu", [2, 0, 1]), Placement("cpu", [[0, 1], [3, 2]])]


GEN = torch.Generator().manual_seed(0)


def _r(*shape):
    return torch.randn(shape, generator=GEN)


def _cases():
    return [
        ("scale", [_r(4, 6)], {"factor": 0.5}),
        ("add_scalar", [_r(4, 6)], {"value": 0.5}),
        ("acc", [_r(4, 6)], {"scale": 0.25}),
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
    with pytest.raises(ValueError, match="acc"):
        get_op("acc").infer([TensorMeta((4, 5)), TensorMeta((6, 3))], {})
    m = TensorMeta((2,))
    with pytest.raises(ValueError, match="adam_update: the step counter must be a scalar"):
        get_op("adam_update").infer([m] * 5, {})
