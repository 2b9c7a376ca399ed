"""Peak memory per rank from the simulated register lifetimes.

A State (parameter or optimizer state) holds its tensor for the whole run; its register hands out
that same tensor, so it is counted once, as persistent. Every other register holds its actor's
outputs from the start of the firing that produces them (the kernel allocates them, a posted
receive has its buffer) until every consumer has acked them (the runtime then drops them), which
is exactly the FiringGraph's ``released`` counter in the simulation. An Accumulate's buffer lives
from the first micro-batch of a step to its release. An actor that writes ``into`` a shared buffer (a
gradient bucket's, ``runtime.buffers``) allocates nothing: the buffers are persistent gradients, one
per register of the actor guarding them.

A fused chain (``runtime.fusion``: the runtime's default) holds only its last part's outputs in a
register; its inner parts' outputs live inside the one firing, so they are not counted.

The categories are ``runtime.memory_peak.categories``: the runtime measures a run's peak in the same
ones (``RunResult.memory``), so ``sl.compare`` lines the two up.
"""

from __future__ import annotations

from ..runtime.fusion import fuse_chains
from ..runtime.memory_peak import CATEGORIES, MemoryPeak, categories
from ..runtime.specs import Actor, State
from .engine import Firings
from .shapes import ActorShapes, nbytes

RankPeak = MemoryPeak  # the predicted peak is the same type as the measured one (``runtime.memory_peak``)
__all__ = ["CATEGORIES", "RankPeak", "categories", "held_between_steps", "peak_memory"]


def unheld(acts: list[Actor], chains: tuple | None = None) -> set[tuple[int, int]]:
    """(actor index, output) of the registers the runtime never holds: it fires a fused chain or gang
    (``runtime.fusion``) as one actor and hands the inner parts' outputs straight to the next part, so
    only what the fused actor outputs lives in a register (the last part's, or a gang's ``exposed``).
    ``chains``: ``fuse_chains(acts)`` when the caller has it already."""
    out: set[tuple[int, int]] = set()
    fused, origin = fuse_chains(acts) if chains is None else chains
    for fa, parts in zip(fused, origin):
        if len(parts) < 2:
            continue
        exposed = getattr(fa, "exposed", ())
        keep = ({(parts[p], o) for p, o in exposed} if exposed
                else {(parts[-1], j) for j in range(max(acts[parts[-1]].num_outputs, 1))})
        out |= {(i, j) for i in parts for j in range(max(acts[i].num_outputs, 1)) if (i, j) not in keep}
    return out


def held_between_steps(acts: list[Actor], shapes: dict[str, ActorShapes]) -> dict[str, int]:
    """Bytes per category a rank keeps from one step to the next (States: parameters and optimizer state;
    the shared gradient buffers): fixed by the plan, unlike the peak, which follows message timing."""
    return _persistent(acts, shapes, set())[0]


def _persistent(acts: list[Actor], shapes: dict[str, ActorShapes],
                inner: set[tuple[int, int]]) -> tuple[dict[str, int], list[list[tuple[int, str]]]]:
    """(bytes per category held for the whole run, per actor its registers' (bytes, category))."""
    cats = categories(acts)
    base = dict.fromkeys(CATEGORIES, 0)
    rows = []
    pools: dict[str, int] = {}
    for i, a in enumerate(acts):
        sizes = [nbytes(m) for m in shapes[a.name].outputs]
        if isinstance(a, State):
            base[cats[(a.name, 0)]] += sum(sizes)
            sizes = []  # its register is the persistent tensor itself
        into = getattr(a, "into", None)
        if into is not None:  # a view of the run's buffer
            pools[into.pool] = max(pools.get(into.pool, 0), into.end * into.dtype.itemsize)
            sizes = []
        rows.append([(nb, cats[(a.name, j)]) for j, nb in enumerate(sizes) if nb and (i, j) not in inner])
    regs = {a.name: a.registers for a in acts}
    base["gradients"] += sum(nb * regs[pool] for pool, nb in pools.items())
    return base, rows


def peak_memory(firings: Firings, actors: dict[int, list[Actor]], shapes: dict[int, dict[str, ActorShapes]],
                end_s: float, fused: bool = True, chains: dict[int, tuple] | None = None) -> dict[int, RankPeak]:
    """Per simulated rank: the largest persistent + live register bytes over the simulated run.
    ``fused``: as the runtime fires by default, the inner outputs of fused chains held by no register.
    ``chains``: per rank, ``fuse_chains`` of its actors, where the caller made them already."""
    persistent: dict[int, dict[str, int]] = {}
    out_bytes: dict[int, list[list[tuple[int, str]]]] = {}
    chains = chains or {}
    for r, acts in actors.items():
        persistent[r], out_bytes[r] = _persistent(acts, shapes[r], unheld(acts, chains.get(r)) if fused else set())
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
        result[r] = MemoryPeak(peak, best, at * 1e6, "simulated")
    return result
