"""The driver goes away mid-run: SIGKILLed (no clean-up code runs at all) or interrupted by Ctrl-C.

Either way no worker outlives it. A killed driver cannot tear its workers down, so each worker must
notice by itself (its connection to the driver ends; its parent changes); an interrupted driver gets
its KeyboardInterrupt at once and kills and reaps its workers before it exits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fault_helpers import exited, gone, wait_until

pytestmark = [pytest.mark.faults, pytest.mark.multiprocess, pytest.mark.timeout(180)]

HERE = Path(__file__).parent
GONE_S = 10.0

# rank 0 computes (a long sleep), rank 1 waits for it in an all-reduce: one worker of each kind
SCRIPT = """
import os
import sys
import torch
from sbplab import B, Placement
from sbplab.runtime import ActorPlan, Collective, Compute, LocalCluster, Sink, State

mark = sys.argv[1]
pl = Placement("cpu", [0, 1])
ranks = {}
for r in (0, 1):
    op, attrs = ("fault_kernels:sleep_through", {"mark": mark, "ms": 120_000}) if r == 0 else \\
        ("sbplab.runtime.kernels:noop", {})
    ranks[r] = [State("x", init=torch.ones(3)), Compute("f", op=op, inputs=("x",), attrs=attrs),
                Collective("ar", group=(0, 1), inputs=("f",)),
                Sink("out", inputs=("ar",), key="sum", placement=pl, sbp=(B,))]
plan = ActorPlan.build(2, ranks, name="long")
try:
    with LocalCluster(2) as c:
        print("PIDS", *c.pids, flush=True)
        print("DIR", os.path.dirname(c.address), flush=True)
        c.run(plan, steps=1, progress=False, timeout=300.0)
except KeyboardInterrupt:
    print("INTERRUPTED", flush=True)
    sys.exit(3)
"""


def _start_driver(tmp_path: Path) -> tuple[subprocess.Popen, list[int], Path, str]:
    """A ``python -c`` driver whose run is underway: rank 0 is inside its kernel."""
    mark = tmp_path / "reached"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(mark)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    line = proc.stdout.readline()  # type: ignore[union-attr]
    assert line.startswith("PIDS"), line + proc.stderr.read()  # type: ignore[union-attr]
    pids = [int(p) for p in line.split()[1:]]
    folder = proc.stdout.readline().split(maxsplit=1)[1].strip()  # type: ignore[union-attr]
    wait_until(mark.exists, 60, "the run reaching rank 0's kernel")
    return proc, pids, mark, folder


def test_workers_exit_when_their_driver_is_sigkilled(tmp_path):
    proc, pids, _, folder = _start_driver(tmp_path)
    assert not any(exited(p) for p in pids) and os.path.isdir(folder)
    proc.kill()
    proc.wait(timeout=30)
    t0 = time.monotonic()
    try:
        wait_until(lambda: all(exited(p) for p in pids), GONE_S, "every worker of the killed driver exiting")
    finally:
        for p in pids:  # never leave one behind, even when the check failed
            if not exited(p):
                os.kill(p, signal.SIGKILL)
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]
    assert time.monotonic() - t0 < GONE_S
    # the killed driver's private directory (its socket, the store) went with its last worker
    wait_until(lambda: not os.path.exists(folder), GONE_S, "the workers deleting the driver's private directory")


def test_ctrl_c_in_a_driver_script_interrupts_the_run_and_takes_every_worker_down(tmp_path):
    proc, pids, _, folder = _start_driver(tmp_path)
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=GONE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for p in pids:
            if not exited(p):
                os.kill(p, signal.SIGKILL)
    assert proc.returncode == 3 and "INTERRUPTED" in out, out + err
    assert "Traceback" not in err, err  # nothing else went wrong on the way out
    assert all(gone(p) for p in pids)  # killed and reaped by the driver itself, not left to init
    assert not os.path.exists(folder)
