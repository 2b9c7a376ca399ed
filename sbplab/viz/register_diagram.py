"""What a register count lets one pipeline stage do on its own: replay a rank's firing rule with no
message ever arriving from the other stages, and draw every actor with its registers filled.

Why: "R registers give R micro-batches in flight" is the claim a pipeline tutorial makes; this replay
proves it for a given plan, whatever the timing. A receive that never completes stands for the
slowest possible next stage; sends complete at once (the fastest possible one). What the rank still
manages to fire is what its registers allow it to run ahead: every output still held is a micro-batch
whose activations wait for their backward.

    ahead = run_ahead(step.plan(registers=4))    # RunAhead: ahead.sent == 4 on a 4 micro-batch pipeline
    register_picture(step.plan(registers=4))     # DotPicture: actors, their 4 registers, who reads whom
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape as esc
from typing import Any

from .dot import DotPicture, q


@dataclass
class RunAhead:
    """Rank ``rank`` of a plan after firing all it can while no message arrives."""

    rank: int
    registers: dict[str, int]  # actor -> its register count
    held: dict[str, list[int]]  # actor -> micro-batches whose output it still holds (unacked)
    fired: dict[str, int]  # actor -> firings done
    sent: int  # forward sends completed: micro-batches this stage handed on before any answer
    waiting: list[str] = field(default_factory=list)  # receives that never completed


def run_ahead(plan: Any, rank: int = 0) -> RunAhead:
    """Replay rank ``rank`` of an ActorPlan for one step with its receives never completing."""
    from ..runtime.firing import FiringGraph

    actors = plan.ranks[rank].actors
    g = FiringGraph(actors, plan.micro_batches, 1)
    try:
        progress = True
        while progress:
            progress = False
            for i, n in enumerate(g.nodes):
                if n.actor.kind == "recv":
                    continue
                while n.started < n.total and g.can_fire(i):
                    g.finish(i, g.start(i))
                    progress = True
        held = {n.actor.name: list(range(n.released, n.produced)) for n in g.nodes}
        fired = {n.actor.name: n.done_upto for n in g.nodes}
        sent = sum(n.done_upto for n in g.nodes if n.actor.kind == "send" and n.actor.phase == "forward")
        waiting = [n.actor.name for n in g.nodes if n.actor.kind == "recv"]
    finally:
        g.unlink()
    return RunAhead(rank, {a.name: a.registers for a in actors}, held, fired, sent, waiting)


def register_picture(plan: Any, rank: int = 0, phases: tuple[str, ...] = ("forward",),
                     physical: Any = None) -> DotPicture:
    """The per-micro-batch actors of ``rank`` in ``phases`` (plus its receives), each drawn with its
    registers as cells, filled with the micro-batch they hold after ``run_ahead``; an edge per register
    read. A full row of cells is back-pressure: that actor cannot fire again until a reader acks.
    ``physical`` (``step.physical``) names each actor by its logical op (``n26`` is ``proj_in``)."""
    ahead = run_ahead(plan, rank)
    actors = [a for a in plan.ranks[rank].actors
              if a.scope == "micro" and (a.phase in phases or a.kind == "recv")]
    shown = {a.name for a in actors}
    lines = ['digraph "registers" {', "  rankdir=LR; node [shape=plaintext, fontname=Helvetica, fontsize=10];",
             '  edge [color="#555555"];',
             f'  label="rank {rank}, {plan.micro_batches} micro-batches: registers after firing all it can '
             f'while no message arrives ({ahead.sent} micro-batch(es) sent on)"; labelloc=t; fontname=Helvetica;']
    for a in actors:
        held = ahead.held.get(a.name, [])
        cells = "".join(
            f'<td bgcolor="{"#9ecae1" if k < len(held) else "#ffffff"}" width="26">'
            f'{f"m{held[k]}" if k < len(held) else " "}</td>' for k in range(a.registers))
        what = _logical(a.name, physical) or getattr(a, "op", None) or a.kind
        head = f"waits for stage {rank + 1}" if a.kind == "recv" else f"fired {ahead.fired.get(a.name, 0)}x"
        # the header cell filled light like every node, so its dark text reads on a dark page too
        label = (f'<<table border="0" cellborder="1" cellspacing="0"><tr><td colspan="{max(a.registers, 1)}" '
                 f'bgcolor="#f2f2f2">'
                 f'<b>{esc(str(what))}</b><br/>{esc(a.kind)}, {head}</td></tr><tr>{cells}</tr></table>>')
        lines.append(f"  {q(a.name)} [label={label}];")
    for a in actors:
        for ref in a.inputs:
            if ref.actor in shown:
                lines.append(f"  {q(ref.actor)} -> {q(a.name)};")
    lines.append("}")
    return DotPicture("\n".join(lines))


def _logical(actor: str, physical: Any) -> str | None:
    """``n26`` -> the logical op of physical node 26 (send/recv: ``n53.recv0`` -> node 53's)."""
    if physical is None or not actor.startswith("n"):
        return None
    head = actor[1:].split(".")[0]
    if not head.isdigit() or int(head) >= len(physical.nodes):
        return None
    return physical.nodes[int(head)].logical or None


__all__ = ["RunAhead", "register_picture", "run_ahead"]
