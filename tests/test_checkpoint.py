"""Checkpoints in torch.distributed.checkpoint format resume exactly, under any strategy, and into torch.

Each worker writes its own blocks with DCP (``cluster.save``); a fresh compile of the same model that
loads the checkpoint (``cluster.load``) trains on to the bit like the run that was never interrupted,
for SGD, SGD with momentum, Adam and AdamW under data parallel, ZeRO-3, tensor parallel and a
pipeline. A checkpoint written under data parallel loads under tensor parallel and into a plain torch
module, with DCP alone, and its numbers are plain PyTorch's.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

import sbplab as sl
from sbplab.compiler.reference import torch_steps
from sbplab.runtime.checkpoint import load_checkpoint, read_checkpoint

pytestmark = pytest.mark.multiprocess

OPTIMIZERS = {
    "sgd": lambda: sl.SGD(lr=0.1),
    "momentum": lambda: sl.SGD(lr=0.1, momentum=0.9),
    "adam": lambda: sl.Adam(lr=0.01),
    "adamw": lambda: sl.AdamW(lr=0.01, weight_decay=0.1),
}
STRATEGIES = {
    "dp": lambda: sl.presets.data_parallel(2),
    "zero3": lambda: sl.presets.zero(2),
    "tp": lambda: sl.presets.tensor_parallel(2),
    "pipeline": lambda: sl.presets.pipeline(2, 2),
}


@pytest.fixture(scope="module")
def cluster():
    with sl.LocalCluster(2) as c:
        yield c


def _mlp(hidden: int = 16):
    torch.manual_seed(0)
    m = sl.models.MLP(sl.models.MLPConfig(in_dim=8, width=8, hidden=hidden, n_blocks=2, n_classes=4))
    (x,), y = m.example_batch(8)
    return m, (x,), y


def _gpt():
    torch.manual_seed(0)
    m = sl.models.GPT(sl.models.GPTConfig(n_layer=2, n_embd=16, n_head=2, block_size=8, vocab_size=32))
    inputs, y = m.example_batch(4)
    return m, inputs, y


MODELS = {"dp": _mlp, "zero3": _mlp, "tp": _mlp, "pipeline": _gpt}


def _compile(model, inputs, y, opt, strategy):
    return sl.compile(model, inputs, loss_fn=model.loss_fn, target=y, optimizer=opt, strategy=strategy)


def _same(a, b) -> None:
    assert set(a.params) == set(b.params)
    for name in a.params:  # parameters and optimizer state, to the bit
        assert torch.equal(a.params[name].full(), b.params[name].full()), name


@pytest.mark.parametrize("opt", list(OPTIMIZERS))
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_resume_from_a_checkpoint_is_bit_identical(cluster, tmp_path, strategy, opt):
    model, inputs, y = MODELS[strategy]()
    batch = (*inputs, y)
    step = _compile(model, inputs, y, OPTIMIZERS[opt](), STRATEGIES[strategy]())
    cluster.run(step, batch, steps=2, progress=False)
    path = cluster.save(step, tmp_path / "ck")
    files = sorted(p.name for p in path.iterdir())
    assert files[0] == ".metadata" and all(f.endswith(".distcp") for f in files[1:])
    if strategy != "dp":  # every rank holds a block nobody else has: every rank wrote a file
        assert files[1:] == ["__0_0.distcp", "__1_0.distcp"]
    on = cluster.run(step, batch, steps=2, progress=False)  # the run that was never interrupted
    again = _compile(model, inputs, y, OPTIMIZERS[opt](), STRATEGIES[strategy]())  # as a new process would
    assert not cluster.has_state(again)
    assert cluster.load(again, path) == 2
    resumed = cluster.run(again, batch, steps=2, progress=False)
    assert resumed.losses == on.losses
    _same(resumed, on)
    state = {k for k in resumed.params if k not in dict(model.named_parameters())}
    assert state or opt == "sgd"  # the optimizer state came back too


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")  # DCP without a process group
def test_a_data_parallel_checkpoint_loads_under_tensor_parallel_and_into_plain_torch(cluster, tmp_path):
    model, inputs, y = _mlp(hidden=12)  # hidden 12 splits evenly, 8 -> 12 -> 8 as Megatron's pairs
    opt = sl.SGD(lr=0.1, momentum=0.9)
    want, _ = torch_steps(model, inputs, target=y, loss_fn=model.loss_fn, optimizer=opt, steps=5)
    dp = _compile(model, inputs, y, opt, sl.presets.data_parallel(2))
    first = cluster.run(dp, (*inputs, y), steps=3, progress=False)
    path = cluster.save(dp, tmp_path / "dp")
    tp = _compile(model, inputs, y, opt, sl.presets.tensor_parallel(2))
    assert cluster.load(tp, path) == 3
    more = cluster.run(tp, (*inputs, y), steps=2, progress=False)
    assert first.losses + more.losses == pytest.approx(want, rel=1e-4, abs=1e-5)
    # the momentum came along: without it the 4th loss would be a plain SGD step's
    split = [k for k, v in more.params.items() if any(isinstance(s, sl.sbp.Split) for s in v.sbp)]
    assert any(k.endswith(".momentum_buffer") for k in split)  # resharded on load: TP splits what DP kept whole

    # into a plain torch module, by DCP itself (no process group) and by the helper
    plain = sl.models.MLP(sl.models.MLPConfig(in_dim=8, width=8, hidden=12, n_blocks=2, n_classes=4))
    sd = plain.state_dict()
    dcp.load(sd, checkpoint_id=str(path), planner=DefaultLoadPlanner(allow_partial_load=True), no_dist=True)
    plain.load_state_dict(sd)
    for name, p in plain.named_parameters():
        assert torch.equal(p.detach(), first.params[name].full()), name
    other = sl.models.MLP(sl.models.MLPConfig(in_dim=8, width=8, hidden=12, n_blocks=2, n_classes=4))
    assert sorted(load_checkpoint(other, path)) == sorted(n for n, _ in other.named_parameters())
    with torch.no_grad():
        assert model.loss_fn(other(*inputs), y).item() == pytest.approx(want[3], rel=1e-5)
    dcp_to_torch_save(path, tmp_path / "all.pt")
    everything = torch.load(tmp_path / "all.pt")
    assert int(everything["sbplab.steps"]) == 3
    for name, v in first.params.items():  # optimizer state included
        assert torch.equal(everything[name], v.full()), name
    assert read_checkpoint(path).keys() == everything.keys()


def test_periodic_checkpoints_and_what_load_refuses(cluster, tmp_path):
    """checkpoint_every with checkpoint_dir writes one folder per N steps; each resumes exactly. A
    checkpoint lacking what a step needs, or of other shapes, is refused before any worker reads it."""
    model, inputs, y = _mlp()
    batch = (*inputs, y)
    step = _compile(model, inputs, y, sl.Adam(lr=0.01), sl.presets.data_parallel(2))
    whole = cluster.run(step, batch, steps=5, progress=False, checkpoint_every=2, checkpoint_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000002", "step-00000004", "step-00000005"]
    assert [e.step for e in whole.trace.events if e.actor == whole.trace.events[0].actor] == [0, 1, 2, 3, 4]
    again = _compile(model, inputs, y, sl.Adam(lr=0.01), sl.presets.data_parallel(2))
    assert cluster.load(again, tmp_path / "step-00000002") == 2
    assert cluster.run(again, batch, steps=3, progress=False).losses == whole.losses[2:]
    one = cluster.run(step, batch, steps=5, progress=False, restart=True)
    assert one.losses == whole.losses  # cut into runs of 2 steps or not, the same numbers

    sgd = _compile(model, inputs, y, sl.SGD(lr=0.1), sl.presets.data_parallel(2))
    plain = tmp_path / "sgd"
    cluster.save(sgd, plain)  # never run: the compiled weights, step 0
    assert int(read_checkpoint(plain)["sbplab.steps"]) == 0
    with pytest.raises(sl.ClusterError, match=r"no \[.*exp_avg.*another optimizer"):
        cluster.load(again, plain)
    wide, winputs, wy = _mlp(hidden=32)
    with pytest.raises(sl.ClusterError, match=r"blocks.0.fc1.weight.*\(16, 8\) in the checkpoint.*\(32, 8\)"):
        cluster.load(_compile(wide, winputs, wy, sl.SGD(lr=0.1), sl.presets.data_parallel(2)), plain)
    with pytest.raises(sl.InputError, match="no checkpoint at"):
        cluster.load(sgd, tmp_path / "nothing")
    assert cluster.alive and cluster.run(again, batch, steps=1, progress=False).losses  # nothing was lost


# --- a strided split (fused QKV under tensor parallel): each rank's value is k blocks of the tensor ---------

def _nanogpt_step(opt, strategy):
    from sbplab.models import corpus

    built = corpus.build("nanogpt", batch=4, seq=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sl.TensorParallelWarning)
        warnings.simplefilter("ignore", sl.ReplicatedOpWarning)
        step = sl.compile(built.model, built.inputs, optimizer=opt, strategy=strategy)
    return built, step


def test_a_strided_split_saves_resumes_and_loads_under_data_parallel_and_into_torch(cluster, tmp_path):
    """nanoGPT's fused QKV weight under tensor parallel is S(0, chunks=3): each rank writes its slice of q,
    of k and of v as three blocks. Resume is bit-identical (Adam's moments strided too); the checkpoint
    reads whole into a plain module; it loads under data parallel and back, training on like torch."""
    pytest.importorskip("transformers")
    adam = lambda: sl.Adam(lr=0.01)  # noqa: E731
    built, tp = _nanogpt_step(adam(), sl.presets.tensor_parallel(2))
    fused = "h.0.c_attn.weight"
    assert tp.deduction.sbp[fused] == (sl.S(0, chunks=3),)
    feeds = built.feeds()
    first = cluster.run(tp, feeds, steps=2, progress=False)
    path = cluster.save(tp, tmp_path / "tp")
    on = cluster.run(tp, feeds, steps=2, progress=False)
    _, again = _nanogpt_step(adam(), sl.presets.tensor_parallel(2))
    assert cluster.load(again, path) == 2
    resumed = cluster.run(again, feeds, steps=2, progress=False)
    assert resumed.losses == on.losses
    _same(resumed, on)

    whole = read_checkpoint(path)  # the strided blocks put back in q, k, v order: the logical tensors
    for name in (fused, f"{fused}.exp_avg", f"{fused}.exp_avg_sq"):
        assert torch.equal(whole[name], first.params[name].full()), name
    plain = copy.deepcopy(built.model)
    load_checkpoint(plain, path)
    want, _ = built.train_torch(4, lambda ps: torch.optim.Adam(ps, lr=0.01))
    assert first.losses == pytest.approx(want[:2], abs=2e-5)
    plain_tp = dict(plain.named_parameters())
    for name in (fused, "h.1.c_attn.weight"):
        assert torch.equal(plain_tp[name].detach(), first.params[name].full()), name

    # TP (strided) -> DP -> TP, with the optimizer state, against torch's steps 3-5
    _, dp = _nanogpt_step(adam(), sl.presets.data_parallel(2))
    assert cluster.load(dp, path) == 2
    under_dp = cluster.run(dp, feeds, steps=2, progress=False)
    assert under_dp.losses == pytest.approx(want[2:], abs=2e-5)
    assert under_dp.params[fused].sbp == (sl.B,)
    back = cluster.save(dp, tmp_path / "dp")
    _, tp2 = _nanogpt_step(adam(), sl.presets.tensor_parallel(2))
    assert cluster.load(tp2, back) == 4
    last = cluster.run(tp2, feeds, steps=1, progress=False)
    want5, _ = built.train_torch(5, lambda ps: torch.optim.Adam(ps, lr=0.01))
    assert last.losses == pytest.approx(want5[4:], abs=2e-5)
