"""Real models nobody here wrote, captured at ATen level, compiled, run and searched.

For every model of ``sbplab.models.corpus`` (transformers GPT-2, Llama, BERT, ViT, ResNet, Mixtral,
built from small configs; a nanoGPT-style model; an LSTM) and every strategy, prints: whether it
captured, the capture and compile time, whether 3 steps ran on real workers (a 4-rank LocalCluster,
Gloo) with the largest loss difference against plain single-device torch, the step time there, and
(once per model) the time of ``sl.search`` on 8 x H100 and the strategy it picked.

    .venv/bin/python benchmarks/bench_models.py [--models gpt2,llama] [--strategies dp,zero3] [--no-search]
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

import torch

import sbplab as sl
from sbplab.compiler.api import compile_training_graph
from sbplab.compiler.training.training_graph import aten_training_graph
from sbplab.models import corpus

STRATEGIES = corpus.strategies()
STEPS, LR = 3, 0.05


def _row(cluster, name: str, strategy: str) -> str:
    built = corpus.build(name)
    st = STRATEGIES[strategy]()
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", sl.ReplicatedOpWarning)
            g = aten_training_graph(built.model, built.inputs, built.loss_fn, built.target, st.micro_batches,
                                    sl.SGD(lr=LR, momentum=0.9))
    except sl.SbplabError as e:
        return f"| {name} | {strategy} | no: {str(e).splitlines()[0][:60]} | | | | | |"
    t1 = time.perf_counter()
    step = compile_training_graph(g, st)
    t2 = time.perf_counter()
    try:
        result = cluster.run(step, built.feeds(), steps=STEPS)
    except sl.SbplabError as e:
        return (f"| {name} | {strategy} | yes | {t1 - t0:.2f} | {t2 - t1:.2f} | no: {str(e).splitlines()[0][:60]} "
                f"| | |")
    want, _ = built.train_torch(STEPS, lambda ps: torch.optim.SGD(ps, lr=LR, momentum=0.9), st.micro_batches)
    diff = max(abs(a - b) for a, b in zip(result.losses, want))
    times = sorted(result.step_times)
    ms = 1e3 * times[len(times) // 2] if times else float("nan")
    return (f"| {name} | {strategy} | yes | {t1 - t0:.2f} | {t2 - t1:.2f} | yes | {diff:.1e} | {ms:.1f} | "
            f"{len(g.ops)} ops, {len(step.physical.collectives)} collectives |")


def _search(name: str) -> str:
    built = corpus.build(name)
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = sl.search(built.model, built.inputs, loss_fn=built.loss_fn, target=built.target, devices=8,
                            hardware=sl.Hardware.h100_node(), method="auto", time_budget=60)
    except Exception as e:  # noqa: BLE001  (the table says what failed)
        return f"| {name} | failed: {type(e).__name__}: {str(e).splitlines()[0][:80]} | {time.perf_counter() - t0:.1f} |"
    return f"| {name} | {res.strategy.name} | {time.perf_counter() - t0:.1f} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(corpus.MODELS))
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--no-search", action="store_true")
    args = ap.parse_args()
    models, strategies = args.models.split(","), args.strategies.split(",")
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; "
          f"{STEPS} steps of SGD(momentum 0.9) on a 4-rank LocalCluster (Gloo), batch 4")
    print("| model | strategy | captured | capture s | compile s | ran | max loss diff vs torch | ms/step | graph |")
    print("|---|---|---|---|---|---|---|---|---|")
    with sl.LocalCluster(4) as cluster:
        for name in models:
            for s in strategies:
                print(_row(cluster, name, s), flush=True)
    if args.no_search:
        return
    print("\nsl.search on 8 x H100 (Hardware.h100_node(), method auto, time_budget 60 s)")
    print("| model | picked | search s |")
    print("|---|---|---|")
    for name in models:
        print(_search(name), flush=True)


if __name__ == "__main__":
    main()
