"""StrategyEditor responsiveness: after an SBP change on a 12-layer GPT, how long until the physical
graph, memory and communication summary are recomputed. Goal: under 300 ms (printed, not asserted).

An "SBP change" is what a click in the editor does: pick another signature for one op, or switch the
preset. Each change runs deduction, lowering, the memory report, the tables and the physical graph
(DOT text, and SVG through graphviz's ``dot`` where it exists); tracing and autodiff are cached.

- *new signature*: each change forces a GELU of another block to another signature, a layout the
  editor has not seen before (so nothing is answered by a cache of whole results).
- *back and forth*: one GELU cycles through three signatures, layouts seen before.
- *preset*: DP x4 <-> DP x TP 2x2.

The breakdown per stage comes from the editor's own ``timings_ms`` ("shown": until everything but
the graph picture is on the page, where the editor draws the picture last). ``--against DIR`` runs
this same benchmark on the sbplab source tree in DIR (another checkout, say the last release) in a
child process first and prints both side by side.

    .venv/bin/python benchmarks/bench_strategy_editor.py [--layers 12] [--changes 8] [--profile]
    .venv/bin/python benchmarks/bench_strategy_editor.py --against /path/to/old/checkout
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path

KEYS = ["wall", "cpu", "shown", "total", "deduce", "lower", "memory", "tables", "graph", "svg", "ops", "gc",
        "full gc"]


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


def timed(editor, change, clock: GcClock) -> dict:
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


def stat(runs: list[dict], f=statistics.median) -> dict[str, float]:
    return {k: f(r[k] for r in runs) for k in KEYS if all(k in r for r in runs)}


def show(title: str, runs: list[dict]) -> None:
    """Median and mean: a full garbage collection every few changes shows in the mean, not the median."""
    print(f"\n{title} ({len(runs)} changes), ms: median, mean [min .. max]")
    for k in KEYS:
        if all(k in r for r in runs):
            vals = [r[k] for r in runs]
            print(f"  {k:8s} {statistics.median(vals):8.1f} {statistics.mean(vals):8.1f}  "
                  f"[{min(vals):7.1f} .. {max(vals):7.1f}]")


def run(args: argparse.Namespace) -> dict:
    """Every section's runs, and what was measured on."""
    from sbplab.viz.dot import dot_available
    from sbplab.widgets import ModelBuilder, StrategyEditor

    clock = GcClock()
    t0 = time.perf_counter()
    builder = ModelBuilder("gpt", n_layer=args.layers)
    t1 = time.perf_counter()
    editor = StrategyEditor(builder, preset="dp_tp", mesh=args.mesh)
    t2 = time.perf_counter()
    if editor.error:
        raise SystemExit(editor.error)
    c = editor.compiled
    info = {"model": f"GPT {args.layers} layers, {c.strategy.name}: {len(c.graph.ops)} logical ops, "
                     f"{len(c.physical.nodes)} physical nodes, {len(c.physical.collectives)} collectives; graphviz "
                     f"dot {'found' if dot_available() else 'NOT found (text only)'}",
            "build": (t1 - t0) * 1e3, "first": (t2 - t1) * 1e3}
    gelus = [o.name for o in c.graph.ops if o.phase == "forward" and o.type == "gelu"]
    options = {}
    for op in gelus:
        editor.selected_op = op
        options[op] = [x["signature"] for x in editor.candidates[:3]]
    editor.selected_op = ""
    mid = gelus[len(gelus) // 2]
    sigs = options[mid]

    # new layouts: block k's GELU takes its 2nd or 3rd signature, each (block, signature) once
    fresh = [(op, options[op][1 + (i // len(gelus)) % 2]) for i, op in enumerate(gelus * 2) if op != mid]
    warm = [timed(editor, lambda: editor.choose(mid, sigs[1]), clock)]  # boxing plans for this model
    new = [timed(editor, lambda op=op, s=s: setattr(editor, "choices", {op: s}), clock)
           for op, s in fresh[:args.changes]]
    back = [timed(editor, lambda i=i: setattr(editor, "choices", {mid: sigs[i % 3]}), clock)
            for i in range(args.changes)]
    objects = len(gc.get_objects())
    presets = [timed(editor, lambda p=p, m=m: editor.configure(preset=p, mesh_text=m, choices={}), clock)
               for p, m in [("dp", "4"), ("dp_tp", args.mesh)] * max(1, args.changes // 2)]
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        editor.choices = {fresh[-1][0]: fresh[-1][1]}
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(20)
        print(buf.getvalue())
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    info.update(objects=objects, load=load, warm=warm[0]["wall"], source=str(Path(sys.modules["sbplab"].__file__).parent))
    return {"info": info, "sections": {"new signature": new, "back and forth": back, "preset": presets}}


def report(res: dict, title: str = "") -> None:
    info = res["info"]
    print(f"{title}{info['model']}\n  sbplab from {info['source']}")
    print(f"  build + trace the model: {info['build']:.0f} ms; first compile in the editor (trace per micro-batch, "
          f"autodiff, cold caches): {info['first']:.0f} ms; first signature change {info['warm']:.0f} ms")
    for name, runs in res["sections"].items():
        show(name, runs)
    print(f"\n  live objects the collector walks on a full pass: {info['objects']:,}; load average {info['load']:.1f}")


def side_by_side(before: dict, after: dict) -> None:
    print("\nms, before -> after (same script, same machine, one after the other)")
    print(f"  {'':16s}{'':9s}" + "".join(f"{k:>12s}" for k in ("median", "", "", "mean", "", "")))
    print(f"  {'':16s}{'':9s}" + "".join(f"{k:>12s}" for k in ("before", "after", "ratio") * 2))

    def cells(x: float | None, y: float | None) -> str:
        ratio = f"{y / x:.2f}" if x and y is not None else "-"
        return "".join(f"{v:>12s}" for v in (f"{x:.1f}" if x is not None else "-",
                                             f"{y:.1f}" if y is not None else "-", ratio))

    for name in after["sections"]:
        b, a = before["sections"][name], after["sections"][name]
        bm, am, bmean, amean = stat(b), stat(a), stat(b, statistics.mean), stat(a, statistics.mean)
        for k in KEYS:
            if k in am or k in bm:
                print(f"  {name if k == 'wall' else '':16s}{k:9s}" + cells(bm.get(k), am.get(k))
                      + cells(bmean.get(k), amean.get(k)))
    print(f"  load average: before {before['info']['load']:.1f}, after {after['info']['load']:.1f} "
          f"(wall times grow with load; cpu does not); {os.cpu_count()} cores")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--mesh", default="2,2", help="dp, tp")
    ap.add_argument("--changes", type=int, default=8)
    ap.add_argument("--profile", action="store_true", help="cProfile one change and print the top functions")
    ap.add_argument("--against", metavar="DIR", help="also run on the sbplab source tree in DIR, first")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # for --against's child process
    args = ap.parse_args()
    if args.json:
        print(json.dumps(run(args)))
        return
    before = None
    if args.against:
        src = Path(args.against).resolve()
        if not (src / "sbplab" / "__init__.py").exists():
            raise SystemExit(f"--against {args.against}: no sbplab package there (expected {src}/sbplab)")
        cmd = [sys.executable, __file__, "--json", "--layers", str(args.layers), "--mesh", args.mesh,
               "--changes", str(args.changes)]
        env = {**os.environ, "PYTHONPATH": str(src)}
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=src)
        if out.returncode:
            raise SystemExit(f"the run on {src} failed:\n{out.stderr[-3000:]}")
        before = json.loads(out.stdout.strip().splitlines()[-1])
        report(before, "BEFORE: ")
        print()
    after = run(args)
    report(after, "AFTER: " if before else "")
    new = stat(after["sections"]["new signature"])
    mean = stat(after["sections"]["new signature"], statistics.mean)
    print(f"\nresponsiveness: {new['wall']:.0f} ms median after a signature change (goal < 300 ms; mean "
          f"{mean['wall']:.0f} ms), {new['cpu']:.0f} ms of CPU" +
          (f"; the numbers are on the page after {new['shown']:.0f} ms, the graph picture follows"
           if "shown" in new else ""))
    if before:
        side_by_side(before, after)


if __name__ == "__main__":
    main()
