"""The CUDA/NCCL paths, run where a GPU is: every preset trains like torch on ``LocalCluster(n, "cuda")``.

Skipped on machines without CUDA (CI, this project's development machines); ``benchmarks/gpu_check.py``
runs this file first on a GPU machine. With one GPU the runs have one rank: NCCL, CUDA streams and the
CUDA kernels still run, but no collective crosses devices; with two or more, every preset below runs
over NCCL between GPUs.
"""

from __future__ import annotations

import pytest
import torch

import sbplab as sl
from sbplab.compiler.reference import torch_steps

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.multiprocess,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

STEPS = 3
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
RANKS = min(GPUS, 4) or 1


def _mlp(blocks: int = 1):
    torch.manual_seed(0)
    m = sl.models.MLP(sl.models.MLPConfig(in_dim=16, width=32, hidden=64, n_blocks=blocks, n_classes=4))
    (x,), y = m.example_batch(16)
    return m, x, y


PRESETS = {
    "dp": lambda n: sl.presets.data_parallel(n),
    "zero3": lambda n: sl.presets.zero(n, shard_params=True),
    "tp": lambda n: sl.presets.tensor_parallel(n),
    "pipeline": lambda n: sl.presets.pipeline(n, 2),
}


@pytest.fixture(scope="module")
def cuda_cluster():
    with sl.LocalCluster(RANKS, "cuda") as cluster:
        yield cluster


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_trains_like_torch_over_nccl(cuda_cluster, name):
    m, x, y = _mlp(blocks=max(1, RANKS - 1))
    ref, _ = torch_steps(m, (x,), target=y, loss_fn=m.loss_fn, optimizer=sl.SGD(lr=0.1), steps=STEPS)
    step = sl.compile(m, (x,), loss_fn=m.loss_fn, target=y, optimizer=sl.SGD(lr=0.1),
                      strategy=PRESETS[name](RANKS), device="cuda")
    assert step.plan().device_type == "cuda"
    res = cuda_cluster.run(step, (x, y), steps=STEPS)
    # fp32 on the GPU: cuBLAS sums in another order than the CPU reference
    assert res.losses == pytest.approx(ref, rel=1e-4, abs=1e-5)


def test_one_device_free_strategy_runs_on_cpu_and_cuda_alike(cuda_cluster):
    m, x, y = _mlp()
    strategy = sl.presets.data_parallel(RANKS)
    step = sl.compile(m, (x,), loss_fn=m.loss_fn, target=y, optimizer=sl.SGD(lr=0.1), strategy=strategy)
    on_cuda = cuda_cluster.run(step, (x, y), steps=STEPS).losses
    with sl.LocalCluster(RANKS) as cpu:
        on_cpu = cpu.run(step, (x, y), steps=STEPS).losses
    assert on_cuda == pytest.approx(on_cpu, rel=1e-4, abs=1e-5)
