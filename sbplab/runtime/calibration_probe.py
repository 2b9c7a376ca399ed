"""What machine a worker runs on: a kernel that reads the facts a calibration is keyed by.

A calibration describes the machine the RANKS run on, which for workers started elsewhere with
torchrun (``launch="external"``) is not the driver's. So the facts are read on the workers by an
ordinary plan (a Compute actor of ``machine_facts`` feeding a Sink, one per rank), with no message
between driver and workers beyond what every run sends.
"""

from __future__ import annotations

import json
import os
import platform
import socket

import torch

from ..placement import Placement
from .actor_plan import ActorPlan
from .specs import Actor, Compute, Sink

FACTS_KERNEL = "sbplab.runtime.calibration_probe:machine_facts"


def _cpu_model() -> str:
    """The "model name" line of /proc/cpuinfo (Linux); the platform's processor string elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _memory_bytes() -> int:
    """MemTotal of /proc/meminfo in bytes (0 where it cannot be read)."""
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def local_machine_facts(device_type: str) -> dict:
    """This process's machine: CPU model, cores, memory, hostname, device type, GPU name, torch version."""
    gpu = None
    if device_type == "cuda" and torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(torch.cuda.current_device())
    return {"cpu_model": _cpu_model(), "cores": os.cpu_count() or 1, "memory_bytes": _memory_bytes(),
            "hostname": socket.gethostname(), "device_type": device_type, "gpu": gpu,
            "torch": torch.__version__}


def machine_facts(inputs: list[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
    """Kernel: this worker's facts as JSON bytes in a uint8 tensor (a Sink brings them to the driver)."""
    raw = json.dumps(local_machine_facts(attrs.get("device_type", "cpu")), sort_keys=True).encode()
    return (torch.tensor(list(raw), dtype=torch.uint8),)


def facts_plan(n: int, device_type: str) -> ActorPlan:
    """Every rank reads its machine's facts and hands them back under ``facts{rank}``."""
    ranks: dict[int, list[Actor]] = {}
    for r in range(n):
        ranks[r] = [Compute("facts", op=FACTS_KERNEL, attrs={"device_type": device_type}, scope="step",
                            registers=1),
                    Sink("facts_out", inputs=("facts",), key=f"facts{r}", scope="step",
                         placement=Placement(device_type, [r]), sbp="B")]
    return ActorPlan.build(n, ranks, device_type=device_type, name="calibrate-facts")


def read_worker_facts(cluster) -> list[dict]:
    """Per rank, the facts of the machine it runs on (one tiny run on the cluster's workers)."""
    res = cluster.run(facts_plan(cluster.n, cluster.device_type), None, steps=1, progress=False, params=False,
                      trace=False)
    return [json.loads(bytes(res.outputs[f"facts{r}"][0].tolist()).decode()) for r in range(cluster.n)]
