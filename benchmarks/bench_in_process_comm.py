"""What running the boxing through the in-process communicator costs the in-process executor.

The ``LocalExecutor`` posts every collective with the kinds' own code on ``InProcessCommunicator``s
(the same ``start``/``launch`` the workers run on Gloo or NCCL). The alternative it replaced computed
each group's result directly from the shards (``StepKind.apply``). This prints, for a small GPT under
data x tensor parallel on 2x2 ranks, the time per training step spent in collective boxing steps both
ways (alternating rounds, medians), and the whole step for scale.

    .venv/bin/python benchmarks/bench_in_process_comm.py
"""

from __future__ import annotations

import statistics
import time

from sbplab.boxing.kinds.collective_kind import CollectiveKind
from sbplab.boxing.kinds.kind_base import StepKind
from sbplab.compiler import SGD, compile, presets
from sbplab.models import GPT, GPTConfig


def main(rounds: int = 5, steps: int = 3) -> None:
    m = GPT(GPTConfig(n_layer=2))
    xs, y = m.example_batch(8)
    c = compile(m, xs, loss_fn=m.loss_fn, target=y, optimizer=SGD(lr=0.1), strategy=presets.dp_tp((2, 2)))
    feeds = dict(zip(c.graph.inputs, [*xs, y]))
    via_comm = CollectiveKind.run_in_process

    def direct(self, step, shards, shape, world=None):
        return StepKind.run_in_process(self, step, shards, shape)

    boxing: dict[str, list[float]] = {"communicator": [], "direct (apply)": []}
    whole: dict[str, list[float]] = {k: [] for k in boxing}
    for _ in range(rounds):
        for label, fn in (("communicator", via_comm), ("direct (apply)", direct)):
            spent = [0.0]

            def timed(self, *a, fn=fn, spent=spent, **k):
                t = time.perf_counter()
                out = fn(self, *a, **k)
                spent[0] += time.perf_counter() - t
                return out

            CollectiveKind.run_in_process = timed
            ex = c.executor()
            ex.step(feeds)
            spent[0] = 0.0
            t0 = time.perf_counter()
            for _ in range(steps):
                ex.step(feeds)
            whole[label].append((time.perf_counter() - t0) / steps)
            boxing[label].append(spent[0] / steps)
    CollectiveKind.run_in_process = via_comm
    n = sum(1 for u in c.physical.collectives)
    print(f"GPT n_layer=2, dp_tp((2, 2)), {n} collective groups per step, medians of {rounds} rounds x {steps} steps")
    print(f"{'':18s} {'boxing ms/step':>15s} {'step ms':>9s}")
    for label in boxing:
        print(f"{label:18s} {1e3 * statistics.median(boxing[label]):15.1f} {1e3 * statistics.median(whole[label]):9.1f}")
    ratio = statistics.median(boxing["communicator"]) / statistics.median(boxing["direct (apply)"])
    print(f"communicator / direct, boxing only: {ratio:.2f}x")


if __name__ == "__main__":
    main()
