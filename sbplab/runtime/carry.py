"""Training state that stays with a cluster between runs of the same compiled step.

Each run of a plan starts every State actor (parameters, optimizer state) from its ``init``. For a
compiled step that would start every ``cluster.run`` again from the weights captured at
``sl.compile``. So after a run of a compiled step the driver keeps what every rank sent back, each
State's final local value (``RunResult.final_shards``), and the next run of the same step on the
same cluster ships those as the States' ``init``: it continues where the last run stopped.

The values live in the driver, so they survive what kills workers: a failed or interrupted run
leaves the state of the last run that finished, and the respawned workers of the next run start
from it. The workers also keep the final values of their last run where they are (on the GPU for
cuda ranks), so when the same workers run the same step next, the driver ships nothing back to
them: they start from what they hold (``without_inits``) and the driver's copy is only the spare.
``restart=True`` (or ``cluster.reset(step)``) drops the state: the step starts again from its
compiled weights. A plain ActorPlan is never continued (its States start from their ``init`` every
run, as they always did).
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..errors import ClusterError
from .actor_plan import ActorPlan
from .specs import State, Zeros

Shards = dict[int, dict[str, torch.Tensor]]  # rank -> State actor name -> final local value


class StateStore:
    """Per compiled step (by identity), the final State shards of its last finished run, the tag the
    workers keep them under, and how many training steps they are past the compiled weights."""

    def __init__(self) -> None:
        self._by_step: dict[int, tuple[Callable[[], Any], Shards, int, int]] = {}
        self._tags = 0

    def _entry(self, step: Any) -> tuple[Callable[[], Any], Shards, int, int] | None:
        got = self._by_step.get(id(step))
        if got is None or got[0]() is not step:  # an id reused by a new object after the old one died
            return None
        return got

    def get(self, step: Any) -> Shards | None:
        got = self._entry(step)
        return None if got is None else got[1]

    def tag(self, step: Any) -> int | None:
        """The tag of ``step``'s kept state: the run that made it kept its values on the workers under it."""
        got = self._entry(step)
        return None if got is None else got[2]

    def steps(self, step: Any) -> int:
        """Training steps the kept state of ``step`` is past its compiled weights (0: nothing kept)."""
        got = self._entry(step)
        return 0 if got is None else got[3]

    def new_tag(self) -> int:
        self._tags += 1
        return self._tags

    def put(self, step: Any, shards: Shards, tag: int, steps: int = 0) -> None:
        key = id(step)
        store = self._by_step
        try:  # forget the state when the step itself is gone (and free its tensors)
            ref: Callable[[], Any] = weakref.ref(step, lambda _r, k=key, s=store: s.pop(k, None))
        except TypeError:  # not weak-referenceable: hold it (its state is held anyway)
            def ref(s: Any = step) -> Any:
                return s
        store[key] = (ref, shards, tag, steps)

    def drop(self, step: Any = None) -> None:
        """Forget the state of ``step`` (None: of every step)."""
        if step is None:
            self._by_step.clear()
        elif self._entry(step) is not None:
            del self._by_step[id(step)]

    def __contains__(self, step: Any) -> bool:
        return self._entry(step) is not None


def _shape_dtype(init: torch.Tensor | Zeros) -> tuple[tuple[int, ...], torch.dtype]:
    return tuple(init.shape), init.dtype


def _with_inits(plan: ActorPlan, init_of: Callable[[int, State], torch.Tensor | Zeros]) -> ActorPlan:
    """``plan`` with every keyed State's ``init`` replaced by ``init_of(rank, state)``. A shallow copy:
    the plan (often cached by the compiled step) is left as it is; only the State actors are copied."""
    ranks = {}
    for r, rp in plan.ranks.items():
        acts = []
        for a in rp.actors:
            if isinstance(a, State) and a.key:
                init = init_of(r, a)
                a = copy.copy(a)
                a.init = init
            acts.append(a)
        new = copy.copy(rp)
        new.actors = acts
        new.by_name = {a.name: a for a in acts}
        ranks[r] = new
    out = copy.copy(plan)
    out.ranks = ranks
    return out


def with_state(plan: ActorPlan, shards: Mapping[int, Mapping[str, torch.Tensor]]) -> ActorPlan:
    """``plan`` with every keyed State starting from its value in ``shards`` instead of its ``init``.

    Every keyed State must have a value of its own shape and dtype, else the values belong to another
    plan and continuing from them would be wrong."""
    def init_of(r: int, a: State) -> torch.Tensor:
        v = shards.get(r, {}).get(a.name)
        want = _shape_dtype(a.init)  # type: ignore[arg-type]
        if v is None or (tuple(v.shape), v.dtype) != want:
            got = "nothing" if v is None else f"{tuple(v.shape)} {v.dtype}"
            raise ClusterError(f"cannot continue {plan.name!r}: the kept state of {a.key!r} on rank {r} is {got}, "
                               f"the plan wants {want[0]} {want[1]}; run it with restart=True to start again "
                               f"from the compiled weights")
        return v

    return _with_inits(plan, init_of)


def without_inits(plan: ActorPlan) -> ActorPlan:
    """``plan`` with every keyed State's ``init`` a ``Zeros`` description (no data to ship): for a run
    whose workers start every keyed State from the values they kept (``RunSpec.resume``)."""
    return _with_inits(plan, lambda r, a: Zeros(*_shape_dtype(a.init)))  # type: ignore[arg-type]
