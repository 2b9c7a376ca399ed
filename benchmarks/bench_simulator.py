"""How well the simulator predicts real runs: model zoo x strategies on 2 and 4 Gloo ranks.

    .venv/bin/python benchmarks/bench_simulator.py [--steps 30] [--models mlp,gpt,cnn,wide_deep] [--memory-only]

Calibrates the machine first (``cluster.calibrate(steps)``: links, firing overhead, and every
compute op the compiled steps run, cached on disk), then for every (model, strategy): compile,
predict (``sl.simulate``), run for real, and print predicted vs measured step time (median of the
steps after the first) with the error (the simulator predicts the steady state; with a handful of
steps the median still counts the slower first steps of fresh workers, so the default runs 30), and
the predicted peak memory per rank next to the one the run measured (``RunResult.memory``). At the end:
median and max absolute error, and Kendall's tau between predicted and measured step times per model
(does the simulator rank strategies right?).

Then peak memory per rank, predicted (``sl.simulate``) against measured (``RunResult.memory``: on CPU
workers the bytes of the tensors the runtime holds) on the zoo configurations above and on the real-model
corpus (``sbplab.models.corpus``, every model under its strategies), with the median and max error over
every (configuration, rank). ``--memory-only`` runs just that part (no calibration: memory does not need one).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import sbplab as sl
from sbplab.compiler import presets
from sbplab.compiler.lowering.to_actors import lower_to_actors
from sbplab.models import CNN, GPT, MLP, CNNConfig, GPTConfig, MLPConfig, WideDeep, WideDeepConfig, corpus


def model(kind: str, mlp_width: int = 128):
    """A small zoo model, its example batch and loss (the same seeds every time)."""
    torch.manual_seed(0)
    if kind == "mlp":
        m = MLP(MLPConfig(in_dim=64, width=mlp_width, hidden=2 * mlp_width, n_blocks=2, n_classes=10))
        return m, *m.example_batch(64), torch.nn.functional.cross_entropy
    if kind == "gpt":
        m = GPT(GPTConfig(vocab_size=128, block_size=32, n_layer=2, n_head=4, n_embd=64))
        return m, *m.example_batch(16), GPT.loss_fn
    if kind == "wide_deep":
        m = WideDeep(WideDeepConfig(vocab_size=512, n_fields=4, emb_dim=16, n_dense=8, hidden=64))
        return m, *m.example_batch(64), m.loss_fn
    m = CNN(CNNConfig(in_channels=3, image_size=16, channels=(8, 16), n_classes=10))
    return m, *m.example_batch(32), m.loss_fn


CONFIGS = [
    ("mlp", "data 2", lambda: presets.data_parallel(2)),
    ("mlp", "tensor 2", lambda: presets.tensor_parallel(2)),
    ("mlp", "dp_tp 2x2", lambda: presets.dp_tp((2, 2))),
    ("mlp", "zero 4", lambda: presets.zero(4)),
    ("mlp", "pipeline 2, M=2", lambda: presets.pipeline(2, 2)),
    ("mlp", "pipeline 2, M=4", lambda: presets.pipeline(2, 4)),
    ("gpt", "data 2", lambda: presets.data_parallel(2)),
    ("gpt", "tensor 2", lambda: presets.tensor_parallel(2)),
    ("gpt", "dp_tp 2x2", lambda: presets.dp_tp((2, 2))),
    ("gpt", "pipeline 2, M=2", lambda: presets.pipeline(2, 2)),
    ("gpt", "pipeline 2, M=4", lambda: presets.pipeline(2, 4)),
    ("cnn", "data 2", lambda: presets.data_parallel(2)),
    ("cnn", "data 4", lambda: presets.data_parallel(4)),
    ("wide_deep", "data 2", lambda: presets.data_parallel(2)),
    ("wide_deep", "tensor 2", lambda: presets.tensor_parallel(2)),
]


def _memory_row(cluster, label: str, step, feeds, hw) -> list[float]:
    """Run ``step`` 2 steps, print predicted vs measured peak per rank; the relative errors."""
    res = cluster.run(step, feeds, steps=2, progress=False)
    pred = sl.simulate(step, hw)
    errs = []
    for r in sorted(set(res.memory) & set(pred.peak_memory)):  # the step's ranks (a 4-rank cluster runs 2-rank ones)
        p, m = pred.peak_memory[r], res.memory[r].peak
        errs.append(p / m - 1)
        print(f"  {label:28s} rank {r}: predicted {p / 2**20:8.3f} MiB  measured {m / 2**20:8.3f} MiB  "
              f"error {p / m - 1:+6.1%}", flush=True)
    return errs


def memory(zoo: list, corpus_models: list[str]) -> None:
    """Predicted vs measured peak memory per rank on the zoo and the real-model corpus (CPU workers)."""
    import warnings

    hw = sl.Hardware.cpu_box()
    errs: list[float] = []
    print("\npeak memory per rank: sl.simulate against the run (RunResult.memory), 2 steps on CPU workers")
    with sl.LocalCluster(4) as cluster:
        for kind, label, strategy in zoo:
            m, xs, y, loss_fn = model(kind)
            c = sl.compile(m, xs, loss_fn=loss_fn, target=y, optimizer=sl.SGD(lr=0.01, momentum=0.9),
                           strategy=strategy())
            errs += _memory_row(cluster, f"{kind} {label}", c, (*xs, y), hw)
        for name in corpus_models:
            for sname, make in corpus.strategies().items():
                built = corpus.build(name)
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        c = sl.compile(built.model, built.inputs, loss_fn=built.loss_fn, target=built.target,
                                       optimizer=sl.SGD(lr=0.01, momentum=0.9), strategy=make())
                    errs += _memory_row(cluster, f"{name} {sname}", c, built.feeds(), hw)
                except sl.SbplabError as e:
                    print(f"  {name} {sname}: skipped: {str(e).splitlines()[0][:80]}")
    a = sorted(abs(e) for e in errs)
    print(f"\n{len(errs)} (configuration, rank) pairs: median |error| {statistics.median(a):.1%}, "
          f"max {a[-1]:.1%}, within 10%: {sum(e <= 0.10 for e in a)} of {len(a)}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--models", default="mlp,gpt,cnn,wide_deep", help="comma-separated subset")
    ap.add_argument("--corpus", default=",".join(corpus.MODELS), help="real models for the memory part ('' none)")
    ap.add_argument("--memory-only", action="store_true", help="only the predicted vs measured memory part")
    args = ap.parse_args()
    wanted = set(args.models.split(","))
    zoo = [c for c in CONFIGS if c[0] in wanted]
    if args.memory_only:
        memory(zoo, [m for m in args.corpus.split(",") if m])
        return
    rows = []
    compiled = []
    for kind, label, strategy in [c for c in CONFIGS if c[0] in wanted]:
        m, xs, y, loss_fn = model(kind)
        c = sl.compile(m, xs, loss_fn=loss_fn, target=y, optimizer=sl.SGD(lr=0.01, momentum=0.9),
                       strategy=strategy())
        compiled.append((kind, label, c, xs, y))
    with sl.LocalCluster(4) as cluster:
        t0 = time.perf_counter()
        # links, overhead and every op these steps run, measured now (a cached calibration may come from a
        # busier moment of this shared machine)
        hw = cluster.calibrate([c for _, _, c, _, _ in compiled], refresh=True)
        print(f"calibrated in {time.perf_counter() - t0:.1f} s: {hw}")
        for kind, label, c, xs, y in compiled:
            plan = lower_to_actors(c.physical, c.graph, world_size=4, name=f"{kind} {label}")
            feeds = dict(zip(c.graph.inputs, list(xs) + [y]))
            pred = sl.simulate(plan, hw, feeds=feeds)
            res = cluster.run(plan, feeds, steps=args.steps, progress=False)
            later = sorted(res.step_times[1:])
            meas = later[len(later) // 2]
            ranks = sorted(c.memory.ranks)
            rows.append((kind, label, pred.step_time, meas, max(pred.peak_memory[r] for r in ranks),
                         max(res.memory[r].peak for r in ranks), pred.measured_fraction))
            r = rows[-1]
            print(f"{kind:9s} {label:16s} predicted {r[2] * 1e3:8.2f} ms  measured {r[3] * 1e3:8.2f} ms  "
                  f"error {r[2] / r[3] - 1:+6.0%}   peak MB/rank: simulated {r[4] / 2**20:6.2f}, "
                  f"measured {r[5] / 2**20:6.2f}   measured op times {r[6]:.0%}", flush=True)
    from scipy.stats import kendalltau  # the benchmark's one extra dependency: pip install scipy

    errs = [abs(r[2] / r[3] - 1) for r in rows]
    print(f"\n{len(rows)} configurations: median |error| {statistics.median(errs):.0%}, max {max(errs):.0%}")
    for kind in sorted({r[0] for r in rows}):
        mine = [r for r in rows if r[0] == kind]
        if len(mine) >= 2:
            tau = kendalltau([r[2] for r in mine], [r[3] for r in mine]).statistic
            print(f"Kendall's tau {kind:9s} ({len(mine)} strategies): {tau:+.2f}")
    memory(zoo, [m for m in args.corpus.split(",") if m])


if __name__ == "__main__":
    main()
