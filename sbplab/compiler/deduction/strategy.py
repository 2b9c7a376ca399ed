"""A strategy: where ops run (placements, pipeline stages) and which SBP some tensors must have.

Hints name tensors by glob pattern (``"*.fc1.weight"``) and optionally by role (``param``,
``grad``, ``state``, ``input``); each carries a reason that error messages and explanations
quote. A *store* hint fixes how a tensor is kept (a parameter stored ``S(0)`` under ZeRO, a
gradient reduce-scattered to ``S(0)``); a *use* hint fixes how consumers read it (that same
parameter gathered to ``B`` for use). Everything not hinted is deduced.

A *signature* hint (``Strategy.signature``) names ops instead of tensors: those ops take the given
n-D signature, and deduction boxes their inputs to fit (see ``signature_hints``).

A strategy's placements may leave their device unbound (presets, search results, ``Placement(None,
...)``): ``bind_device(strategy, "cuda")`` binds them when a step is compiled for a device; a step
compiled device-free is bound by the cluster that runs it.

A hint a user writes must match something: a pattern that matches nothing is a ``HintError`` that
suggests close names. Presets' hints are ``required=False`` (their globs cover several model
families). Parallelism rules (``DataParallel("dp")``, ``ZeRO(3, "dp")``, ``TensorParallel("tp")``,
``Pipeline("pp", ...)``, see ``parallel/``) may stand in the hint list: each names a mesh axis and,
once the graph is known, hands deduction its hints and says what it did (presets are compositions of
them). What
every hint matched is kept in ``strategy.report`` after deduction; ``strategy.explain(model)`` shows it
without compiling.

``precision`` and ``recompute`` (see ``precision.py``) say how the step trades memory for speed.
"""

from __future__ import annotations

import fnmatch
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from ...errors import InputError, InputTypeError
from ...layout import LayoutError, check_layout
from ...ops.signature_text import HintError  # noqa: F401  (defined below the compiler: SignatureError is one)
from ...placement import DEVICE_TYPES, Placement
from ...sbp import NdSbp, as_nd_sbp, fmt_sbp
from ..ir import ROLES, Graph
from .precision import Precision, check_recompute

if TYPE_CHECKING:
    from .hint_report import HintReport
    from .parallel.base import ParallelRule
    from .signature_hints import SignatureHint


class TensorParallelWarning(UserWarning):
    """A tensor-parallel rule left layers whole (or, when the rule may miss, split nothing in a model).
    ``split_nothing`` tells the two apart for views that badge the preset (the StrategyEditor)."""

    def __init__(self, message: str, split_nothing: bool = False) -> None:
        super().__init__(message)
        self.split_nothing = split_nothing


class TensorParallelError(HintError):
    """A ``TensorParallel`` rule split nothing in the model: its mesh axis would only repeat the work."""


@dataclass(frozen=True)
class Hint:
    """``pattern`` (glob over tensor names) must have ``sbp``; ``why`` says who asked."""

    pattern: str
    sbp: object  # str, SBP or tuple; normalised against each matching tensor
    why: str = ""
    role: str | None = None  # only tensors of this role
    use: bool = False  # True: the SBP consumers read, not the one it is stored in
    only_if_fits: bool = False  # skip tensors too small for the split (a bias of 3 on 4 ranks)
    input_grad: int | None = None  # pattern names forward ops; the hint is on the total gradient of their input
    pin: bool = False  # consumers must read it as stored: no signature that would box it (Megatron weights)
    required: bool = True  # matching nothing is an error (False for presets' hints, which may miss)
    only: tuple[str, ...] | None = None  # of the pattern's matches, only these (names a parallelism rule resolved)

    def __post_init__(self) -> None:
        if self.role is not None and self.role not in ROLES:
            raise InputError(f"Hint role must be one of {ROLES} or None, got {self.role!r}")

    def matches(self, name: str, role: str) -> bool:
        return (self.role is None or self.role == role) and fnmatch.fnmatchcase(name, self.pattern)

    def describe(self) -> str:
        kind = "use" if self.use else "store"
        role = f" ({self.role}s)" if self.role else ""
        what = f"gradient of input {self.input_grad} of ops {self.pattern!r}" if self.input_grad is not None \
            else repr(self.pattern)
        return f"{kind} hint {what}{role}" + (f" [{self.why}]" if self.why else "")


