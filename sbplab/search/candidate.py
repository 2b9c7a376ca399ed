"""A candidate: a full choice (mesh, ZeRO level, stages, micro-batches, a signature per forward op)
with its analytic price, and its Strategy once it is needed."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..compiler.deduction.strategy import DEFAULT_BUCKET_MB, Strategy
from ..ops.registry import NdSignature
from .mesh import MeshChoice
from .pipeline import stage_prefixes
from .problem import OpProblem
from .to_strategy import strategy_for


@dataclass
class Candidate:
    label: str  # what it is: "searched (exact)", or a preset's name
    method: str  # "exhaustive" | "exact" | "cd" | "mcmc" | "preset"
    mesh: MeshChoice
    zero: int
    n_stages: int
    micro_batches: int
    assign: list[int] = field(repr=False)
    step_time: float  # analytic seconds per step
    memory: int  # analytic bytes per device (the largest stage's)
    problem: OpProblem = field(repr=False)
    stage_of_op: list[int] | None = field(default=None, repr=False)
    simulated_time: float | None = None  # sl.simulate's step time, when re-ranked
    simulated_memory: int | None = None
    measured_time: float | None = None  # seconds per step on real workers (``sl.search(measure_on=...)``)
    sim_floor: float | None = None  # not simulated: sl.simulate would predict at least this (``sim_floor.py``)
    note: str = ""
    bucket_mb: float = DEFAULT_BUCKET_MB  # gradient bucket size (the re-rank may choose another)
    _strategy: Strategy | None = field(default=None, repr=False)

    @property
    def signatures(self) -> dict[str, NdSignature]:
        return self.problem.signatures(self.assign)

    @property
    def strategy(self) -> Strategy:
        if self._strategy is None:
            prefixes = stage_prefixes(self.problem, self.stage_of_op) if self.stage_of_op else None
            self._strategy = strategy_for(self.problem, self.assign, self.zero, self.describe(), self.n_stages,
                                          prefixes)
        if self._strategy.bucket_mb != self.bucket_mb:
            self._strategy = replace(self._strategy, bucket_mb=self.bucket_mb)
        return self._strategy

    def describe(self) -> str:
        shape = "x".join(map(str, self.mesh.shape))
        where = f"{self.n_stages} stages of mesh {shape} x {self.micro_batches} micro-batches" if self.n_stages > 1 \
            else f"mesh {shape}"
        return (f"{self.label}: {where}" + (f", ZeRO-{self.zero}" if self.zero else "")
                + (f", {self.bucket_mb:g} MiB buckets" if self.bucket_mb != DEFAULT_BUCKET_MB else ""))

    def feasible(self, limit: float | None) -> bool:
        return limit is None or self.memory <= limit
