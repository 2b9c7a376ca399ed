"""The precision and recomputation options worth trying on a model: what a strategy search adds to
each candidate layout (the search prices them with the simulator and keeps what fits and is fastest).

    for precision, recompute in training_options(graph):
        candidate = with_options(strategy, precision, recompute)

Only options that change something are listed: "full" needs repeated layers (``blocks.<i>``),
"selective" an attention core (a softmax or a fused attention op); mixed precision is bf16 (fp16
needs loss scaling, which the runtime does not do).
"""

from __future__ import annotations

import dataclasses

from ..deduction.precision import Precision
from ..deduction.strategy import Strategy
from ..ir import Graph
from .recompute import full_regions, selective_regions

OPTION_PRECISIONS = (Precision(), Precision.mixed("bf16"))


def training_options(graph: Graph | None = None,
                     precisions: tuple[Precision, ...] = OPTION_PRECISIONS) -> list[tuple[Precision, str]]:
    """(precision, recompute) pairs to consider, plain fp32 without recomputation first.

    graph: the training graph (or forward graph) the options are for; recomputation modes that
        would clone nothing in it are left out. None lists every mode.
    """
    modes = ["none"]
    if graph is None or selective_regions(graph):
        modes.append("selective")
    if graph is None or full_regions(graph):
        modes.append("full")
    return [(p, m) for p in precisions for m in modes]


def with_options(strategy: Strategy, precision: Precision, recompute: str) -> Strategy:
    """``strategy`` with these options, its name saying so (``"DP x2, bf16, recompute=full"``)."""
    extra = [p for p in ((precision.compute if precision.is_mixed else ""),
                         (f"recompute={recompute}" if recompute != "none" else "")) if p]
    name = ", ".join([strategy.name, *extra]) if extra else strategy.name
    return dataclasses.replace(strategy, precision=precision, recompute=recompute, name=name)