DEFAULT_BUCKET_MB = 25.0  # torch DDP's bucket_cap_mb


@dataclass
class Strategy:
    """How to parallelise a training graph.

    ``placement`` is where everything runs by default. ``hints`` may hold parallelism rules as well as
    hints (``Strategy(sl.mesh(dp=2, tp=2), [sl.DataParallel("dp"), sl.TensorParallel("tp")])``): they
    move to ``rules``, and each sets itself up (a ``Pipeline`` cuts the mesh into stages). With ``stages`` (one placement per
    pipeline stage, all with the same mesh rank), forward ops are cut into contiguous stages,
    balanced by FLOPs unless ``stage_of`` maps module prefixes to stage numbers; backward and
    update ops follow their forward op. ``micro_batches`` splits each step's batch. ``signatures``
    are the ops told which signature to take (``signature``). ``bucket_mb``: parameter gradients of
    one group are reduced in buckets of about this many MiB, as DDP does (its default); 0 reduces
    each gradient on its own. ``micro_batches`` without ``stages`` is gradient accumulation.
    ``precision`` (``sl.Precision.mixed("bf16")``: bf16 compute under torch.autocast, fp32 master
    weights, gradients and optimizer states) and ``recompute`` ("full": each layer's forward rerun in
    its backward; "selective": attention cores) change the graph the runtime executes
    (``compiler/training/precision_pass.py``, ``recompute.py``).
    """

    placement: Placement
    hints: list[Hint] = field(default_factory=list)
    stages: list[Placement] | None = None
    stage_of: dict[str, int] = field(default_factory=dict)
    micro_batches: int = 1
    name: str = "custom"
    bucket_mb: float = DEFAULT_BUCKET_MB
    signatures: list[SignatureHint] = field(default_factory=list)
    rules: list[ParallelRule] = field(default_factory=list)  # parallelisms over named mesh axes
    report: HintReport | None = field(default=None, repr=False, compare=False)  # set by the last deduction
    precision: Precision = field(default_factory=Precision)  # dtypes of compute, master weights, grads, states
    recompute: str = "none"  # "none" | "full" | "selective": activations the backward recomputes

    def __post_init__(self) -> None:
        from .parallel.base import ParallelRule

        items = list(self.hints)
        self.hints = [h for h in items if not isinstance(h, ParallelRule)]
        self.rules = [*self.rules, *(r for r in items if isinstance(r, ParallelRule))]
        bad = [x for x in (*self.hints, *self.rules) if not isinstance(x, (Hint, ParallelRule))]
        if bad:
            raise InputTypeError(f"Strategy hints are sl.Hint or parallelism rules (sl.DataParallel, sl.ZeRO, "
                                 f"sl.TensorParallel, sl.Pipeline); got {type(bad[0]).__name__}: {bad[0]!r}")
        if not isinstance(self.precision, Precision):
            raise InputTypeError(f"Strategy.precision must be an sl.Precision, got {type(self.precision).__name__}")
        check_recompute(self.recompute)
        if not isinstance(self.placement, Placement):
            raise InputTypeError(f"Strategy.placement must be an sl.Placement, got {type(self.placement).__name__}")
        for rule in self.rules:
            rule.setup(self)
        if self.micro_batches < 1:
            raise InputError(f"Strategy.micro_batches must be >= 1, got {self.micro_batches}")
        if not self.bucket_mb >= 0:
            raise InputError(f"Strategy.bucket_mb must be >= 0 MiB (0: no buckets), got {self.bucket_mb}")
        if self.stages is not None:
            if not self.stages:
                raise InputError("Strategy.stages must list at least one placement")
            nd = {p.ndim for p in self.stages}
            if len(nd) != 1:
                raise InputError(f"all pipeline stages must have meshes of the same rank, got ndims {sorted(nd)}")
            for s in self.stage_of.values():
                if not 0 <= s < len(self.stages):
                    raise InputError(f"stage_of names stage {s}, but there are {len(self.stages)} stages")
        written = {p.device_type for p in self.placements} - {None}
        if len(written) == 1 and any(not p.bound for p in self.placements):  # a device written once binds the rest
            self._bind(written.pop())

    @property
    def placements(self) -> list[Placement]:
        """Every placement of the strategy: the default one, then the stages'."""
        return [self.placement, *(self.stages or ())]

    @property
    def device_type(self) -> str | None:
        """The device its placements are bound to; None while the strategy is device-free."""
        devices = {p.device_type for p in self.placements}
        return devices.pop() if len(devices) == 1 else None

    def _bind(self, device_type: str) -> None:
        self.placement = self.placement.bind(device_type)
        if self.stages is not None:
            self.stages = [p.bind(device_type) for p in self.stages]

    @property
    def mesh_ndim(self) -> int:
        return self.stages[0].ndim if self.stages else self.placement.ndim

    @property
    def n_stages(self) -> int:
        return len(self.stages) if self.stages else 1

    def hint(self, pattern: str, sbp, why: str = "", role: str | None = None, use: bool = False,
             only_if_fits: bool = False, pin: bool = False, required: bool = True) -> Strategy:
        """Add a hint; returns self so hints chain. A ``required`` hint matching nothing is a HintError."""
        self.hints.append(Hint(pattern, sbp, why, role, use, only_if_fits, pin=pin, required=required))
        return self

    def hint_input_grad(self, op_pattern: str, index: int, sbp, why: str = "", required: bool = True) -> Strategy:
        """The total gradient of input ``index`` of the forward ops matching ``op_pattern`` must be
        ``sbp``: Megatron's "f" (identity forward, all-reduce backward) is such a hint."""
        self.hints.append(Hint(op_pattern, sbp, why, input_grad=index, required=required))
        return self

    @property
    def splits_weights(self) -> bool:
        """Whether some weight is split inside a stage (tensor parallel, signature hints or pins)."""
        return any(r.splits_weights for r in self.rules) or bool(self.signatures) or any(h.pin for h in self.hints)

    @property
    def schedule(self) -> str | None:
        """The pipeline schedule a ``Pipeline`` rule names; None without one."""
        return next((r.schedule for r in self.rules if hasattr(r, "schedule")), None)

    def match_report(self, graph: Graph) -> HintReport:
        """What each hint, parallelism rule and signature hint matches in ``graph``; raises nothing but
        the errors of a rule's own arguments (an axis the mesh lacks, globs naming no layer)."""
        from .hint_report import HintMatch, HintReport

        by_role, positions = _by_role(graph), {}
        matches, uses = [], []
        for rule in self.rules:
            use = rule.resolve(graph, self)
            uses.append((rule, use))
            matches += [HintMatch(h, self._targets(graph, h, by_role, positions),
                                source=rule.describe()) for h in use.hints]
        matches += [HintMatch(h, self._targets(graph, h, by_role, positions), source="user" if h.required else "preset")
                    for h in self.hints]
        names = [op.name for op in graph.ops]
        known = set(names)

        def named(pattern: str) -> list[str]:  # a search result's thousands of exact names: looked up, not scanned
            name = _literal(pattern)
            if name is not None:
                return [name] if name in known else []
            match = _glob(pattern)
            return [n for n in names if match(n)]

        sigs = [(h, named(h.pattern)) for h in self.signatures]
        return HintReport(self.name, matches, uses, sigs)

    def _say(self, report: HintReport) -> None:
        """At compile time: a tensor-parallel rule that split nothing is an error (a warning for the
        presets' rules, which meet every model), and one that left layers whole warns naming them."""
        for rule, use in report.rules:
            if not getattr(rule, "splits_weights", False):
                continue
            if not use.applied:
                first = use.warnings[0][:240] if use.warnings else "no layer with a weight read by a matmul"
                why = f"{len(use.warnings)} layer group(s) left whole; first: {first}"
                if getattr(rule, "required", True):
                    raise TensorParallelError(
                        f"tensor_parallel split nothing in this model ({rule.describe()} on {self.name!r}): {why}; "
                        f"strategy.explain(model) says why for each layer; drop the rule or split layers by hand "
                        f"with hints")
                warnings.warn(TensorParallelWarning(
                    f"{self.name}: tensor parallelism split nothing in this model ({why}); these layers run whole "
                    f"on every rank of mesh axis {rule.axis}; strategy.explain(model) says why for each",
                    split_nothing=True), stacklevel=3)
            elif use.warnings:
                shown = "; ".join(_short(w) for w in use.warnings[:4]) + \
                    (f"; ... ({len(use.warnings)} in all)" if len(use.warnings) > 4 else "")
                warnings.warn(TensorParallelWarning(f"{self.name}: {rule.describe()} left some layers whole ({shown})"),
                              stacklevel=3)

    def explain(self, model: Any, example_inputs: Any = None, loss_fn: Callable | None = None,
                target: Any = None) -> str:
        """Per hint, what it matches in ``model`` (a torch module, a Graph or a compiled step); per
        parallelism rule what it did (tensor parallel: which layers it paired and why others were not)."""
        from .hint_report import training_graph

        graph = training_graph(model, example_inputs, loss_fn, target, self.micro_batches)
        return self.match_report(graph).text()

    def signature(self, op_pattern: str, sig, why: str = "") -> Strategy:
        """Ops whose names match ``op_pattern`` (a glob; ``signature_hints.escape`` makes one from a
        name) take ``sig``: an ``NdSignature`` or text like ``"S(0), B -> S(0)"`` (1-D meshes) or
        ``"(S(0), B), (B, S(1)) -> (S(0), S(1))"``. Returns self so hints chain."""
        from .signature_hints import SignatureHint

        self.signatures.append(SignatureHint(op_pattern, sig, why))
        return self

    def _targets(self, graph: Graph, h: Hint, by_role: dict[str | None, list[str]],
                 positions: dict | None = None) -> list[str]:
        if h.input_grad is None:
            if not any(c in h.pattern for c in "*?["):  # one name (tensor parallel's hints): no scan
                t = graph.tensors.get(h.pattern)
                hit = t is not None and (h.role is None or t.role == h.role)
                return [h.pattern] if hit and (h.only is None or h.pattern in h.only) else []
            match = _glob(h.pattern)
            if h.only is not None and positions is not None and len(h.only) < len(by_role[h.role]) // 8:
                # a rule's few names (tensor parallel's, per pair): looked up, not matched against every tensor
                pos = _positions(by_role, h.role, positions)
                return sorted({n for n in h.only if n in pos and match(n)}, key=pos.__getitem__)
            return [n for n in by_role[h.role] if match(n) and (h.only is None or n in h.only)]
        out = []
        for op in graph.ops:
            if op.phase == "forward" and fnmatch.fnmatchcase(op.name, h.pattern) and h.input_grad < len(op.inputs) \
                    and (h.only is None or op.name in h.only):
                g = graph.tensor_grads.get(op.inputs[h.input_grad])
                if g is not None and g not in out:
                    out.append(g)
        return out

    def resolve_hints(self, graph: Graph) -> tuple[dict[str, tuple[NdSbp, Hint]], dict[str, tuple[NdSbp, Hint]]]:
        """Per tensor: (store SBP, hint) and (use SBP, hint); disagreeing hints raise HintError, and so
        does a required hint (or a TensorParallel rule's own glob) that matches nothing."""
        from .hint_report import unmatched_message

        report = self.match_report(graph)
        self._say(report)
        store: dict[str, tuple[NdSbp, Hint]] = {}
        use: dict[str, tuple[NdSbp, Hint]] = {}
        for m in report.matches:
            h = m.hint
            if not m.targets and h.required:
                raise HintError(unmatched_message(graph, h))
            for name in m.targets:
                t = graph.tensors[name]
                try:
                    nd = as_nd_sbp(h.sbp, self.mesh_ndim, len(t.shape), what=f"tensor {name!r} ({h.describe()})")
                except ValueError:
                    if h.only_if_fits:
                        m.skipped.append(name)
                        continue
                    raise
                if h.only_if_fits and not _fits(t.shape, nd, self.stages[0] if self.stages else self.placement):
                    m.skipped.append(name)
                    continue
                table = use if h.use else store
                if name in table and table[name][0] != nd:
                    old_nd, old_h = table[name]
                    raise HintError(
                        f"tensor {name!r} has contradictory {'use' if h.use else 'store'} hints: "
                        f"{fmt_sbp(old_nd)} from {old_h.describe()} and {fmt_sbp(nd)} from {h.describe()}; "
                        f"drop one of them or make the patterns disjoint"
                    )
                table.setdefault(name, (nd, h))
        self.report = report
        return store, use


