"""Mixed precision executed: ``Strategy(precision=sl.Precision.mixed("bf16"))`` trains on real workers
like single-device torch under ``torch.autocast(bfloat16)`` with fp32 master weights, under data and
tensor parallel; the graph computes matmuls in bf16 from fp32 masters; gradients and optimizer states
kept in bf16 when asked; fp16 refused (no loss scaling).

Tolerance: bf16 has an 8-bit mantissa (relative rounding 2**-8 = 3.9e-3). On one rank the compiled
step is torch's autocast op for op and agrees to fp32 rounding; across ranks a weight gradient is the sum
of per-rank bf16 matmuls instead of one, so losses may differ by a few bf16 roundings of the
gradient step: we allow 2e-3 on the loss (about 4.3 here) and 2e-3 on each parameter.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

import sbplab as sl
from sbplab.compiler.reference import torch_steps

LOSS_TOL = 2e-3
PARAM_TOL = 2e-3
STEPS = 3
BF16 = sl.Precision.mixed("bf16")


def _gpt():
    torch.manual_seed(0)
    model = sl.models.GPT(sl.models.GPTConfig(n_layer=1))
    (idx,), targets = model.example_batch(8)
    return model, idx, targets


def _compile(model, idx, targets, strategy, precision, optimizer=None, capture="auto"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sl.ReplicatedOpWarning)  # the causal mask's triu: whole on every rank
        return sl.compile(model, (idx,), loss_fn=model.loss_fn, target=targets,
                          optimizer=optimizer or sl.SGD(lr=0.1),
                          strategy=dataclasses.replace(strategy, precision=precision), capture=capture)


def _check(result, want, want_params) -> None:
    assert result.losses == pytest.approx(want, abs=LOSS_TOL)
    for name, p in want_params.items():
        got = result.params[name].full()
        assert got.dtype == torch.float32, name  # master weights stay fp32
        assert torch.allclose(got, p, atol=PARAM_TOL, rtol=0), (name, (got - p).abs().max().item())


@pytest.fixture(scope="module")
def cluster():
    with sl.LocalCluster(2) as c:
        yield c


@pytest.fixture(scope="module")
def dp_bf16():
    model, idx, targets = _gpt()
    return _compile(model, idx, targets, sl.presets.data_parallel(2), BF16)


def test_graph_computes_in_bf16_from_fp32_masters(dp_bf16):
    model, idx, targets = _gpt()
    g = dp_bf16.graph
    mms = [op for op in g.ops_in("forward") if op.type in ("aten.addmm.default", "aten.bmm.default", "aten.mm.default")]
    assert mms and all(g.tensors[i].meta.dtype == torch.bfloat16 for op in mms for i in op.inputs)
    assert all(g.tensors[p].meta.dtype == torch.float32 for p in g.params)
    assert all(g.tensors[gr].meta.dtype == torch.float32 for gr in g.grads.values())
    assert g.tensors[g.loss].meta.dtype == torch.float32  # the loss (log-softmax) stays fp32, as autocast keeps it
    # one device: the compiled step is torch's autocast, op for op
    ex = _compile(model, idx, targets, sl.Strategy(sl.Placement("cpu", [0])), BF16).executor()
    feeds = {"idx": idx, "target": targets}
    losses = [ex.step(feeds) for _ in range(STEPS)]
    want, want_params = torch_steps(model, (idx,), target=targets, loss_fn=model.loss_fn, optimizer=sl.SGD(lr=0.1), steps=STEPS, precision=BF16)
    plain, _ = torch_steps(model, (idx,), target=targets, loss_fn=model.loss_fn, optimizer=sl.SGD(lr=0.1), steps=STEPS)
    # torch's autocast op for op (to fp32 rounding of the loss's mean), and not fp32 in disguise
    assert losses == pytest.approx(want, rel=1e-6) and losses != pytest.approx(plain, rel=1e-6)
    for name, p in want_params.items():
        assert torch.allclose(ex.value(name), p, atol=1e-6, rtol=0), name


@pytest.mark.multiprocess
@pytest.mark.parametrize("preset", ["dp", "tp"])
def test_bf16_on_workers_equals_torch_autocast(cluster, dp_bf16, preset):
    model, idx, targets = _gpt()
    step = dp_bf16 if preset == "dp" else _compile(model, idx, targets, sl.presets.tensor_parallel(2), BF16)
    result = cluster.run(step, (idx, targets), steps=STEPS, progress=False)
    want, want_params = torch_steps(model, (idx,), target=targets, loss_fn=model.loss_fn, optimizer=sl.SGD(lr=0.1), steps=STEPS, precision=BF16)
    _check(result, want, want_params)


@pytest.mark.multiprocess
def test_bf16_gradients_and_optimizer_states_on_workers(cluster, dp_bf16):
    """grad='bf16': gradients cast before the all-reduce (it moves half the bytes); optim_state='bf16':
    momentum stored in bf16. torch: each gradient and buffer rounded to bf16 after the step."""
    model, idx, targets = _gpt()
    opt = sl.SGD(lr=0.1, momentum=0.9)
    prec = sl.Precision(compute="bf16", grad="bf16", optim_state="bf16")
    step = _compile(model, idx, targets, sl.presets.data_parallel(2), prec, opt)
    g = step.graph
    assert all(g.tensors[gr].meta.dtype == torch.bfloat16 for gr in g.grads.values() if gr.endswith(".grad"))
    states = [s for s in g.state_updates if s.endswith("momentum_buffer")]
    assert states and all(g.tensors[s].meta.dtype == torch.bfloat16 for s in states)
    assert step.deduction.total_bytes() < dp_bf16.deduction.total_bytes()  # bf16 all-reduces
    result = cluster.run(step, (idx, targets), steps=STEPS, progress=False)
    want, want_params = torch_steps(model, (idx,), target=targets, loss_fn=model.loss_fn, optimizer=opt, steps=STEPS, precision=prec)
    _check(result, want, want_params)
    plain, _ = torch_steps(model, (idx,), target=targets, loss_fn=model.loss_fn, optimizer=opt, steps=STEPS, precision=BF16)
    assert want != plain  # the rounding of gradients and states is really there


def test_fp16_and_fx_capture_are_refused():
    model, idx, targets = _gpt()
    with pytest.raises(sl.InputError, match="loss scaling"):
        _compile(model, idx, targets, sl.presets.data_parallel(2), sl.Precision.mixed("fp16"))
    with pytest.raises(sl.GraphError, match="autocast"):
        _compile(model, idx, targets, sl.presets.data_parallel(2), BF16, capture="fx")


def test_adam_with_bf16_gradients_and_moments_equals_torch():
    """Adam reads a bf16 gradient and bf16 moments (loaded in fp32, stored back in bf16); one device."""
    model, idx, targets = _gpt()
    prec = sl.Precision(compute="bf16", grad="bf16", optim_state="bf16")
    opt = sl.Adam(lr=1e-3)
    step = _compile(model, idx, targets, sl.Strategy(sl.Placement("cpu", [0])), prec, opt)
    moments = [s for s in step.graph.state_updates if s.endswith(("exp_avg", "exp_avg_sq"))]
    assert moments and all(step.graph.tensors[s].meta.dtype == torch.bfloat16 for s in moments)
    ex = step.executor()
    losses = [ex.step({"idx": idx, "target": targets}) for _ in range(STEPS)]
    want, want_params = torch_steps(model, (idx,), target=targets, loss_fn=model.loss_fn, optimizer=opt, steps=STEPS, precision=prec)
    assert losses == pytest.approx(want, rel=1e-6)
    for name, p in want_params.items():
        assert torch.allclose(ex.value(name), p, atol=1e-6, rtol=0), name


def test_tensor_parallel_splits_the_same_layers_through_autocast_casts():
    """Under autocast a weight reaches its matmul through a bf16 copy: the Megatron pairs are found through
    the cast, so the bf16 step splits what the fp32 one splits."""
    model, idx, targets = _gpt()
    split = {}
    for precision in (sl.Precision(), BF16):
        strategy = dataclasses.replace(sl.presets.tensor_parallel(2), precision=precision)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # both leave the same head reshapes whole; said in a warning
            step = sl.compile(model, (idx,), loss_fn=model.loss_fn, target=targets, optimizer=sl.SGD(lr=0.1),
                              strategy=strategy, capture="aten")
        split[precision.compute] = sorted(n for n, t in step.graph.tensors.items()
                                          if t.role == "param" and step.deduction.sbp[n] != (sl.B,))
    assert split["fp32"] and split["bf16"] == split["fp32"]
