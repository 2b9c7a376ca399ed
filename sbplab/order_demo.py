"""Why every rank must issue its collectives in the same order, shown on two real Gloo processes.

A collective carries no name: Gloo and NCCL match the k-th collective a rank issues on a group with the
k-th collective every other rank issues there. Two ranks that disagree on the order therefore either

- **mix buffers**: both all-reduce two same-sized tensors, ``a`` then ``b`` on rank 0 and ``b`` then
  ``a`` on rank 1; the first all-reduce sums rank 0's ``a`` with rank 1's ``b``, silently, or
- **deadlock**: rank 0 all-reduces then sends, rank 1 waits for the send before it all-reduces; each
  waits for the other forever (here: until the short timeout given to the process group).

``run(case, timeout_s)`` starts two processes, each with a process group whose timeout is
``timeout_s``, and returns what each rank saw (its values, or the error Gloo raised). The parent waits
at most a few timeouts, then terminates and reaps any process still alive, so nothing hangs and
nothing is orphaned. This is why sbplab fixes one global order of communication at compile time
(``ActorPlan.comm_order``) and every rank's runtime follows it.

    from sbplab import order_demo
    print(order_demo.run("swapped").text())
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .errors import InputError

CASES = ("same", "swapped", "deadlock")
STARTUP_S = 120.0  # what two fresh processes may take to import torch on a busy machine


@dataclass
class RankOutcome:
    """What one rank saw: its all-reduced values by name, or the error it raised."""

    rank: int
    values: dict[str, list[float]] = field(default_factory=dict)
    error: str = ""
    seconds: float = 0.0


@dataclass
class OrderDemo:
    """Both ranks' outcomes for one case; ``expected`` is what a matching order gives."""

    case: str
    timeout_s: float
    ranks: list[RankOutcome]
    expected: dict[str, list[float]]
    killed: int = 0  # processes the parent had to terminate (0 when every rank returned on its own)

    @property
    def correct(self) -> bool:
        return all(not r.error and r.values == self.expected for r in self.ranks)

    def text(self) -> str:
        lines = [f"case {self.case!r} (process group timeout {self.timeout_s:g} s):"]
        for r in self.ranks:
            if r.error:
                lines.append(f"  rank {r.rank}: error after {r.seconds:.1f} s: {r.error}")
            else:
                got = ", ".join(f"{k}={v}" for k, v in r.values.items())
                lines.append(f"  rank {r.rank}: {got}")
        lines.append(f"  expected everywhere: {', '.join(f'{k}={v}' for k, v in self.expected.items())}"
                     f" -> {'correct' if self.correct else 'WRONG' if all(not r.error for r in self.ranks) else 'failed'}")
        return "\n".join(lines)


def run(case: str = "swapped", timeout_s: float = 2.0) -> OrderDemo:
    """Run ``case`` (``"same"``, ``"swapped"`` or ``"deadlock"``) on two fresh Gloo processes."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from .order_demo_worker import values
    from .runtime.cluster import free_port

    if case not in CASES:
        raise InputError(f"order_demo.run: case must be one of {CASES}, got {case!r}")
    if not 0 < timeout_s <= 60:
        raise InputError(f"order_demo.run: timeout_s must be in (0, 60] seconds, got {timeout_s}")
    script = str(Path(__file__).with_name("order_demo_worker.py"))
    port = free_port()
    procs = [subprocess.Popen([sys.executable, script, str(r), case, str(port), str(timeout_s)],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for r in range(2)]
    deadline = time.monotonic() + 3 * timeout_s + STARTUP_S  # start-up (imports) plus the ranks' own timeouts
    outcomes: dict[int, RankOutcome] = {}
    killed = 0
    for r, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            d = json.loads(out.strip().splitlines()[-1])
            outcomes[r] = RankOutcome(r, d["values"], d["error"], d["seconds"])
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            killed += 1
        except (ValueError, IndexError):  # it died without its JSON line
            outcomes[r] = RankOutcome(r, error=f"the process exited with code {p.returncode} and no result")
    for r in range(2):
        outcomes.setdefault(r, RankOutcome(r, error="no answer before the deadline: killed by the parent"))
    a, b = values(0), values(1)
    expected = {k: [x + y for x, y in zip(a[k], b[k])] for k in a}
    return OrderDemo(case, timeout_s, [outcomes[0], outcomes[1]], expected, killed)


__all__ = ["CASES", "OrderDemo", "RankOutcome", "run"]
