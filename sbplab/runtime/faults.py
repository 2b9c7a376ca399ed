"""Errors a run can end with. Each names the rank, the actor and op, and carries the worker's traceback."""

from __future__ import annotations

from ..errors import SbplabError


class RunError(SbplabError, RuntimeError):
    """A run failed on the workers.

    kind: "exception" (a firing raised), "died" (a worker process ended, e.g. SIGKILL),
        "hang" (no rank finished a firing within the timeout), "setup" (workers could not start).
    rank, actor, op: where it happened (None where unknown).
    worker_traceback: the original traceback text from the worker (or the stuck stack of a hang).
    status: for hangs, what every rank was doing.
    kept_step: for a run of a compiled step, the training step whose state was kept (the next run of
        the step continues from it; 0: the compiled weights); None otherwise.
    partial: for a run with ``checkpoint_every``, the result of the steps that finished before the kept
        state (their losses, outputs and trace; ``partial.losses[i]`` is step i's); None otherwise.
    """

    def __init__(self, kind: str, message: str, rank: int | None = None, actor: str | None = None,
                 op: str | None = None, worker_traceback: str = "", status: dict | None = None) -> None:
        self.kind, self.rank, self.actor, self.op = kind, rank, actor, op
        self.worker_traceback = worker_traceback
        self.status = status or {}
        self.kept_step: int | None = None
        self.partial = None
        text = message
        if worker_traceback:
            text += f"\n\n--- original traceback (rank {rank}) ---\n{worker_traceback.rstrip()}"
        super().__init__(text)

    def keep_note(self, step: int, where: str) -> None:
        """Add to the message (before the worker's traceback) which step's state survived and where it is."""
        self.kept_step = step
        head, sep, tb = str(self.args[0]).partition("\n\n--- original traceback")
        self.args = (f"{head}\n{where}{sep}{tb}",) + self.args[1:]


def describe_failure(info: dict) -> RunError:
    """The error for a worker's ("error", info) report."""
    rank, actor, op = info.get("rank"), info.get("actor"), info.get("op")
    where = f"rank {rank}" + (f", actor {actor!r} (op {op}, firing {info.get('firing')})" if actor else "")
    tb = info.get("traceback", "")
    last = tb.strip().splitlines()[-1] if tb.strip() else "unknown error"
    return RunError("exception", f"run failed on {where}: {last}", rank, actor, op, tb)
