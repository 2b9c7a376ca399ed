"""What recomputation and mixed precision buy and cost, measured on real workers.

For a GPT on a 2-rank LocalCluster (Gloo) under data parallel and ZeRO-3, each of recompute "none",
"selective", "full", in fp32 and bf16 (``sl.Precision.mixed("bf16")``): the compiled activation peak
(liveness of the physical graph), the peak each rank's runtime measured (``RunResult.memory``, bytes of
the tensors it holds), the compute firings per step, the bytes each rank sent per step, the median step
time, and the loss difference against single-device torch (under ``torch.autocast`` for bf16). Ratios
are against recompute="none" in the same precision. Step times on a shared CPU machine are noisy and
bf16 matmuls on CPU are not faster than fp32: the memory and byte columns are the point.

    .venv/bin/python benchmarks/bench_recompute_precision.py [--layers 4] [--batch 16]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import warnings

import torch

import sbplab as sl
from sbplab.compiler.reference import torch_steps

STEPS = 4


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = sl.models.GPT(sl.models.GPTConfig(n_layer=args.layers))
    (idx,), targets = model.example_batch(args.batch)
    print(f"GPT {args.layers} layers, batch {args.batch}, {STEPS} steps of SGD on 2 ranks "
          f"(load {open('/proc/loadavg').read().split()[0]})")
    print("| preset | precision | recompute | compiled act. peak | measured peak | vs none | compute firings "
          "| bytes sent | ms/step | loss diff |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    with sl.LocalCluster(2) as cluster:
        for preset, base in (("dp", sl.presets.data_parallel(2)), ("zero3", sl.presets.zero(2))):
            for precision in (sl.Precision(), sl.Precision.mixed("bf16")):
                want, _ = torch_steps(model, (idx,), target=targets, loss_fn=model.loss_fn, optimizer=sl.SGD(lr=0.1), steps=STEPS,
                                      precision=precision)
                base_peak = None
                for recompute in ("none", "selective", "full"):
                    strategy = dataclasses.replace(base, precision=precision, recompute=recompute)
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        step = sl.compile(model, (idx,), loss_fn=model.loss_fn, target=targets,
                                          optimizer=sl.SGD(lr=0.1), strategy=strategy)
                    result = cluster.run(step, (idx, targets), steps=STEPS, progress=False)
                    peak = max(m.peak for m in result.memory.values())
                    base_peak = base_peak or peak
                    per_step = [e for e in result.trace.select(rank=0, lane="compute") if e.step == 1]
                    spans = [max(e.end for e in result.trace.events if e.step == s)
                             - min(e.start for e in result.trace.events if e.step == s) for s in range(1, STEPS)]
                    sent = step.physical.comm_bytes_per_rank()[0]
                    diff = max(abs(a - b) for a, b in zip(result.losses, want))
                    print(f"| {preset} | {precision.compute} | {recompute} | "
                          f"{step.memory.ranks[0].activations_peak:,} | {peak:,} | {peak / base_peak:.2f}x | "
                          f"{len(per_step)} | {sent:,} | {statistics.median(spans) / 1e3:.1f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
