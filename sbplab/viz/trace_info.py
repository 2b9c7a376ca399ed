"""What a trace's actor was, in the compiler's words: the module path, the SBPs in and out, the mesh axis.

A trace knows actors by name (``n12``, ``n12.term``, ``n40.send0``, ``c3``): lowering names every
actor after the physical node it runs (``n<id>``) or its entry in the global collective order
(``c<index>``). Given the compiled step, each name leads back to its ``PhysNode``, and from there to
the logical op's module path and the SBP each input and output is a piece of, which is what a
person hovering over a bar wants to read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import InputTypeError
from ..sbp import fmt_sbp
from .physical_dot import module_of

_NODE = re.compile(r"^n(\d+)(?:\.|$)")
_COLL = re.compile(r"^c(\d+)$")
_BUCKET = re.compile(r"^b(\d+)(?:\.|$)")


@dataclass(frozen=True)
class ActorInfo:
    """What one actor of a compiled step does: ``module`` path, ``sbp`` (``in, in -> out``), the
    ``tensor`` a boxing step moves, and its mesh axis name."""

    module: str = ""
    sbp: str = ""
    tensor: str = ""
    axis_name: str = ""


class ActorLookup:
    """``lookup(rank, actor)`` -> ActorInfo for the actors of ``compiled`` (a ``sl.compile`` result)."""

    def __init__(self, compiled: Any) -> None:
        if not hasattr(compiled, "physical") or not hasattr(compiled, "graph"):
            raise InputTypeError(f"compiled= takes a compiled step (sl.compile(...)), got {type(compiled).__name__}")
        self.phys, self.graph = compiled.physical, compiled.graph
        self._cache: dict[tuple[Any, str], ActorInfo] = {}
        strategy = getattr(compiled, "strategy", None)
        self._bucket_mb = getattr(strategy, "bucket_mb", 0.0) or 0.0
        self._buckets: list | None = None

    def bucket_members(self, index: int) -> list[int]:
        """The collectives (indices into ``phys.collectives``) bucket ``b<index>`` runs as one, as
        lowering groups them (``plan_buckets`` with the strategy's ``bucket_mb``)."""
        if self._buckets is None:
            from ..compiler.lowering.buckets import plan_buckets

            self._buckets = plan_buckets(self.phys, self.graph, self._bucket_mb * 2**20)
        return list(self._buckets[index].collectives) if index < len(self._buckets) else []

    def node_of(self, rank: Any, actor: str) -> Any:
        """The PhysNode an actor runs, or None (sinks, hand-made names)."""
        m = _NODE.match(actor)
        if m:
            i = int(m.group(1))
            return self.phys.nodes[i] if i < len(self.phys.nodes) else None
        m = _COLL.match(actor)
        if m and int(m.group(1)) < len(self.phys.collectives):
            for i in self.phys.collectives[int(m.group(1))].nodes:
                if self.phys.nodes[i].rank == rank:
                    return self.phys.nodes[i]
        return None

    def __call__(self, rank: Any, actor: str) -> ActorInfo:
        key = (rank, actor)
        if key not in self._cache:
            self._cache[key] = self._info(rank, actor)
        return self._cache[key]

    def _info(self, rank: Any, actor: str) -> ActorInfo:
        m = _BUCKET.match(actor)
        if m:
            return self._bucket_info(rank, int(m.group(1)))
        n = self.node_of(rank, actor)
        if n is None:
            return ActorInfo()
        module = module_of(self.graph, n.logical)
        step = n.attrs.get("plan_step") if n.kind == "boxing" else None
        if step is not None:
            axis = "" if step.mesh_axis is None else step.placement.axis_label(step.mesh_axis)
            return ActorInfo(module, f"{fmt_sbp(step.src_sbp)} -> {fmt_sbp(step.dst_sbp)}", n.logical, axis)
        ins = [self.phys.nodes[r.node].out_sbps[r.out] for r in n.inputs
               if r.out < len(self.phys.nodes[r.node].out_sbps)]
        outs = ", ".join(fmt_sbp(s) for s in n.out_sbps)
        sbp = f"{', '.join(fmt_sbp(s) for s in ins)} -> {outs}" if ins else outs
        return ActorInfo(module, sbp, n.logical if n.kind == "source" else "")

    def _bucket_info(self, rank: Any, index: int) -> ActorInfo:
        """A gradient bucket: the tensors it reduces in one collective, their SBP before and after."""
        steps, tensors, modules = [], [], []
        for ci in self.bucket_members(index):
            for i in self.phys.collectives[ci].nodes:
                n = self.phys.nodes[i]
                if n.rank == rank:
                    tensors.append(n.logical)
                    modules.append(module_of(self.graph, n.logical))
                    steps.append(n.attrs.get("plan_step"))
        if not tensors or steps[0] is None:
            return ActorInfo()
        s = steps[0]
        axis = "" if s.mesh_axis is None else s.placement.axis_label(s.mesh_axis)
        shown = ", ".join(tensors[:3]) + (f" and {len(tensors) - 3} more" if len(tensors) > 3 else "")
        return ActorInfo(", ".join(dict.fromkeys(m for m in modules if m)), f"{fmt_sbp(s.src_sbp)} -> "
                         f"{fmt_sbp(s.dst_sbp)}", f"a bucket of {len(tensors)} gradients ({shown})", axis)

    def axis_names(self) -> dict[int, str]:
        """Mesh axis index -> name, from the placements the step's collectives run on."""
        out: dict[int, str] = {}
        for c in self.phys.collectives:
            if c.mesh_axis is None or c.mesh_axis in out:
                continue
            step = self.phys.nodes[c.nodes[0]].attrs.get("plan_step")
            if step is not None and step.placement.axis_names:
                out[c.mesh_axis] = step.placement.axis_label(c.mesh_axis)
        return out
