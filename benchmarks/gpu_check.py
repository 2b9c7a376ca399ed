"""Does the NCCL/CUDA path work on this machine? One script that answers in minutes.

Run on a machine with one or more CUDA GPUs, from the repository root:

    python benchmarks/gpu_check.py            # the CUDA tests, then sbplab vs torch on NCCL
    python benchmarks/gpu_check.py --quick    # the CUDA tests and one width of the comparison

It prints the machine (torch, CUDA, NCCL, GPUs), runs ``tests/test_cuda_paths.py`` (every preset trains
like torch on ``LocalCluster(n, "cuda")``; one device-free strategy runs on CPU and CUDA alike), then,
with two GPUs or more, ``bench_vs_torch.py --device cuda`` (sbplab against DDP, FSDP2, DTensor and
torch.distributed.pipelining, all on NCCL), and ends with a short report: one line per check.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def machine() -> str:
    if not torch.cuda.is_available():
        return f"torch {torch.__version__}, no CUDA device"
    names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else "?"
    mem = torch.cuda.get_device_properties(0).total_memory / 2**30
    return (f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {nccl}, "
            f"{torch.cuda.device_count()} x {', '.join(names)} ({mem:.0f} GiB)")


def run(what: str, cmd: list[str], timeout_s: float) -> tuple[str, bool, str]:
    """Run ``cmd`` with its output shown as it comes; (what, passed, last line)."""
    print(f"\n== {what}: {' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, timeout=timeout_s, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)
    except subprocess.TimeoutExpired:
        return what, False, f"did not finish in {timeout_s:.0f} s"
    print(proc.stdout, flush=True)
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    return what, proc.returncode == 0, f"{last} ({time.perf_counter() - t0:.0f} s)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one width, fewer steps in the comparison")
    ap.add_argument("--timeout", type=float, default=480.0, help="seconds each check may take")
    a = ap.parse_args()
    print(f"machine: {machine()}")
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check here (the CPU/Gloo paths are what `make test` runs)")
        return 2
    checks = [run("CUDA tests", [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda",
                                 "tests/test_cuda_paths.py"], a.timeout)]
    gpus = torch.cuda.device_count()
    if gpus >= 2:
        ranks = ["2"] + (["4"] if gpus >= 4 and not a.quick else [])
        widths = ["1024"] if a.quick else ["1024", "4096"]
        checks.append(run("sbplab vs torch on NCCL", [sys.executable, "benchmarks/bench_vs_torch.py", "--device",
                                                      "cuda", "--ranks", *ranks, "--widths", *widths,
                                                      "--rounds", "2" if a.quick else "3"], a.timeout))
    else:
        checks.append(("sbplab vs torch on NCCL", True, "skipped: needs 2 GPUs (one per rank)"))
    print("\n== report")
    for what, ok, last in checks:
        print(f"{'ok  ' if ok else 'FAIL'} {what}: {last}")
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
