"""Eager dispatch overhead: time of ``sl.apply`` minus the time of its local kernels.

Goal: < 100 us per op after warm-up (the signature decision is cached; what remains is the
per-call bookkeeping). Both sides are measured in the same run, interleaved, on the same shards.
"""

from __future__ import annotations

import statistics
import time

import torch

import sbplab as sl


def _median_us(fn, repeat: int = 2000) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def bench(mesh: sl.Placement, op: str, make_inputs, fn) -> None:
    """``fn``: the torch function of the shards, the kernels' share of one call (each rank's shards are
    read as they are, as the signature that keeps the inputs' SBP does)."""
    xs = make_inputs(mesh)
    sl.apply(op, xs)  # warm the decision cache (and, for a traced name, its trace)

    def raw():
        for r in mesh.rank_list:
            fn(*[x.shards[r] for x in xs])

    t_raw = _median_us(raw)
    t_all = _median_us(lambda: sl.apply(op, xs))
    t_raw2 = _median_us(raw)
    kern = min(t_raw, t_raw2)
    print(f"{op:>8} on mesh {str(mesh.shape):>9}: apply {t_all:7.1f} us, kernels {kern:6.1f} us, "
          f"dispatch overhead {t_all - kern:6.1f} us (goal < 100 us)")


def main() -> None:
    torch.manual_seed(0)
    for mesh in (sl.Placement("cpu", 4), sl.Placement("cpu", [[0, 1], [2, 3]]),
                 sl.Placement("cpu", [[[0, 1], [2, 3]], [[4, 5], [6, 7]]])):
        nd = ", ".join(["S(0)"] + ["B"] * (mesh.ndim - 1))
        rep = ", ".join(["B"] * mesh.ndim)
        bench(mesh, "add", lambda m, nd=nd: [sl.tensor(torch.randn(16, 16), placement=m, sbp=nd),
                                              sl.tensor(torch.randn(16, 16), placement=m, sbp=nd)], torch.add)
        bench(mesh, "matmul", lambda m, nd=nd, rep=rep: [sl.tensor(torch.randn(16, 16), placement=m, sbp=nd),
                                                          sl.tensor(torch.randn(16, 8), placement=m, sbp=rep)],
              torch.matmul)
        # a traced torch function: F.linear is two ATen ops (t, addmm), each dispatched
        bench(mesh, "linear", lambda m, nd=nd, rep=rep: [sl.tensor(torch.randn(16, 16), placement=m, sbp=nd),
                                                          sl.tensor(torch.randn(8, 16), placement=m, sbp=rep),
                                                          sl.tensor(torch.randn(8), placement=m, sbp=rep)],
              torch.nn.functional.linear)


if __name__ == "__main__":
    main()