def _short(reason: str, limit: int = 220) -> str:
    """A layer's reason, cut before the list of signatures it has (``explain`` shows all of it)."""
    reason = reason.split("; no signature reads")[0]
    return reason if len(reason) <= limit else reason[: limit - 3] + "..."


def bind_device(strategy: Strategy, device_type: str | None) -> Strategy:
    """``strategy`` with its device-free placements bound to ``device_type`` ("cpu" or "cuda"), as a new
    Strategy (the hints and rules are shared, the report is not); ``strategy`` itself when
    ``device_type`` is None or nothing needs binding. A placement already bound to another device is an
    InputError: a strategy written for cpu does not compile for cuda.

    ``sl.compile(..., device=...)`` calls it; a step compiled device-free gets its device from the
    cluster that runs it."""
    if not isinstance(strategy, Strategy):
        raise InputTypeError(f"bind_device needs an sl.Strategy, got {type(strategy).__name__}")
    if device_type is None:
        return strategy
    if device_type not in DEVICE_TYPES:
        raise InputError(f"device must be one of {DEVICE_TYPES} or None (device-free), got {device_type!r}")
    other = sorted({p.device_type for p in strategy.placements} - {None, device_type})
    if other:
        raise InputError(f"strategy {strategy.name!r} places ops on {', '.join(other)}, so it cannot be compiled for "
                         f"{device_type}; write its placements device-free (sl.Placement(None, ...), or a preset) to "
                         f"compile it for any device")
    if all(p.device_type == device_type for p in strategy.placements):
        return strategy
    bound = replace(strategy, hints=list(strategy.hints), stage_of=dict(strategy.stage_of),
                    signatures=list(strategy.signatures), rules=list(strategy.rules), report=None)
    bound._bind(device_type)
    return bound


