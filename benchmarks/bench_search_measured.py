"""Is the searched strategy really as fast as the best preset? Measured on real workers, side by side.

For each zoo model on 2 and 4 Gloo ranks of this machine: ``sl.search`` on a Hardware calibrated on
this cluster (``cluster.calibrate()``; ``--spec`` uses the ``cpu_box`` spec sheet instead), its
finalists measured on the cluster (``measure_on``; ``--simulate-only``: picked by ``sl.simulate``
alone), then the searched strategy and every applicable preset are compiled and run for real, anew. Time per step is what a
user waits for: (wall time of ``cluster.run`` with 1 + N steps - wall time with 1 step) / N, with N
at least ``--steps`` and large enough for about 0.3 s of predicted work (tiny steps need many), rounds
interleaved (searched, preset 1, preset 2, ..., searched, ...). Printed per model: each strategy's
predicted step time (``sl.simulate``), its measured median and spread, and at the end the ratio of the
searched strategy to the best measured preset (goal: <= 1.0, not slower than the best preset). When
the search chose a preset, or a strategy that compiles to a preset's very plan, that preset runs
once, marked ``searched =``, and the ratio is its time over the best measured preset's (1.00 when it
is that preset).

    .venv/bin/python benchmarks/bench_search_measured.py [--rounds 3] [--steps 6] [--ranks 2,4] [--spec]
                                                        [--simulate-only]
"""

from __future__ import annotations

import argparse
import statistics

import torch
from bench_simulator import model as zoo_model  # the same small zoo models (scripts run from benchmarks/)

import sbplab as sl
from sbplab.search.measure import wall_per_step


def bench(kind: str, ranks: int, cluster: sl.LocalCluster, hw: sl.Hardware, rounds: int, steps: int,
          measure: bool) -> float:
    model, xs, y, loss_fn = zoo_model(kind, mlp_width=256)  # xs: the model's inputs (Wide&Deep takes two)
    opt = sl.SGD(lr=0.05)
    res = sl.search(model, xs, loss_fn=loss_fn, target=y, optimizer=opt, devices=ranks, hardware=hw, seed=0,
                    measure_on=cluster if measure else None)
    # a preset the search chose is run once, under its own name: timing it twice would only compare noise
    chosen = next((p for p in res.presets if p is res.best), None)
    entries = [] if chosen else [("searched: " + res.best.describe(), res.strategy)]
    entries += [(("searched = " if p is chosen else "") + p.describe(), p.strategy)
                for p in res.presets if p.step_time < float("inf")]
    compiled = []
    for label, st in entries:
        try:
            step = sl.compile(model, xs, loss_fn=loss_fn, target=y, optimizer=opt, strategy=st, hardware=hw)
        except sl.SbplabError as e:  # a preset that does not fit this model: say so, go on
            print(f"  {label}: not compiled ({type(e).__name__}: {str(e).splitlines()[0][:90]})")
            continue
        compiled.append((label, step, sl.simulate(step, hw).step_time))
    # a searched strategy that compiles to a preset's very plan is that preset: run it once
    first, twin = compiled[0], None
    if first[0].startswith("searched:"):
        twin = next((i for i, (_, step, _) in enumerate(compiled[1:], 1)
                     if step.dump() == first[1].dump() and step.strategy.bucket_mb == first[1].strategy.bucket_mb),
                    None)
    if twin is not None:
        label, step, pred = compiled[twin]
        compiled[twin] = ("searched = " + label, step, pred)
        compiled.pop(0)
    times: dict[str, list[float]] = {label: [] for label, _, _ in compiled}
    # enough steps that the N-step difference is well above the per-run overhead's noise (~0.3 s of work)
    n_steps = {label: max(steps, min(200, int(0.3 / max(pred, 1e-4)))) for label, _, pred in compiled}
    for _ in range(rounds):
        for label, step, _ in compiled:
            times[label].append(wall_per_step(cluster, step, (*xs, y), n_steps[label]))
    print(f"\n{kind} on {ranks} ranks ({hw.name}; search took {res.seconds:.2f} s, method {res.method})")
    print(f"  {'strategy':70s} {'predicted ms':>12} {'measured ms':>12} {'spread ms':>14}")
    for label, _, pred in compiled:
        ts = times[label]
        print(f"  {label[:70]:70s} {pred * 1e3:>12.3f} {statistics.median(ts) * 1e3:>12.3f} "
              f"{min(ts) * 1e3:>6.2f}-{max(ts) * 1e3:<7.2f}")
    searched = statistics.median(next(times[label] for label, _, _ in compiled if label.startswith("searched")))
    best_preset = min(statistics.median(times[label]) for label, _, _ in compiled
                      if not label.startswith("searched:"))
    ratio = searched / best_preset
    print(f"  searched / best measured preset: {ratio:.2f}")
    return ratio


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--models", default="mlp,gpt,cnn,wide_deep")
    ap.add_argument("--spec", action="store_true", help="use the cpu_box spec sheet, no calibration")
    ap.add_argument("--simulate-only", action="store_true",
                    help="the search picks by sl.simulate alone (no measure_on: its finalists are not run)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    ratios = []
    for ranks in (int(r) for r in args.ranks.split(",")):
        with sl.LocalCluster(ranks) as cluster:
            hw = sl.Hardware.cpu_box() if args.spec else cluster.calibrate()
            for kind in args.models.split(","):
                ratios.append((kind, ranks, bench(kind, ranks, cluster, hw, args.rounds, args.steps,
                                                  not args.simulate_only)))
    print("\nsearched / best measured preset: " + ", ".join(f"{k} x{r} {q:.2f}" for k, r, q in ratios))


if __name__ == "__main__":
    main()
