"""StrategyEditor responsiveness: after an SBP change on a 12-layer GPT, how long until the physical
graph, memory and communication summary are recomputed. Goal: under 300 ms (printed, not asserted).

An "SBP change" is what a click in the editor does: pick another signature for one op (a GELU in
the middle block), or switch the preset. Each change runs deduction, lowering, the memory report,
the tables and the physical graph (DOT text, and SVG through graphviz's ``dot`` where it exists);
tracing and autodiff are cached. The breakdown per stage comes from the editor's own ``timings_ms``,
and a cProfile of one change says which functions the time goes to.

    .venv/bin/python benchmarks/bench_strategy_editor.py [--layers 12] [--changes 8] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import statistics
import time

from sbplab.viz.dot import dot_available
from sbplab.widgets import ModelBuilder, StrategyEditor


class GcClock:
    """Time Python's cyclic garbage collector spends, per generation (a gc.callbacks hook)."""

    def __init__(self) -> None:
        self.ms = [0.0, 0.0, 0.0]
        self.count = [0, 0, 0]
        self._t = 0.0
        gc.callbacks.append(self)

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.ms[info["generation"]] += (time.perf_counter() - self._t) * 1e3
            self.count[info["generation"]] += 1

    def total(self) -> tuple[float, int]:
        return sum(self.ms), self.count[2]


def cpu_s() -> float:
    """CPU seconds of this process and its finished children (graphviz's dot): unlike wall time, not
    inflated when other programs share the cores."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def timed(editor: StrategyEditor, change, clock: GcClock) -> dict:
    """Wall and CPU time of one change, the editor's own breakdown, and the collector's share."""
    gc_ms, full = clock.total()
    c0, t0 = cpu_s(), time.perf_counter()
    change()
    wall = (time.perf_counter() - t0) * 1e3
    cpu = (cpu_s() - c0) * 1e3
    if editor.error:
        raise SystemExit(f"the change failed: {editor.error}")
    gc_after, full_after = clock.total()
    return {**editor.timings_ms, "wall": wall, "cpu": cpu, "gc": gc_after - gc_ms, "full gc": full_after - full}


def timed_changes(editor: StrategyEditor, op: str, sigs: list[str], n: int, clock: GcClock) -> list[dict]:
    return [timed(editor, lambda i=i: editor.choose(op, sigs[i % len(sigs)]), clock) for i in range(n)]


def show(title: str, runs: list[dict[str, float]]) -> None:
    keys = ["wall", "cpu", "total", "deduce", "lower", "memory", "tables", "graph", "ops", "gc", "full gc"]
    print(f"\n{title} ({len(runs)} changes), ms: median [min .. max]")
    for k in keys:
        vals = [r.get(k, 0.0) for r in runs]
        print(f"  {k:8s} {statistics.median(vals):8.1f}  [{min(vals):7.1f} .. {max(vals):7.1f}]")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--mesh", default="2,2", help="dp, tp")
    ap.add_argument("--changes", type=int, default=8)
    ap.add_argument("--profile", action="store_true", help="cProfile one change and print the top functions")
    args = ap.parse_args()
    clock = GcClock()

    t0 = time.perf_counter()
    builder = ModelBuilder("gpt", n_layer=args.layers)
    t1 = time.perf_counter()
    editor = StrategyEditor(builder, preset="dp_tp", mesh=args.mesh)
    t2 = time.perf_counter()
    if editor.error:
        raise SystemExit(editor.error)
    c = editor.compiled
    print(f"GPT {args.layers} layers, {c.strategy.name}: {len(c.graph.ops)} logical ops, "
          f"{len(c.physical.nodes)} physical nodes, {len(c.physical.collectives)} collectives; "
          f"graphviz dot {'found' if dot_available() else 'NOT found (text only)'}")
    print(f"build + trace the model: {(t1 - t0) * 1e3:.0f} ms; first compile in the editor "
          f"(trace per micro-batch, autodiff, cold caches): {(t2 - t1) * 1e3:.0f} ms")

    mid = args.layers // 2
    op = next(o.name for o in c.graph.ops if o.phase == "forward" and o.type == "gelu"
              and o.module.startswith(f"blocks.{mid}."))
    editor.selected_op = op
    sigs = [x["signature"] for x in editor.candidates[:3]]
    print(f"changing the signature of {op!r} among {sigs}")
    warm = timed_changes(editor, op, sigs, 2, clock)  # first changes fill the boxing and signature caches
    runs = timed_changes(editor, op, sigs, args.changes, clock)
    show("signature change", runs)
    print(f"  live objects the collector walks on a full pass: {len(gc.get_objects()):,}")

    preset_runs = [timed(editor, lambda p=p, m=m: editor.configure(preset=p, mesh_text=m), clock)
                   for p, m in [("dp", "4"), ("dp_tp", args.mesh)] * max(1, args.changes // 2)]
    show("preset change (DP x4 <-> DP x TP)", preset_runs)

    # the same changes with everything built so far moved out of the collector's sight
    gc.freeze()
    frozen = timed_changes(editor, op, sigs, args.changes, clock)
    gc.unfreeze()
    show("signature change after gc.freeze() (the collector skips the objects alive before)", frozen)

    med = statistics.median(r["wall"] for r in runs)
    no_full = [r["wall"] for r in runs if not r["full gc"]]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\nmachine: {os.cpu_count()} cores, load average {load:.1f} (wall times grow with load; cpu does not)")
    print(f"responsiveness: {med:.0f} ms median after a signature change (goal < 300 ms), "
          f"{statistics.median(r['cpu'] for r in runs):.0f} ms of CPU; "
          f"{statistics.median(no_full) if no_full else float('nan'):.0f} ms median of the changes without a "
          f"full garbage collection; {statistics.median(r['wall'] for r in frozen):.0f} ms after gc.freeze(); "
          f"first two changes " + ", ".join(f"{r['wall']:.0f}" for r in warm) + " ms")
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        editor.choose(op, sigs[0] if editor.choices.get(op) != sigs[0] else sigs[1])
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(20)
        print(buf.getvalue())


if __name__ == "__main__":
    main()
