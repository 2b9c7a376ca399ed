"""One rank of ``sbplab.order_demo``, run as a script (``python order_demo_worker.py RANK CASE PORT TIMEOUT``)
so that it imports torch alone, not the sbplab package: two ranks start in a third of the time.
Prints one JSON line: {"rank", "values", "error", "seconds"}."""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta


def values(rank: int) -> dict[str, list[float]]:
    """Rank r holds a = [1, 2] * (r + 1) and b = [10, 20] * (r + 1): sums are a = [3, 6], b = [30, 60]."""
    return {"a": [1.0 * (rank + 1), 2.0 * (rank + 1)], "b": [10.0 * (rank + 1), 20.0 * (rank + 1)]}


def main(rank: int, case: str, port: int, timeout_s: float) -> dict:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    out: dict = {"rank": rank, "values": {}, "error": "", "seconds": 0.0}
    t0 = time.perf_counter()
    try:
        dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=timeout_s))
        t0 = time.perf_counter()
        ts = {k: torch.tensor(v) for k, v in values(rank).items()}
        if case == "deadlock":
            if rank == 0:
                dist.all_reduce(ts["a"])  # waits for rank 1's first collective...
                dist.send(ts["b"], dst=1)
            else:
                dist.recv(ts["b"], src=0)  # ...which waits for rank 0's send first
                dist.all_reduce(ts["a"])
        else:
            order = ("a", "b") if case == "same" or rank == 0 else ("b", "a")
            for name in order:  # matched by position: the k-th all-reduce of rank 0 meets rank 1's k-th
                dist.all_reduce(ts[name])
        out["values"] = {k: t.tolist() for k, t in ts.items()}
    except Exception as e:  # noqa: BLE001 (Gloo's timeout: reported to the parent, not raised)
        out["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    out["seconds"] = time.perf_counter() - t0
    return out


if __name__ == "__main__":
    r = main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
    print(json.dumps(r), flush=True)
    os._exit(0)  # skip interpreter teardown while Gloo may still hold a pending operation
