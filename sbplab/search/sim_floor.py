"""A floor under a candidate's simulated step time, from its forward ops alone: the re-rank skips the
compile and simulation of a candidate whose floor is already above the best simulated step time.

Why: at 64 ranks one compile and simulation takes seconds, and the re-rank runs one per preset; most
presets cannot come near the winner. What makes the floor a floor: ``sl.simulate`` runs one compute lane
per rank, one firing at a time, and prices a compute firing as ``hw.op_time`` of the op on its local
input shapes, with the registry's FLOPs on local shapes and the bytes of its local inputs and outputs
(``sim/firing_cost.py``). Every forward op of the candidate is such a firing, once per micro-batch, on
every rank of its stage, with the local shapes its signature gives; backward ops, updates, boxing and
firing overheads only add to the lane. So over a long run a step takes at least, on its busiest stage,

    micro_batches x sum over the stage's forward ops of hw.op_time(op, local shapes).

``sl.simulate`` reports the mean of a short window (from the end of step 0 to the end of step 2), and a
rank may begin its next step's first ops before the last firing of step 0 (on any rank) ends, so that
window can come out a little below the long-run figure (1.1% below the floor for GPT-2 small under
Megatron tensor parallel on 8 H100; 0.4% with 6 steps). So a candidate is skipped only when its floor
is more than ``MARGIN`` above the best simulated step time.

The floor is priced the simulator's way, not the search's (which prices bytes by the op registry's own
count and backward ops by a roofline). A hardware with measured op times gets no floor (0): a table
key the search and the runtime name differently would price one op two ways. The re-rank checks the
floor on every candidate it does simulate, and stops skipping if one ever came out below it.
"""

from __future__ import annotations

import numpy as np

from ..hardware import Hardware
from ..sim.firing_cost import device_of
from .candidate import Candidate
from .deduced_floor import deduced_floor, local_kernel_seconds

MARGIN = 0.05  # how far below its floor the simulator's 3-step window may put a step (see above), and more


def sim_floor(c: Candidate, hw: Hardware, cache: dict | None = None) -> float:
    """Seconds per step ``sl.simulate`` cannot go below for ``c`` (see the module docstring); 0 where the
    hardware has measured op times or an op's local shapes cannot be read."""
    if hw.op_times:
        return 0.0
    pr = c.problem
    view = c.mesh.hardware(hw)
    placement = c.mesh.placement()
    device = placement.device_type or device_of(view)
    cache = ({} if cache is None else cache).setdefault((c.mesh, device), {})  # prices per mesh and device
    per_stage = np.zeros(max(1, c.n_stages))
    try:
        for k, o in enumerate(pr.ops):
            s = c.stage_of_op[k] if c.stage_of_op else 0
            t = local_kernel_seconds(o.op, pr.graph, o.sigs[c.assign[k]], placement, placement.rank_list[0], view,
                                     device, None, cache)
            per_stage[s] += t or 0.0  # a layout the registry cannot localise adds nothing
    except (ValueError, KeyError, IndexError, TypeError):  # a layout the registry cannot localise: no floor
        return 0.0
    return float(per_stage.max()) * c.micro_batches


class Floors:
    """The re-rank's use of ``sim_floor``: which candidates it need not simulate, checked as it goes.

    A searched finalist is skipped when its floor is above the best step time simulated so far within the
    memory limit (it cannot win); a preset only when its floor is also above the best simulated preset (it
    cannot be the best preset a table names either), in both cases by more than ``MARGIN``. The user's
    candidates are always simulated. Each
    skipped candidate keeps its floor (``Candidate.sim_floor``): tables show it as "at least". Not used
    when the finalists are measured (then the measured time decides, not the simulated one)."""

    def __init__(self, hw: Hardware, active: bool = True) -> None:
        self.hw, self.active = hw, active and not hw.op_times
        self.cache: dict = {}
        self.best = float("inf")  # best simulated step time within the memory limit
        self.best_preset = float("inf")  # best simulated preset, whatever its memory
        self.skipped: list[Candidate] = []
        self.deduced: dict[int, float] = {}  # id(candidate) -> its deduction's floor, where one was taken
        self.broken = ""

    def cannot_win(self, c: Candidate) -> bool:
        """Whether ``c``'s forward-op floor (``sim_floor``, before compiling) rules it out."""
        return self._above(c, lambda: sim_floor(c, self.hw, self.cache))

    def cannot_win_deduced(self, c: Candidate, d, view: Hardware) -> bool:
        """Whether ``c``'s deduction ``d`` rules it out: the floor of every op and collective of its step
        (``deduced_floor.py``) on ``view``, its mesh's view of the hardware; kept for ``check``. A floor that
        cannot be worked out is none (0): it may spare work, never drop a finalist the re-rank would run."""
        def floor() -> float:
            try:
                f = deduced_floor(d, view)
            except Exception:  # noqa: BLE001 - an op or kind the floor cannot price: no floor, simulate it
                f = 0.0
            return self.deduced.setdefault(id(c), f)

        return self._above(c, floor)

    def _above(self, c: Candidate, floor) -> bool:
        if not self.active:
            return False
        ref = max(self.best, self.best_preset) if c.method == "preset" else self.best
        if ref == float("inf"):
            return False
        f = floor()
        if f * (1 - MARGIN) > ref:
            c.sim_floor = f
            self.skipped.append(c)
            return True
        return False

    def check(self, c: Candidate, within_limit: bool) -> None:
        """Record ``c``'s simulated time; if it came out below its floor, stop skipping (and say so)."""
        t = float(c.simulated_time)
        if within_limit:
            self.best = min(self.best, t)
        if c.method == "preset":
            self.best_preset = min(self.best_preset, t)
        if self.active:
            f = max(sim_floor(c, self.hw, self.cache), self.deduced.get(id(c), 0.0))
            if t < f * (1 - MARGIN):
                self.active = False
                self.broken = (f"{c.describe()} simulated at {t * 1e3:.4g} ms/step, more than {MARGIN:.0%} below "
                               f"its floor of {f * 1e3:.4g} ms: no further finalist was skipped by its floor")

    def note(self, notes: list[str]) -> None:
        if self.skipped:
            names = ", ".join(f"{c.label} (at least {c.sim_floor * 1e3:.4g} ms)" for c in self.skipped[:6])
            more = f", and {len(self.skipped) - 6} more" if len(self.skipped) > 6 else ""
            n = len(self.skipped)
            notes.append(f"{n} finalist{'s' if n > 1 else ''} not simulated: {names}{more}. Their forward ops alone, "
                         f"or once deduced every op or every collective of the step on one rank, priced as "
                         f"sl.simulate prices them, take over {MARGIN:.0%} longer than the best step time "
                         f"simulated (a preset's, also than the best simulated preset), so they could not have "
                         f"been chosen")
        if self.broken:
            notes.append(self.broken)
