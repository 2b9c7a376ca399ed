"""Export to DTensor: placements and plans read off a compiled step; the exported model, trained with
plain torch on Gloo ranks (2, or 4 for DP x TP), follows the same losses as sbplab (and single-device
PyTorch): data parallel and Megatron through ``apply`` and through the generated ``code()``, ZeRO-3
through FSDP2's fully_shard, DP x TP as 2-D placements."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import warnings

import pytest
import torch
import torch.multiprocessing as mp

import sbplab as sl
from sbplab.compiler import SGD, presets
from sbplab.compiler.reference import torch_steps
from sbplab.export import DTensorExport, to_dtensor
from sbplab.export.coverage import as_sbplab, coverage, prepared_by
from sbplab.models import CNN, MLP, CNNConfig, MLPConfig

LR, STEPS = 0.1, 3


def _mlp():
    torch.manual_seed(0)
    m = MLP(MLPConfig())
    (x,), y = m.example_batch(8)
    return m, x, y


def _export(strategy) -> tuple[DTensorExport, sl.Compiled]:
    m, x, y = _mlp()
    step = sl.compile(m, (x,), loss_fn=m.loss_fn, target=y, optimizer=SGD(lr=LR), strategy=strategy)
    return to_dtensor(step), step


def test_data_parallel_is_replicated_params_and_a_sharded_batch():
    exp, _ = _export(presets.data_parallel(2))
    assert exp.mode == "distribute" and exp.mesh_shape == (2,) and exp.mesh_dim_names == ("dp",)
    assert {repr(p) for p in exp.placements.values()} == {"(Replicate(),)"}
    assert repr(exp.input_placements["x"]) == "(Shard(0),)" and exp.plan == {} and exp.unsupported == []


def test_megatron_is_a_colwise_rowwise_plan():
    exp, step = _export(presets.tensor_parallel(2))
    assert exp.mode == "parallelize_module" and exp.tp_dim == "tp"
    assert exp.plan == {"blocks.0.fc1": "ColwiseParallel()", "blocks.0.fc2": "RowwiseParallel()",
                        "blocks.1.fc1": "ColwiseParallel()", "blocks.1.fc2": "RowwiseParallel()"}
    assert repr(exp.placements["blocks.0.fc1.weight"]) == "(Shard(0),)"
    assert repr(exp.placements["blocks.0.fc2.weight"]) == "(Shard(1),)"
    for p, pl in exp.placements.items():  # exactly sbplab's SBP, axis by axis
        assert repr(pl) == repr(tuple(step.deduction.sbp[p])).replace("S(", "Shard(").replace("B", "Replicate()")
    src = exp.code()
    compile(src, "<export>", "exec")
    assert "'blocks.0.fc1': ColwiseParallel()," in src and "parallelize_module(model, mesh, plan)" in src


def test_dp_tp_keeps_both_axes_and_zero_is_fully_shard():
    exp, _ = _export(presets.dp_tp((2, 2)))
    assert exp.mode == "distribute" and exp.mesh_dim_names == ("dp", "tp")
    assert repr(exp.placements["blocks.0.fc1.weight"]) == "(Replicate(), Shard(0))"
    assert repr(exp.input_placements["x"]) == "(Shard(0), Replicate())"
    assert exp.plan["blocks.1.fc2"] == "RowwiseParallel()"
    compile(exp.code(), "<export>", "exec")
    z3, _ = _export(presets.zero(2))
    z2, _ = _export(presets.zero(2, shard_params=False))
    assert (z3.mode, z3.reshard_after_forward) == ("fully_shard", True)
    assert (z2.mode, z2.reshard_after_forward) == ("fully_shard", False)
    assert "fully_shard(model, mesh=mesh, reshard_after_forward=True)" in z3.code()


def test_what_dtensor_cannot_express_is_named():
    exp, _ = _export(presets.pipeline(2, 2))
    assert exp.mode == "pipeline"
    assert "torch.distributed.pipelining" in exp.unsupported[0] and "'blocks.1': SplitPoint.BEGINNING" in exp.unsupported[0]
    with pytest.raises(ValueError, match="pipeline, which DTensor cannot express"):
        exp.apply(torch.nn.Linear(2, 2), None)
    st = presets.data_parallel(2).signature("blocks_0_act", "S(0) -> S(0)", why="mine")
    exp, _ = _export(st)
    assert any("signature hint 'blocks_0_act'" in u and "no per-op signature" in u for u in exp.unsupported)
    cnn = CNN(CNNConfig())
    exp = to_dtensor(presets.tensor_parallel(2), model=cnn)
    assert any(u.startswith("conv1 (conv2d) weight split") for u in exp.unsupported)
    assert exp.mode == "distribute" and exp.plan == {}


def test_importing_the_export_does_not_load_torch_distributed_tensor():
    """The export itself loads DTensor only when applied (whatever ``import sbplab`` loads on its own)."""
    code = ("import sys, sbplab\nbefore = set(sys.modules)\nimport sbplab.export\n"
            "print(sorted(m for m in set(sys.modules) - before if m.startswith('torch.distributed')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@contextlib.contextmanager
def _gloo_rank(rank: int, world: int, port: int, queue):
    """One spawned Gloo rank: joins the group, runs the body, and leaves without interpreter finalization
    (Gloo's threads may still hold tensors then, and torch aborts the process while tearing them down,
    pytorch/pytorch#179291), after the work is done."""
    import os

    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()
    queue.close()
    queue.join_thread()
    os._exit(0)


def _train(rank: int, world: int, port: int, exp: DTensorExport, via_code: bool, queue) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    with _gloo_rank(rank, world, port, queue):
        model, x, y = _mlp()
        if via_code:  # the text a user would paste, run as is
            ns = {"model": model, "x": x, "target": y}
            exec(exp.code(), ns)
            model, batch = ns["model"], {"x": ns["x"], "target": ns["target"]}
        else:
            mesh = init_device_mesh("cpu", exp.mesh_shape, mesh_dim_names=exp.mesh_dim_names)
            model = exp.apply(model, mesh)
            batch = exp.shard_batch({"x": x, "target": y}, mesh)
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        losses = []
        for _ in range(STEPS):
            opt.zero_grad()
            loss = model.loss_fn(model(batch["x"]), batch["target"])
            loss.backward()
            opt.step()
            value = (loss.full_tensor() if isinstance(loss, DTensor) else loss).detach()
            if exp.mode == "fully_shard":  # FSDP: each rank's loss is the mean of its own slice
                dist.all_reduce(value)
                value /= world
            losses.append(value.item())
        queue.put((rank, losses))


@pytest.mark.multiprocess
@pytest.mark.parametrize("preset, via_code", [("dp", False), ("tp", False), ("tp", True), ("dp", True),
                                             ("zero3", False), ("dp_tp", False)])
def test_exported_model_trains_like_sbplab_on_gloo_ranks(preset, via_code):
    from sbplab.runtime.cluster import free_port

    strategy, mode = {"dp": (presets.data_parallel(2), "distribute"),
                      "tp": (presets.tensor_parallel(2), "parallelize_module"),
                      "zero3": (presets.zero(2), "fully_shard"),
                      "dp_tp": (presets.dp_tp((2, 2)), "distribute")}[preset]
    exp, step = _export(strategy)
    assert exp.mode == mode
    world = len(step.physical.ranks)
    m, x, y = _mlp()
    ex = step.executor()
    ours = [ex.step({"x": x, "target": y}) for _ in range(STEPS)]
    ref, _ = torch_steps(m, (x,), target=y, loss_fn=m.loss_fn, optimizer=SGD(lr=LR), steps=STEPS)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_train, args=(r, world, port, exp, via_code, queue)) for r in range(world)]
    for p in procs:
        p.start()
    got = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for rank in range(world):
        assert max(abs(a - b) for a, b in zip(got[rank], ours)) < 1e-5, (rank, got[rank], ours)
    assert max(abs(a - b) for a, b in zip(ours, ref)) < 1e-5
    assert ours[-1] < ours[0]  # it trained


