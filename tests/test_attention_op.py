"""SDPA captured as one attention op (``sbplab.scaled_dot_product_attention`` and its backward), whose
kernel the device picks: nanoGPT (``is_causal``) and transformers models with ``attn_implementation=
"sdpa"`` train on real workers under data and tensor parallel with torch's losses, and tensor
parallel splits attention by heads (Llama: grouped-query heads; BERT: a padding mask). nanoGPT's
fused QKV projection is not paired by tensor parallel (its ``split`` of the fused output), so its
attention stays whole there; data parallel is its case.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import sbplab as sl
from sbplab.ops.aten.attention import BACKWARD, FORWARD, AttentionMode
from sbplab.sbp import Split

pytest.importorskip("transformers")
from sbplab.models import corpus  # noqa: E402

LR = 0.05


class _Calls(TorchDispatchMode):
    """The names of the ops dispatched under it."""

    def __enter__(self):
        self.names: set[str] = set()
        super().__enter__()
        return self.names

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(f"{func.namespace}.{func._opname}.{func._overloadname}")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("case", ["causal", "mask", "bool_mask", "gqa", "mqa"])
def test_op_equals_torch_sdpa_forward_and_backward(case):
    """The op's CPU kernels against F.scaled_dot_product_attention, value and gradients."""
    g = torch.Generator().manual_seed(0)
    kv_heads = {"gqa": 2, "mqa": 1}.get(case, 4)
    q = torch.randn(2, 4, 6, 8, generator=g, requires_grad=True)  # (B, H, L, E)
    k = torch.randn(2, kv_heads, 6, 8, generator=g, requires_grad=True)  # (B, Hkv, S, E)
    v = torch.randn(2, kv_heads, 6, 8, generator=g, requires_grad=True)
    mask = torch.rand(2, 1, 6, 6, generator=g) > 0.3
    mask[..., 0] = True
    kw = {"causal": {"is_causal": True}, "mask": {"attn_mask": mask.float().log()},
          "bool_mask": {"attn_mask": mask}}.get(case, {"is_causal": True, "enable_gqa": True})
    want = F.scaled_dot_product_attention(q, k, v, **kw)
    want_grads = torch.autograd.grad(want.square().sum(), (q, k, v))
    with AttentionMode(), _Calls() as calls:
        got = F.scaled_dot_product_attention(q, k, v, **kw)
        grads = torch.autograd.grad(got.square().sum(), (q, k, v))
    assert FORWARD in calls and BACKWARD in calls
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for a, b in zip(grads, want_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_flops_from_torch_flop_counter():
    """The op's FLOPs are torch's SDPA formulas (4 * B * H * L * S * E forward, 2.5x that backward);
    torch's counter has no formula for the CPU flash kernel that capture used to record (it counted 0)."""
    from torch.utils import flop_counter

    q = torch.randn(2, 4, 16, 8, requires_grad=True)  # (B, H, L, E)
    with flop_counter.FlopCounterMode(display=False) as ours, AttentionMode():
        F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    shape = tuple(q.shape)
    want = flop_counter.sdpa_flop_count(shape, shape, shape) + flop_counter.sdpa_backward_flop_count(
        shape, shape, shape, shape)
    assert ours.get_total_flops() == want == 4 * 2 * 4 * 16 * 16 * 8 * 3.5


@pytest.fixture(scope="module")
def cluster():
    with sl.LocalCluster(2) as c:
        yield c


def _attention_splits(step) -> list[str]:
    """The split each forward attention op got (its first input's SBP on the one mesh axis)."""
    out = []
    for op in step.graph.ops_in("forward"):
        if op.type == FORWARD:
            s = step.deduction.choices[op.name].signature.inputs[0][0]
            out.append(f"S({s.dim})" if isinstance(s, Split) else str(s))
    return out


@pytest.mark.multiprocess
@pytest.mark.parametrize("name,strategy,split", [
    ("nanogpt", "dp", "S(0)"), ("llama", "tp", "S(1)"), ("bert", "tp", "S(1)"),
])
def test_sdpa_models_train_like_torch(cluster, name, strategy, split):
    built = corpus.build(name, attn="sdpa")
    st = {"dp": lambda: sl.presets.data_parallel(2), "tp": lambda: sl.presets.tensor_parallel(2, vocab=True)}[strategy]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sl.ReplicatedOpWarning)
        step = sl.compile(built.model, built.inputs, loss_fn=built.loss_fn, target=built.target,
                          optimizer=sl.SGD(lr=LR), strategy=st)
    types = {op.type for op in step.graph.ops}
    assert FORWARD in types and BACKWARD in types
    assert not any("_scaled_dot_product_flash_attention_for_cpu" in t for t in types)
    assert set(_attention_splits(step)) == {split}  # heads split under tensor parallel, batch under data
    result = cluster.run(step, built.feeds(), steps=2)
    want, _ = built.train_torch(2, lambda ps: torch.optim.SGD(ps, lr=LR), st.micro_batches)
    assert result.losses == pytest.approx(want, abs=2e-5), (result.losses, want)
