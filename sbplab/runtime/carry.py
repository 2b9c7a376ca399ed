"""Training state that stays with a cluster between runs of the same compiled step.

Each run of a plan starts every State actor (parameters, optimizer state) from its ``init``. For a
compiled step that would start every ``cluster.run`` again from the weights captured at
``sl.compile``. So after a run of a compiled step the driver keeps what every rank sent back, each
State's final local value (``RunResult.final_shards``), and the next run of the same step on the
same cluster ships those as the States' ``init``: it continues where the last run stopped.

The values live in the driver, not in the workers, so they survive what kills workers: a failed or
interrupted run leaves the state of the last run that finished, and the respawned workers of the
next run start from it. ``restart=True`` (or ``cluster.reset(step)``) drops them: the step starts
again from its compiled weights. A plain ActorPlan is never continued (its States start from their
``init`` every run, as they always did).
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
    """Per compiled step (by identity), the final State shards of its last finished run."""

    def __init__(self) -> None:
        self._by_step: dict[int, tuple[Callable[[], Any], Shards]] = {}

    def get(self, step: Any) -> Shards | None:
        got = self._by_step.get(id(step))
        if got is None or got[0]() is not step:  # an id reused by a new object after the old one died
            return None
        return got[1]

    def put(self, step: Any, shards: Shards) -> None:
        key = id(step)
        store = self._by_step
        try:  # forget the state when the step itself is gone (and free its tensors)
            ref: Callable[[], Any] = weakref.ref(step, lambda _r, k=key, s=store: s.pop(k, None))
        except TypeError:  # not weak-referenceable: hold it (its state is held anyway)
            def ref(s: Any = step) -> Any:
                return s
        store[key] = (ref, shards)

    def drop(self, step: Any = None) -> None:
        """Forget the state of ``step`` (None: of every step)."""
        if step is None:
            self._by_step.clear()
        elif self.get(step) is not None:
            del self._by_step[id(step)]

    def __contains__(self, step: Any) -> bool:
        return self.get(step) is not None


def _shape_dtype(init: torch.Tensor | Zeros) -> tuple[tuple[int, ...], torch.dtype]:
    return tuple(init.shape), init.dtype


def with_state(plan: ActorPlan, shards: Mapping[int, Mapping[str, torch.Tensor]]) -> ActorPlan:
    """``plan`` with every keyed State starting from its value in ``shards`` instead of its ``init``.

    A shallow copy: the plan (often cached by the compiled step) is left as it is, and only the
    State actors are copied. Every keyed State must have a value of its own shape and dtype, else
    the values belong to another plan and continuing from them would be wrong."""
    ranks = {}
    for r, rp in plan.ranks.items():
        vals = shards.get(r, {})
        acts = []
        for a in rp.actors:
            if isinstance(a, State) and a.key:
                v = vals.get(a.name)
                if v is None or (tuple(v.shape), v.dtype) != _shape_dtype(a.init):  # type: ignore[arg-type]
                    got = "nothing" if v is None else f"{tuple(v.shape)} {v.dtype}"
                    want = "{} {}".format(*_shape_dtype(a.init))  # type: ignore[arg-type]
                    raise ClusterError(f"cannot continue {plan.name!r}: the kept state of {a.key!r} on rank {r} "
                                       f"is {got}, the plan wants {want}; run it with restart=True to start "
                                       f"again from the compiled weights")
                a = copy.copy(a)
                a.init = v
            acts.append(a)
        new = copy.copy(rp)
        new.actors = acts
        new.by_name = {a.name: a for a in acts}
        ranks[r] = new
    out = copy.copy(plan)
    out.ranks = ranks
    return out
