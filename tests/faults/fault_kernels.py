"""Kernels that misbehave on purpose, referred to as ``"fault_kernels:NAME"`` in hand-edited plans.

Workers import them because a spawned worker gets the driver's import path (this folder is on it
under pytest). Each first touches ``attrs["mark"]`` (if given), so a test knows the run has reached
the kernel, and sleeps ``attrs["ms"]``, so the other ranks are deep in the same step when it strikes.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import torch


def _arrive(attrs: dict) -> None:
    if attrs.get("mark"):
        Path(attrs["mark"]).touch()
    time.sleep(attrs.get("ms", 0.0) / 1000.0)


def fault(inputs: list[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
    """Fails the way ``how`` says: "raise" an exception, "sigkill" its own process, or "exit137"
    (``os._exit(137)``: the code a container reports for a process the OOM killer took)."""
    _arrive(attrs)
    how = attrs["how"]
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "exit137":
        os._exit(137)
    raise MemoryError(attrs.get("message", "out of memory on purpose"))


def sleep_through(inputs: list[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
    """Marks, sleeps ``ms``, then passes its first input through (a slow but healthy firing)."""
    _arrive(attrs)
    return (inputs[0],) * attrs.get("outputs", 1)