def _by_role(graph: Graph) -> dict[str | None, list[str]]:
    """Tensor names, all (key None) and per role."""
    by_role: dict[str | None, list[str]] = {None: list(graph.tensors)}
    for n, t in graph.tensors.items():
        by_role.setdefault(t.role, []).append(n)
    for r in ROLES:
        by_role.setdefault(r, [])
    return by_role


def _positions(by_role: dict[str | None, list[str]], role: str | None, cache: dict) -> dict[str, int]:
    """Each tensor's place in ``by_role[role]`` (graph order), made once per role and report."""
    if role not in cache:
        cache[role] = {n: k for k, n in enumerate(by_role[role])}
    return cache[role]


@lru_cache(maxsize=1024)
def _literal(pattern: str) -> str | None:
    """The one name a glob without wildcards matches (``signature_hints.escape``'s ``[*]``, ``[?]`` and ``[[]``
    read back), or None for a glob with a wildcard or any other bracket."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c in "*?":
            return None
        if c == "[":
            if pattern[i + 1:i + 2] in ("*", "?", "[") and pattern[i + 2:i + 3] == "]":
                out.append(pattern[i + 1])
                i += 3
                continue
            return None
        out.append(c)
        i += 1
    return "".join(out)


def _glob(pattern: str) -> Callable[[str], object]:
    """A compiled matcher for a glob (``fnmatch.fnmatchcase`` without its per-call overhead)."""
    return re.compile(fnmatch.translate(pattern)).match


def _fits(shape, nd: NdSbp, placement: Placement) -> bool:
    try:
        check_layout(shape, placement, nd)
    except LayoutError:
        return False
    return True


def ranks_of(placements: Sequence[Placement]) -> list[int]:
    out: list[int] = []
    for p in placements:
        out += [r for r in p.rank_list if r not in out]
    return out
