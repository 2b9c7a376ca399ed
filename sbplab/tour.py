"""A guided tour of SBP in one screen: ``python -m sbplab.tour``.

A 2x2 mesh, a tensor split on both mesh axes, its local shapes, a matmul and the signature it
picked (and why), a P -> B change with its steps and bytes, and every full value checked against
plain torch.
"""

from __future__ import annotations

import torch

import sbplab as sl


def _check(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    ok = torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    print(f"  check {name}: {'matches torch' if ok else 'MISMATCH'} (max |diff| {(got - want).abs().max():.2e})")
    if not ok:
        raise SystemExit(f"{name} does not match plain torch")


def main() -> None:
    torch.manual_seed(0)
    mesh = sl.Placement("cpu", [[0, 1], [2, 3]], axis_names=("dp", "tp"))
    print(f"1. A mesh: {mesh}\n")

    a_full = torch.randn(8, 6)
    a = sl.tensor(a_full, placement=mesh, sbp="S(0), S(1)", name="a")
    print("2. A tensor with (S(0), S(1)): rows split over dp, columns over tp")
    print(f"  {a}")
    for r, shp in a.local_shapes.items():
        print(f"  rank {r} at {mesh.coords(r)} holds rows/cols {sl.local_block(a.shape, mesh, a.sbp, r)} "
              f"-> local shape {shp}")
    _check("a", a.full(), a_full)

    w_full = torch.randn(6, 4)
    w = sl.tensor(w_full, placement=mesh, sbp="B, S(0)", name="w")
    print(f"\n3. A weight {w.type_str()} with (B, S(0)); y = a @ w picks its signature:")
    y = a @ w
    print(sl.explain(y))
    _check("y = a @ w", y.full(), a_full @ w_full)

    print(f"\n4. y is {sl.fmt_sbp(y.sbp)}: the tp axis holds partial sums. Make it broadcast:")
    yb = y.to_global(sbp="S(0), B")
    print(sl.explain(yb))
    _check("y as (S(0), B)", yb.full(), a_full @ w_full)

    plan = sl.plan_boxing((8, 4), "P", "B", sl.Placement("cpu", [0, 1, 2, 3]))
    print("\n5. The same P -> B on a 1-D mesh of 4 ranks, alone:")
    print(plan.describe())

    print("\n6. Everything in one log, counted like DTensor's CommDebugMode:")
    with sl.explain_log() as log:
        h = (a @ w).relu()
        z = h.sum(dim=1)
    print(f"  steps by kind: {log.collectives()}, bytes moved: {log.total_bytes}")
    _check("relu(a @ w).sum(1)", z.full(), torch.relu(a_full @ w_full).sum(1))


if __name__ == "__main__":
    main()
