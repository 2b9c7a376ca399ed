"""The ring algorithms behind the boxing table, drawn step by step: reduce-scatter, all-gather and
all-reduce (the first then the second) on p ranks, each rank's tensor cut into p chunks.

Why: the table says an all-gather moves ``T(p-1)/p`` bytes per rank; the pictures show where that comes
from. In each of the p - 1 steps every rank sends one chunk (``T/p`` bytes) to its right-hand
neighbour, all at once, so every link is busy and no rank sends more than anyone else.

    steps = ring_steps("all_reduce", 4)      # list[RingStep]: who sends which chunk, what each rank holds
    ring_picture("reduce_scatter", 4)        # one small grid per step (HTML/SVG in a notebook)
    ring_run("all_reduce", shards)           # the same schedule on real tensors (checked against a sum)
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from ..errors import InputError

# per kind: (has a reduce-scatter phase, has an all-gather phase); an all-reduce is the first then the second
PHASES = {"reduce_scatter": (True, False), "all_gather": (False, True), "all_reduce": (True, True)}
KINDS = tuple(PHASES)


@dataclass(frozen=True)
class RingStep:
    """One step: ``sends[r]`` is the chunk rank r sends to rank (r + 1) % p; ``holds[r][c]`` the ranks whose
    contribution rank r's chunk c holds afterwards (empty: rank r does not have chunk c)."""

    phase: str  # "reduce-scatter" or "all-gather"
    index: int  # step number within the whole collective, from 1
    sends: tuple[int, ...]
    holds: tuple[tuple[frozenset[int], ...], ...]


def ring_steps(kind: str, p: int) -> list[RingStep]:
    """The steps of ``kind`` on ``p`` ranks (step 0, the start, is not included)."""
    if kind not in KINDS:
        raise InputError(f"ring_steps: kind must be one of {KINDS}, got {kind!r}")
    if p < 2:
        raise InputError(f"ring_steps: a ring needs at least 2 ranks, got {p}")
    reduces, gathers = PHASES[kind]
    if not reduces:  # rank r starts with its own chunk r, complete
        holds = [[frozenset(range(p)) if c == r else frozenset() for c in range(p)] for r in range(p)]
    else:  # every rank starts with its own addend of every chunk
        holds = [[frozenset({r}) for _ in range(p)] for r in range(p)]
    out: list[RingStep] = []
    if reduces:
        for s in range(p - 1):  # rank r sends chunk (r - s) % p; the receiver adds it to its own
            sends = tuple((r - s) % p for r in range(p))
            new = [list(row) for row in holds]
            for r in range(p):
                dst, c = (r + 1) % p, sends[r]
                new[dst][c] = holds[dst][c] | holds[r][c]
            holds = new
            out.append(RingStep("reduce-scatter", len(out) + 1, sends, tuple(map(tuple, holds))))
        # rank r now holds chunk (r + 1) % p summed over every rank: keep only that one
        holds = [[holds[r][c] if c == (r + 1) % p else frozenset() for c in range(p)] for r in range(p)]
        if not gathers:
            return out
    first = 1 if reduces else 0  # the chunk each rank has complete at the start of the gather
    for s in range(p - 1):  # rank r passes on the complete chunk it got last; the receiver keeps a copy
        sends = tuple((r + first - s) % p for r in range(p))
        new = [list(row) for row in holds]
        for r in range(p):
            new[(r + 1) % p][sends[r]] = holds[r][sends[r]]
        holds = new
        out.append(RingStep("all-gather", len(out) + 1, sends, tuple(map(tuple, holds))))
    return out


def ring_run(kind: str, shards: list) -> list:
    """Run ``kind`` with the ring schedule on ``shards`` (one tensor per rank, same shape, first dim
    divisible by p): what each rank ends with (a chunk for reduce-scatter, the whole otherwise)."""
    import torch

    p = len(shards)
    chunks = [list(torch.chunk(t.clone(), p)) for t in shards]
    steps = ring_steps(kind, p)  # checks kind and p
    reduces, gathers = PHASES[kind]
    if not reduces:
        have = [[chunks[r][c] if c == r else None for c in range(p)] for r in range(p)]
    else:
        have = [list(row) for row in chunks]
    for st in steps:
        msgs = [(r, st.sends[r], have[r][st.sends[r]].clone()) for r in range(p)]  # all send at once
        for r, c, t in msgs:
            dst = (r + 1) % p
            have[dst][c] = have[dst][c] + t if st.phase == "reduce-scatter" else t
    if not gathers:
        return [have[r][(r + 1) % p] for r in range(p)]
    return [torch.cat(row) for row in have]


@dataclass
class RingPicture:
    """Step-by-step grids of one ring collective; shows as HTML in a notebook."""

    kind: str
    p: int

    def html(self) -> str:
        steps = ring_steps(self.kind, self.p)
        panels = [_panel(st, self.p) for st in steps]
        title = (f"{self.kind.replace('_', '-')} on a ring of {self.p} ranks: {len(steps)} steps, each rank "
                 f"sends one chunk (T/{self.p}) to its right-hand neighbour per step")
        return (f'<div class="sbplab-ring"><div style="font-weight:600;margin:4px 0">{escape(title)}</div>'
                f'<div style="display:flex;flex-wrap:wrap;gap:10px">{"".join(panels)}</div></div>')

    def _repr_html_(self) -> str:
        return self.html()


def ring_picture(kind: str, p: int = 4) -> RingPicture:
    """One grid per step of ``kind`` on ``p`` ranks: rows are ranks, columns chunks; a cell says whose
    addends it sums (``0+1+2``) or that the chunk is complete (``Σ``); cells just received are outlined,
    and the arrows name the chunk each rank sent."""
    ring_steps(kind, p)  # checks the arguments now, not when drawn
    return RingPicture(kind, p)


def _panel(st: RingStep, p: int) -> str:
    cell, left, top = 40, 58, 34
    w, h = left + p * cell + 6, top + p * cell + 8
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="Helvetica, sans-serif" '
             f'font-size="11" fill="currentColor">',
             f'<text x="4" y="13" font-weight="bold">step {st.index}: {escape(st.phase)}</text>']
    for c in range(p):
        parts.append(f'<text x="{left + c * cell + cell / 2}" y="{top - 6}" text-anchor="middle">chunk {c}</text>')
    for r in range(p):
        y = top + r * cell
        parts.append(f'<text x="4" y="{y + cell / 2 + 4}">rank {r}</text>')
        got = st.sends[(r - 1) % p]  # the chunk rank r received this step
        for c in range(p):
            who = st.holds[r][c]
            full = len(who) == p
            fill = "#4e79a7" if full else "#a0cbe8" if who else "none"
            stroke = 'stroke="#e15759" stroke-width="3"' if c == got else 'stroke="currentColor" stroke-opacity="0.4"'
            x = left + c * cell
            parts.append(f'<rect x="{x + 1}" y="{y + 1}" width="{cell - 2}" height="{cell - 2}" fill="{fill}" {stroke}/>')
            text = "Σ" if full else "+".join(map(str, sorted(who)))
            color = "#ffffff" if full else "#000000"
            size = 11 if len(text) <= 5 else 9
            parts.append(f'<text x="{x + cell / 2}" y="{y + cell / 2 + 4}" text-anchor="middle" font-size="{size}" '
                         f'fill="{color}">{escape(text)}</text>')
    parts.append(f'<text x="4" y="{h - 1}" font-size="9">outlined: chunk received from rank r-1</text>')
    parts.append("</svg>")
    return "".join(parts)


__all__ = ["KINDS", "RingPicture", "RingStep", "ring_picture", "ring_run", "ring_steps"]
