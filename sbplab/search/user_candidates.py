"""Strategies a user brings to ``sl.search(..., candidates=[...])``: compared with everything the search finds.

Why: a person often has a strategy of their own (a hand-tuned one, last week's winner) and wants to
know whether the search beats it on this model and machine. Each is read like a preset (deduction on
the search's own training graph gives a signature per forward op, so the analytic model prices it on
the same terms), always simulated in the re-rank, and shown in ``res.table()``; it may win. Like a
preset, it is returned as written (its gradient bucket size is not tuned).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..compiler.deduction.strategy import Strategy
from ..errors import SbplabError
from .candidate import Candidate
from .presets_eval import PresetSpec, preset_choice
from .search_errors import SearchError

USER_METHOD = "user"


def devices_used(st: Strategy) -> int:
    """Ranks a strategy runs on: every stage's placement, or its one placement."""
    return sum(p.size for p in st.stages) if st.stages else st.placement.size


def check_candidates(candidates: object, devices: int) -> list[Strategy]:
    """The user's strategies, each refused clearly unless it is a Strategy on at most ``devices`` ranks."""
    if candidates is None:
        return []
    if isinstance(candidates, Strategy) or not isinstance(candidates, Sequence):
        raise SearchError(f"sl.search: candidates must be a list of sl.Strategy (e.g. [sl.presets.dp_tp((2, 4))]), "
                          f"got {type(candidates).__name__}")
    out = []
    for i, st in enumerate(candidates):
        if not isinstance(st, Strategy):
            raise SearchError(f"sl.search: candidates[{i}] must be an sl.Strategy (a preset or your own), got "
                              f"{type(st).__name__}")
        n = devices_used(st)
        if n > devices:
            raise SearchError(f"sl.search: candidates[{i}] ({st.name!r}) runs on {n} ranks but the search is for "
                              f"devices={devices}; give a strategy on at most {devices} ranks")
        out.append(st)
    return out


def user_candidates(strategies: list[Strategy], graph: Callable[[int], Any],
                    price: Callable[[Any], Candidate], hw: Any) -> list[Candidate]:
    """Each strategy priced like a preset (``price``: the search's ``_price_preset``) on ``graph(m)``."""
    out = []
    for i, st in enumerate(strategies):
        n_stages = len(st.stages) if st.stages else 1
        spec = PresetSpec(f"yours: {st.name}", lambda st=st: st, 0, n_stages, st.micro_batches)
        try:
            c = price(preset_choice(graph(st.micro_batches), spec, hw))
        except (SbplabError, ValueError) as e:
            raise SearchError(f"sl.search: candidates[{i}] ({st.name!r}) cannot be placed on this model: "
                              f"{str(e).splitlines()[0]}") from e
        c.method, c.bucket_mb = USER_METHOD, st.bucket_mb  # as written: the re-rank tunes no bucket size of it
        out.append(c)
    return out
