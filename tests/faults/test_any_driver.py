"""A LocalCluster starts from any driver: ``python -c`` and a script piped on stdin (multiprocessing's
spawn method could not: it re-imports the main module, which such drivers do not have)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from sbplab.runtime.examples import reference_mlp_steps

pytestmark = [pytest.mark.faults, pytest.mark.multiprocess, pytest.mark.timeout(180)]

SCRIPT = """
import torch
from sbplab.runtime import LocalCluster
from sbplab.runtime.examples import data_parallel_linear
torch.manual_seed(0)
w0 = torch.randn(5, 2)
batches = [{"x": torch.randn(8, 5), "t": torch.randn(8, 2)} for _ in range(2)]
with LocalCluster(2) as c:
    res = c.run(data_parallel_linear(2, w0, lr=0.1, batch=8), batches, steps=2, progress=False)
print("LOSSES", repr(res.losses))
"""


def _expected() -> list[float]:
    torch.manual_seed(0)
    w0 = torch.randn(5, 2)
    batches = [{"x": torch.randn(8, 5), "t": torch.randn(8, 2)} for _ in range(2)]
    return reference_mlp_steps([w0], batches, 0.1, 2)[0]


def _losses(out: subprocess.CompletedProcess) -> list[float]:
    assert out.returncode == 0, out.stdout + out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("LOSSES"))
    return eval(line.split(" ", 1)[1])  # noqa: S307 - our own repr of a list of floats


@pytest.mark.parametrize("how", ["-c", "stdin"])
def test_a_cluster_starts_from_python_c_and_from_stdin(how, tmp_path):
    cmd = [sys.executable, "-c", SCRIPT] if how == "-c" else [sys.executable, "-"]
    out = subprocess.run(cmd, input=None if how == "-c" else SCRIPT, capture_output=True, text=True,
                         timeout=150, cwd=tmp_path)
    assert _losses(out) == pytest.approx(_expected(), rel=1e-5)
