"""GPipe, 1F1B and interleaved 1F1B as explicit per-rank action lists.

Each function returns, per pipeline rank, its ``Action``s in the order it runs them (the idle slots
torch's ``pipeline_order`` pads with ``None`` are left out: the firing rule waits for data anyway).
The orders are torch.distributed.pipelining's (``ScheduleGPipe``, ``Schedule1F1B``,
``ScheduleInterleaved1F1B``), which the tests check action by action:

- GPipe: every forward, then every backward, micro-batches in order. Stage s keeps all M
  micro-batches' activations alive.
- 1F1B (PipeDream-Flush, Megatron's default): rank r runs S - 1 - r forwards to fill the pipeline,
  then alternates one forward and one backward, then drains the backwards. At most S - r
  activations alive, however many micro-batches.
- Interleaved 1F1B (Narayanan et al., SC21): each rank holds ``v`` stages (rank r holds stages
  r, r + n, ...); forwards go round the rank's stages in rounds of ``M // rounds`` micro-batches
  (``rounds = max(1, M // n)``), backwards round them the other way, with a warm-up of
  ``(v - 1) * per_round + 2 * (n - 1 - r)`` forwards. The bubble shrinks by ``v``.
"""

from __future__ import annotations

from ...errors import InputError
from ...runtime.pipeline_order import BACKWARD, FORWARD, Action

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")


def gpipe(n_ranks: int, micro: int) -> dict[int, tuple[Action, ...]]:
    """All forwards, then all backwards; one stage per rank."""
    return {r: tuple([Action(r, FORWARD, m) for m in range(micro)] + [Action(r, BACKWARD, m) for m in range(micro)])
            for r in range(n_ranks)}


def one_f_one_b(n_ranks: int, micro: int) -> dict[int, tuple[Action, ...]]:
    """Warm-up forwards, then one forward and one backward in turn, then the remaining backwards."""
    out = {}
    for r in range(n_ranks):
        warm = min(micro, n_ranks - 1 - r)
        acts = [Action(r, FORWARD, m) for m in range(warm)]
        for f in range(warm, micro):  # steady state: forward f, then the oldest backward
            acts += [Action(r, FORWARD, f), Action(r, BACKWARD, f - warm)]
        acts += [Action(r, BACKWARD, m) for m in range(micro - warm, micro)]
        out[r] = tuple(acts)
    return out


def interleaved_1f1b(n_ranks: int, micro: int, stages_per_rank: int) -> dict[int, tuple[Action, ...]]:
    """Several stages per rank (rank r holds r, r + n_ranks, ...), depth first within rounds."""
    n, v = n_ranks, stages_per_rank
    rounds = max(1, micro // n)
    if micro % rounds:
        raise InputError(f"interleaved 1F1B runs micro-batches in {rounds} rounds of {micro // rounds} "
                         f"({n} ranks), so micro_batches must be a multiple of {rounds}; got {micro}")
    per_round = micro // rounds
    total = v * micro  # forwards (and backwards) of one rank

    def forward(j: int) -> tuple[int, int]:  # the j-th forward of the rank: (stage, micro-batch)
        chunk = (j // per_round) % v
        return chunk * n, (j // (per_round * v)) * per_round + j % per_round

    def backward(j: int) -> tuple[int, int]:  # the j-th backward: local stages the other way round
        chunk = v - 1 - (j // per_round) % v
        return chunk * n, (j // (per_round * v)) * per_round + j % per_round

    out = {}
    for r in range(n):
        warm = min(total, (v - 1) * per_round + 2 * (n - 1 - r))
        acts = [Action(forward(j)[0] + r, FORWARD, forward(j)[1]) for j in range(warm)]
        for j in range(warm, total):
            s, m = forward(j)
            acts.append(Action(s + r, FORWARD, m))
            s, m = backward(j - warm)
            acts.append(Action(s + r, BACKWARD, m))
        for j in range(total - warm, total):
            s, m = backward(j)
            acts.append(Action(s + r, BACKWARD, m))
        out[r] = tuple(acts)
    return out


def pipeline_actions(schedule: str, n_ranks: int, micro: int, stages_per_rank: int = 1) -> dict[int, tuple[Action, ...]]:
    """The action list of every pipeline rank 0..n_ranks-1 under ``schedule`` (one of ``SCHEDULES``)."""
    if schedule not in SCHEDULES:
        raise InputError(f"pipeline schedule {schedule!r} is not one of {', '.join(SCHEDULES)}")
    if n_ranks < 1 or micro < 1 or stages_per_rank < 1:
        raise InputError(f"a pipeline schedule needs n_ranks, micro and stages_per_rank >= 1; got {n_ranks}, "
                         f"{micro}, {stages_per_rank}")
    if schedule != "interleaved_1f1b" and stages_per_rank != 1:
        raise InputError(f"schedule {schedule!r} runs one stage per rank (got stages_per_rank={stages_per_rank}); "
                         f"several stages per rank need 'interleaved_1f1b'")
    if schedule == "gpipe":
        return gpipe(n_ranks, micro)
    if schedule == "1f1b":
        return one_f_one_b(n_ranks, micro)
    return interleaved_1f1b(n_ranks, micro, stages_per_rank)
