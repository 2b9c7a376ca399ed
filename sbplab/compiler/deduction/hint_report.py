"""What a strategy's hints did to one graph: per hint the tensors it matched, per parallelism rule what
it did and what it could not (a tensor-parallel rule: the pairs it found and the ones it refused), per
signature hint the ops it forced.

Hints work by name, and a name that matches nothing does nothing; this report is how a user sees
that (``Strategy.explain(model)``, or ``strategy.report`` after a compile).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...sbp import fmt_sbp
from ..ir import Graph

if TYPE_CHECKING:
    from .parallel.base import ParallelRule, RuleUse
    from .signature_hints import SignatureHint
    from .strategy import Hint


@dataclass
class HintMatch:
    """One tensor hint and the tensors it named; ``skipped`` were too small for its split."""

    hint: Hint
    targets: list[str]
    skipped: list[str] = field(default_factory=list)
    source: str = "user"  # "user", "preset" or the parallelism rule that made it

    def line(self) -> str:
        sbp = self.hint.sbp if isinstance(self.hint.sbp, str) else fmt_sbp(tuple(self.hint.sbp)) \
            if isinstance(self.hint.sbp, tuple) else repr(self.hint.sbp)
        kept = [t for t in self.targets if t not in self.skipped]
        what = ", ".join(kept[:8]) + (f" ... ({len(kept)} in all)" if len(kept) > 8 else "")
        text = f"{self.hint.describe()} -> {sbp}: " + (f"matched {what}" if kept else "matched nothing")
        if self.skipped:
            text += f"; skipped {len(self.skipped)} too small to split ({', '.join(self.skipped[:4])})"
        return text


@dataclass
class HintReport:
    """Everything the hints of one strategy matched in one graph; ``text()`` reads it out."""

    strategy: str
    matches: list[HintMatch]
    rules: list[tuple[ParallelRule, RuleUse]] = field(default_factory=list)
    signatures: list[tuple[SignatureHint, list[str]]] = field(default_factory=list)

    def unmatched(self) -> list[HintMatch]:
        return [m for m in self.matches if not m.targets]

    def text(self) -> str:
        lines = [f"strategy {self.strategy!r}:"]
        for rule, use in self.rules:
            lines.append(f"  {rule.describe()}")
            lines += [f"    {x}" for x in use.lines] or ["    found nothing to act on"]
            unmatched = getattr(use.pairing, "unmatched", None)
            if unmatched:
                lines.append(f"    globs naming no layer: {unmatched}")
        for m in self.matches:
            lines.append(f"  [{m.source}] {m.line()}")
        for h, ops in self.signatures:
            lines.append(f"  {h.describe()} ({h.text!r}): " + (f"forces {', '.join(ops)}" if ops else "matches no op"))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()


def unmatched_message(graph: Graph, h: Hint) -> str:
    """Why ``h`` matched nothing, with the closest names (difflib) and tensors of other roles it would hit."""
    if h.input_grad is not None:
        names = [op.name for op in graph.ops if op.phase == "forward"]
        kind = "forward op"
    else:
        names = [n for n, t in graph.tensors.items() if h.role is None or t.role == h.role]
        kind = f"{h.role} tensor" if h.role else "tensor"
    close = difflib.get_close_matches(h.pattern, names, n=5, cutoff=0.5)
    msg = f"{h.describe()} matches no {kind}"
    if h.role is not None and h.input_grad is None:
        import fnmatch

        other = [f"{n} ({t.role})" for n, t in graph.tensors.items() if fnmatch.fnmatchcase(n, h.pattern)]
        if other:
            msg += f"; it would match {', '.join(other[:5])}: drop role={h.role!r} or fix it"
    msg += f"; close names: {close}" if close else f"; {kind}s include: {', '.join(names[:12])}"
    return msg + " (a misspelt pattern would otherwise do nothing, silently)"


def training_graph(target: Any, example_inputs: Any = None, loss_fn: Callable | None = None,
                   label: Any = None, micro_batches: int = 1) -> Graph:
    """The training graph hints are matched against: from a compiled step, a graph, or a torch module.

    A module is traced on ``example_inputs`` (or its own ``example_batch()``) with ``loss_fn`` (or its
    own ``loss_fn``); backward and an SGD update are added so gradient and state hints find tensors.
    """
    import torch

    from ..training.autodiff import add_backward
    from ..training.optim import SGD

    if hasattr(target, "graph") and isinstance(target.graph, Graph):
        return target.graph
    if isinstance(target, torch.nn.Module):
        from ..frontend.from_torch import from_torch

        if example_inputs is None:
            if not hasattr(target, "example_batch"):
                raise TypeError(f"explain({type(target).__name__}) needs example_inputs (the model has no "
                                f"example_batch() to make them)")
            example_inputs, label = target.example_batch(2 * micro_batches)
        loss_fn = loss_fn or getattr(target, "loss_fn", None)
        xs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
        m = micro_batches
        target = from_torch(target, tuple(x[: x.shape[0] // m] for x in xs), loss_fn,
                            None if label is None or loss_fn is None else label[: label.shape[0] // m])
    if not isinstance(target, Graph):
        raise TypeError(f"explain() takes a torch module, a Graph or a compiled step, got {type(target).__name__}")
    if target.ops_in("backward") or target.loss is None:
        return target
    g = target.copy()
    add_backward(g, micro_batches)
    SGD().build(g)
    return g