# --- the real-model corpus: tied weights, keyword inputs, attention through local_map --------------------------


def _corpus_export(name: str, strategy: str):
    from sbplab.models import corpus

    b = corpus.build(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = sl.compile(b.model, b.inputs, loss_fn=b.loss_fn, target=b.target, optimizer=SGD(lr=LR),
                          strategy=corpus.strategies()[strategy]())
    return b, step, to_dtensor(step)


def test_coverage_says_which_ops_dtensor_runs_as_sbplab():
    pytest.importorskip("transformers")
    from sbplab.export.coverage import KINDS, coverage

    _, step, exp = _corpus_export("gpt2", "tp")
    cov = coverage(step)
    aten = [op for op in step.graph.ops if op.phase in ("forward", "backward") and "." in op.type]
    assert cov.total == len(aten) and cov.skipped == len(step.graph.ops) - len(aten)
    assert set(cov.kinds) <= set(KINDS) and sum(cov.kinds.values()) == cov.total
    assert 0.5 < cov.fraction <= cov.fraction_with_redistributes <= 1
    # attention (sbplab's op): DTensor has no rule for it or its backward, which sbplab
    # splits by batch here; the export runs each call through local_map with sbplab's placements
    sdpa = [v for v in cov.verdicts if v.type.startswith("sbplab.scaled_dot_product_attention")]
    back = [v for v in sdpa if "backward" in v.type]
    assert back and all(v.kind == "local_map" and v.dtensor.startswith("no rule") for v in back)
    assert len(exp.local_maps) == 2 == len(sdpa) - len(back)
    assert all(c.function == "scaled_dot_product_attention" for c in exp.local_maps)
    # a matmul whose inputs arrive as sbplab lays them out is run by DTensor's own rule the same way
    mms = [v for v in cov.verdicts if v.type in ("aten.mm.default", "aten.addmm.default")]
    assert mms and all(v.kind == "dtensor" for v in mms)
    assert "local_map" in exp.summary() and "DTensor expresses" in cov.summary()
    # the vocabulary-split embedding's output is reduced once where it leaves, in the code a user pastes too
    assert [m.module for m in exp.module_outputs] == ["transformer.wte"]
    src = exp.code()
    compile(src, "<export>", "exec")
    assert "model.get_submodule('transformer.wte').register_forward_hook(leave_as([Replicate()]))" in src


def _train_corpus(rank: int, world: int, port: int, exp: DTensorExport, name: str, queue) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from sbplab.models import corpus

    warnings.simplefilter("ignore")
    with _gloo_rank(rank, world, port, queue):
        b = corpus.build(name)
        model = b.model
        model.config.use_cache = False  # a training step keeps no KV cache
        mesh = init_device_mesh("cpu", exp.mesh_shape, mesh_dim_names=exp.mesh_dim_names)
        model = exp.apply(model, mesh)
        tied = model.lm_head.weight is model.transformer.wte.weight
        batch = exp.shard_batch(dict(b.inputs), mesh)
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        losses = []
        for _ in range(STEPS):
            opt.zero_grad()
            with exp.running():
                loss = model(**batch).loss
                loss.backward()
            opt.step()
            losses.append((loss.full_tensor() if isinstance(loss, DTensor) else loss).item())
        queue.put((rank, (tied, losses)))


@pytest.mark.multiprocess
def test_exported_gpt2_with_tied_weights_trains_like_torch_on_gloo_ranks():
    pytest.importorskip("transformers")

    b, step, exp = _corpus_export("gpt2", "tp")
    assert exp.mode == "distribute" and "lm_head.weight" not in exp.placements  # one name per tied weight
    ref, _ = b.train_torch(STEPS, lambda ps: torch.optim.SGD(ps, lr=LR))
    got = _on_two_ranks(_train_corpus, exp, "gpt2")
    for rank, (tied, losses) in got.items():
        assert tied, "the LM head no longer shares the embedding's DTensor"
        assert max(abs(a - r) for a, r in zip(losses, ref)) < 1e-5, (rank, losses, ref)
    assert ref[-1] < ref[0]


def _on_two_ranks(target, exp: DTensorExport, name: str) -> dict:
    """``target(rank, 2, port, exp, name, queue)`` on two spawned Gloo ranks: what each put on the queue."""
    from sbplab.runtime.cluster import free_port

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, 2, port, exp, name, queue)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(queue.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return got


def _train_cell(rank: int, world: int, port: int, exp: DTensorExport, name: str, queue) -> None:
    """Any corpus model through the export: 3 SGD steps, then the trained parameters in full (rank 0)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from sbplab.models import corpus

    warnings.simplefilter("ignore")
    with _gloo_rank(rank, world, port, queue):
        b = corpus.build(name)
        model = b.model
        if hasattr(model, "config"):
            model.config.use_cache = False
        mesh = init_device_mesh("cpu", exp.mesh_shape, mesh_dim_names=exp.mesh_dim_names)
        model = exp.apply(model, mesh)
        names = list(exp.input_placements)
        feeds = dict(b.inputs) if isinstance(b.inputs, dict) else dict(zip(names, b.feeds()))
        batch = exp.shard_batch(feeds, mesh)
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        losses = []
        for _ in range(STEPS):
            opt.zero_grad()
            with exp.running():
                if isinstance(b.inputs, dict):
                    loss = model(**batch).loss
                else:
                    args = [batch[n] for n in names]
                    loss = b.loss_fn(model(*args[: len(b.inputs)]), args[-1])
                loss.backward()
            opt.step()
            losses.append((loss.full_tensor() if isinstance(loss, DTensor) else loss).item())
        # numpy arrays travel by value (a tensor would travel as a shared-memory handle this rank takes away)
        params = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().numpy().copy()
                  for n, p in model.named_parameters()}
        queue.put((rank, (losses, params if rank == 0 else None)))


@pytest.mark.multiprocess
@pytest.mark.parametrize("name, strategy", [("llama", "tp"), ("lstm", "dp"), ("mixtral", "dp"), ("resnet", "dp")])
def test_exported_corpus_cell_trains_like_torch(name, strategy):
    """One cell per thing the export adds at module boundaries, on 2 Gloo ranks: Llama under TP (its
    vocabulary-split embedding reduced once where it leaves, and a view's gradient made dense), an LSTM
    (run through local_map on its batch shards: DTensor has no rule for the fused RNN kernel), Mixtral (its
    experts through local_map: DTensor propagates grouped_mm only in bf16). Losses and trained parameters
    equal torch's. ResNet under data parallel: its ReLU modules' inputs redistributed where they enter
(PrepareModuleInput), BatchNorm over the whole batch. The bench (``bench_dtensor_export.py --train``) runs every model and strategy, ResNet's
    included (data parallel: BatchNorm over the whole batch, equal to torch)."""
    if name != "lstm":
        pytest.importorskip("transformers")

    b, step, exp = _corpus_export(name, strategy)
    assert exp.mode == "distribute"
    kinds = {"llama": (1, 0), "lstm": (0, 1), "mixtral": (0, 2), "resnet": (0, 0)}[name]
    assert (len(exp.module_outputs), len(exp.module_maps)) == kinds, exp.summary()
    if name == "resnet":  # each ReLU module slices its replicated input over the batch, as sbplab does
        assert exp.module_inputs and all(m.module.endswith("activation") for m in exp.module_inputs)
    ref, trained = b.train_torch(STEPS, lambda ps: torch.optim.SGD(ps, lr=LR))
    got = _on_two_ranks(_train_cell, exp, name)
    for rank, (losses, _) in got.items():
        assert max(abs(a - r) for a, r in zip(losses, ref)) < 1e-5, (rank, losses, ref)
    params = got[0][1]
    want = dict(trained.named_parameters())
    assert set(params) == set(want)
    worst = max((torch.from_numpy(params[n]) - want[n].detach()).abs().max().item() for n in params)
    assert worst < 1e-5, worst
    assert ref[-1] < ref[0]


def test_resnet_data_parallel_is_not_zero():
    """sbplab reduce-scatters a few small gradients of ResNet's data parallel step (BatchNorm's): that is
    not ZeRO, and the export keeps DTensor placements, under which BatchNorm's statistics cover the whole
    batch as in torch (FSDP's fully_shard would keep them per rank)."""
    pytest.importorskip("transformers")
    _, step, exp = _corpus_export("resnet", "dp")
    split = [p for p in step.graph.params if p in step.graph.grads
             and any(isinstance(x, sl.Split) for x in step.deduction.sbp[step.graph.grads[p]])]
    assert split and all("normalization" in p for p in split)
    assert exp.mode == "distribute" and exp.module_maps == [] and exp.module_outputs == []
    # sbplab slices each ReLU's replicated input over the batch; DTensor would keep it replicated: the
    # export redistributes it where it enters the activation module, and the ReLU then runs as in sbplab
    assert len(exp.module_inputs) == 5, exp.summary()
    for mi in exp.module_inputs:
        assert mi.module.endswith("activation") and [p.kind for p in mi.placements] == ["shard"]
        assert mi.ops == (mi.module + ".relu",)
    assert "register_forward_pre_hook(enter_as(" in exp.code()
    cov = coverage(step)
    assert prepared_by(cov, exp) == 5 and all(v.kind == "redistribute" for v in cov.verdicts if v.op in
                                              {o for mi in exp.module_inputs for o in mi.ops})
    assert as_sbplab(cov, exp) == pytest.approx((cov.kinds["dtensor"] + 5) / cov.total)  # nothing wrapped here
    _, _, exp = _corpus_export("resnet", "dp_tp")  # the batch over both axes: convolutions through local_map
    assert exp.module_maps and all(m.module.endswith("convolution") for m in exp.module_maps)

