"""What keeping the state costs: a run cut every N steps (``checkpoint_every``), with and without DCP
checkpoints on disk, against the same run in one piece; and ``cluster.save`` / ``cluster.load`` of a
model against ``torch.save`` / ``torch.load`` of the same tensors in this process.

A GPT (0.47 M parameters plus Adam's two moments) under data parallel and ZeRO-3 on 2 Gloo ranks
of this machine, STEPS steps per run; each figure is the best of ROUNDS rounds, the variants of a round
run back to back (the machine is shared and noisy). Ratio = the variant's wall time / the plain run's.
The numbers of every variant are checked equal to the plain run's, to the bit.

    .venv/bin/python benchmarks/bench_checkpoint.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

import sbplab as sl

STEPS, EVERY, ROUNDS = 40, 10, 3


def _best(fn, rounds: int = ROUNDS) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(rounds):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def bench(cluster, tmp: Path, name: str, strategy, model, idx: torch.Tensor, y: torch.Tensor) -> None:
    step = sl.compile(model, (idx,), loss_fn=model.loss_fn, target=y, optimizer=sl.Adam(lr=1e-3), strategy=strategy)
    batch = (idx, y)
    cluster.run(step, batch, steps=2, progress=False)  # warm: workers, process groups, kernels

    def run(**kw):
        return cluster.run(step, batch, steps=STEPS, progress=False, restart=True, **kw)

    plain_s, plain = _best(run)
    cut_s, cut = _best(lambda: run(checkpoint_every=EVERY))
    disk_s, disk = _best(lambda: run(checkpoint_every=EVERY, checkpoint_dir=tmp / name))
    assert plain.losses == cut.losses == disk.losses  # type: ignore[attr-defined]
    save_s, path = _best(lambda: cluster.save(step, tmp / f"{name}-one"))
    again = sl.compile(model, (idx,), loss_fn=model.loss_fn, target=y, optimizer=sl.Adam(lr=1e-3), strategy=strategy)
    load_s, _ = _best(lambda: cluster.load(again, path))
    full = {k: v.full() for k, v in plain.params.items()}  # type: ignore[attr-defined]
    tsave_s, _ = _best(lambda: torch.save(full, tmp / "plain.pt"))
    tload_s, _ = _best(lambda: torch.load(tmp / "plain.pt"))
    print(f"\n{name}:")
    print(f"  one run of {STEPS} steps            {plain_s * 1e3:8.1f} ms")
    print(f"  checkpoint_every={EVERY} (memory)    {cut_s * 1e3:8.1f} ms   ratio {cut_s / plain_s:5.2f}")
    print(f"  checkpoint_every={EVERY} + disk      {disk_s * 1e3:8.1f} ms   ratio {disk_s / plain_s:5.2f}")
    print(f"  cluster.save (DCP, 2 ranks)      {save_s * 1e3:8.1f} ms   torch.save here {tsave_s * 1e3:6.1f} ms")
    print(f"  cluster.load (DCP, 2 ranks)      {load_s * 1e3:8.1f} ms   torch.load here {tload_s * 1e3:6.1f} ms")


def main() -> None:
    torch.manual_seed(0)
    model = sl.models.GPT(sl.models.GPTConfig(n_layer=2, n_embd=128, n_head=4, block_size=32, vocab_size=256))
    (idx,), y = model.example_batch(8)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"GPT {n_params / 1e6:.2f} M parameters, Adam, {STEPS} steps per run, N = {EVERY}, 2 Gloo ranks")
    with sl.LocalCluster(2) as cluster, tempfile.TemporaryDirectory() as tmp:
        for name, strategy in (("dp", sl.presets.data_parallel(2)), ("zero3", sl.presets.zero(2))):
            bench(cluster, Path(tmp), name, strategy, model, idx, y)


if __name__ == "__main__":
    main()
