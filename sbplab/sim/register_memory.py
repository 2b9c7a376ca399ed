"""Peak memory per rank from the simulated register lifetimes.

A State (parameter or optimizer state) holds its tensor for the whole run; its register hands out
that same tensor, so it is counted once, as persistent. Every other register holds its actor's
outputs from the start of the firing that produces them (the kernel allocates them, a posted
receive has its buffer) until every consumer has acked them (the runtime then drops them), which
is exactly the FiringGraph's ``released`` counter in the simulation. An Accumulate's buffer lives
from the first micro-batch of a step to its release. An actor that writes ``into`` a shared buffer (a
gradient bucket's, ``runtime.buffers``) allocates nothing: the buffers are persistent gradients, one
per register of the actor guarding them.

Categories: ``parameters`` (States read by forward or backward actors, and the next values an update
computes for them), ``optimizer state`` (States only the update reads, and their next values),
``gradients`` (Accumulate buffers, backward registers the update reads, and the collectives and
accumulations feeding those), ``activations`` (everything else: inputs, activations, activation
gradients, boxing buffers).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..runtime.specs import Accumulate, Actor, Collective, State
from .engine import Firings
from .shapes import ActorShapes, nbytes

CATEGORIES = ("parameters", "gradients", "optimizer state", "activations")


@dataclass
class RankPeak:
    """Peak bytes of one rank and what they were at that moment."""

    peak: int
    at_us: float
    breakdown: dict[str, int] = field(default_factory=dict)


def categories(actors: list[Actor]) -> dict[tuple[str, int], str]:
    """(actor name, output index) -> the category of that register (a State: of its persistent value)."""
    by_name = {a.name: a for a in actors}
    readers: dict[str, list[Actor]] = {a.name: [] for a in actors}
    for a in actors:
        for ref in a.inputs:
            readers[ref.actor].append(a)
    cat: dict[tuple[str, int], str] = {}
    for a in actors:
        if isinstance(a, State):
            used = any(c.phase != "update" for c in readers[a.name])
            cat[(a.name, 0)] = "parameters" if used else "optimizer state"
    for a in actors:
        if isinstance(a, State) and a.update is not None:
            cat.setdefault((a.update.actor, a.update.index), cat[(a.name, 0)])
    grads = [a.name for a in actors if isinstance(a, Accumulate) or (
        a.phase == "backward" and any(c.phase == "update" or isinstance(c, Accumulate) for c in readers[a.name]))]
    seen: set[str] = set()
    while grads:  # the reductions feeding a gradient carry the gradient too
        name = grads.pop()
        if name in seen:
            continue
        seen.add(name)
        a = by_name[name]
        for j in range(max(a.num_outputs, 1)):
            cat.setdefault((name, j), "gradients")
        if isinstance(a, (Collective, Accumulate)):
            grads.extend(r.actor for r in a.inputs if by_name[r.actor].phase == "backward")
    for a in actors:
        for j in range(max(a.num_outputs, 1)):
            cat.setdefault((a.name, j), "activations")
    return cat


def peak_memory(firings: Firings, actors: dict[int, list[Actor]], shapes: dict[int, dict[str, ActorShapes]],
                end_s: float) -> dict[int, RankPeak]:
    """Per simulated rank: the largest persistent + live register bytes over the simulated run."""
    persistent: dict[int, dict[str, int]] = {}
    out_bytes: dict[int, list[list[tuple[int, str]]]] = {}
    for r, acts in actors.items():
        cats = categories(acts)
        base = dict.fromkeys(CATEGORIES, 0)
        rows = []
        pools: dict[str, int] = {}
        for a in acts:
            sizes = [nbytes(m) for m in shapes[r][a.name].outputs]
            if isinstance(a, State):
                base[cats[(a.name, 0)]] += sum(sizes)
                sizes = []  # its register is the persistent tensor itself
            into = getattr(a, "into", None)
            if into is not None:  # a view of the run's buffer
                pools[into.pool] = max(pools.get(into.pool, 0), into.end * into.dtype.itemsize)
                sizes = []
            rows.append([(nb, cats[(a.name, j)]) for j, nb in enumerate(sizes) if nb])
        regs = {a.name: a.registers for a in acts}
        base["gradients"] += sum(nb * regs[pool] for pool, nb in pools.items())
        persistent[r], out_bytes[r] = base, rows
    deltas: dict[int, list[tuple[float, int, int, str]]] = {r: [] for r in actors}
    for j in range(len(firings.reg_rank)):
        r, i = firings.reg_rank[j], firings.reg_node[j]
        free = firings.reg_free[j]
        free = free if free != float("inf") else end_s
        for nb, cat in out_bytes[r][i]:
            deltas[r].append((firings.reg_alloc[j], 1, nb, cat))
            deltas[r].append((free, 0, -nb, cat))
    result: dict[int, RankPeak] = {}
    for r, evs in deltas.items():
        evs.sort(key=lambda e: (e[0], e[1]))  # at one instant, frees before allocations
        now = dict(persistent[r])
        total = peak = sum(now.values())
        at, best = 0.0, dict(now)
        for t, _, nb, cat in evs:
            now[cat] += nb
            total += nb
            if total > peak:
                peak, at, best = total, t, dict(now)
        result[r] = RankPeak(peak, at * 1e6, best)
    return result
