"""A kernel that reports, from inside a worker's firing, the OpenMP thread count of the firing thread."""

from __future__ import annotations

import ctypes

import torch


def _libgomp() -> ctypes.CDLL:
    """The OpenMP runtime torch loaded (opening the same file again gives the same library)."""
    with open("/proc/self/maps") as f:
        path = next(line.split()[-1] for line in f if "libgomp" in line)
    return ctypes.CDLL(path)


def openmp_threads(inputs: list[torch.Tensor], attrs: dict) -> tuple[torch.Tensor]:
    """() -> the team size an OpenMP kernel (oneDNN's convolution) would start on this thread."""
    return (torch.tensor(float(_libgomp().omp_get_max_threads())),)
