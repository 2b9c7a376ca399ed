"""What the SearchPanel's inputs mean, and how a search result becomes StrategyEditor settings.

The panel offers the spec-sheet ``Hardware`` presets, each with the number of devices it has (a
search for 12 GPUs on one 8-GPU node has no mesh to run on); memory limits and time budgets are typed
as text with units. A searched strategy opens in the StrategyEditor as the one preset that adds no
hints of its own (a pipeline of its stages with nothing inside, one stage when it is not pipelined),
the searched signature of every forward op as the editor's per-op choices and the search's storage
hints (parameters, gradients, optimizer state, inputs) as the editor's tensor hints: so the editor
deduces exactly the signatures the search chose, and explains them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..hardware import Hardware
from ..sbp import fmt_sbp
from ..search.candidate import Candidate
from ..search.result import SearchResult


@dataclass(frozen=True)
class HardwareChoice:
    """A Hardware preset as the panel offers it."""

    label: str  # what the menu says
    make: Callable[[], Hardware]
    max_devices: int  # devices the machine has; a search for more has no mesh to run on


HARDWARE: dict[str, HardwareChoice] = {
    "h100_node": HardwareChoice("h100_node: 8 H100, NVLink", Hardware.h100_node, 8),
    "h100_ib_2": HardwareChoice("h100_ib(2): 2 nodes x 8 H100, InfiniBand", lambda: Hardware.h100_ib(2), 16),
    "a100_node": HardwareChoice("a100_node: 8 A100, NVLink", Hardware.a100_node, 8),
    # worker processes share this machine's cores: more than 8 only queue for them
    "cpu_box": HardwareChoice("cpu_box: this machine, ranks as processes", Hardware.cpu_box, 8),
}
METHODS = {  # sl.search's methods -> what the menu says
    "auto": "auto (by size)",
    "exact": "exact: ILP (Alpa)",
    "cd": "cd: coordinate descent (AutoDDL)",
    "mcmc": "mcmc: Metropolis-Hastings (FlexFlow)",
    "exhaustive": "exhaustive (tiny graphs)",
}
_BYTES = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SECONDS = {"": 1.0, "s": 1.0, "sec": 1.0, "ms": 1e-3, "min": 60.0}
_NUMBER = r"(\d+(?:\.\d*)?(?:e[+-]?\d+)?|\.\d+(?:e[+-]?\d+)?)"


def hardware_choice(key: str, devices: int) -> Hardware:
    """The Hardware preset ``key``, checked to have ``devices`` devices."""
    if key not in HARDWARE:
        raise ValueError(f"hardware {key!r}: pick one of {', '.join(HARDWARE)}")
    hw = HARDWARE[key]
    if isinstance(devices, int) and devices > hw.max_devices:
        raise ValueError(f"{devices} devices do not fit {hw.label}: no mesh of that machine has them; pick 1 to "
                         f"{hw.max_devices} devices" + (" (or h100_ib(2) for 16)" if hw.max_devices < 16 else ""))
    return hw.make()


def parse_bytes(text: str) -> int | None:
    """``""`` -> None (no limit); ``"80 GB"``, ``"512 MiB"``, ``"2e9"`` -> bytes (KB = 1000 B, KiB = 1024 B)."""
    t = text.strip().lower().replace(",", "")
    if t in ("", "none"):
        return None
    m = re.fullmatch(_NUMBER + r"\s*([a-z]*)", t)
    if not m or m.group(2) not in _BYTES:
        raise ValueError(f"memory limit {text.strip()!r}: write bytes per device like '80 GB', '512 MiB' or "
                         f"'2e9', or leave it blank for no limit")
    n = float(m.group(1)) * _BYTES[m.group(2)]
    if n < 1:
        raise ValueError(f"memory limit {text.strip()!r} is less than one byte; leave it blank for no limit")
    return int(n)


def parse_seconds(text: str) -> float | None:
    """``""`` -> None (no budget); ``"5"``, ``"5 s"``, ``"500 ms"``, ``"2 min"`` -> seconds."""
    t = text.strip().lower()
    if t in ("", "none"):
        return None
    m = re.fullmatch(_NUMBER + r"\s*([a-z]*)", t)
    if not m or m.group(2) not in _SECONDS:
        raise ValueError(f"time budget {text.strip()!r}: write seconds like '5', '500 ms' or '2 min', or leave "
                         f"it blank to search everything")
    s = float(m.group(1)) * _SECONDS[m.group(2)]
    if s <= 0:
        raise ValueError(f"time budget {text.strip()!r} must be more than 0 s; leave it blank for no budget")
    return s


def result_rows(res: SearchResult) -> list[dict[str, Any]]:
    """The chosen strategy, then the user's candidates and every preset: what ``res.table()`` lists, as data
    (each figure in the model that chose the winner, with its label: ``SearchResult.rows``)."""
    return res.rows()


@dataclass(frozen=True)
class EditorSettings:
    """StrategyEditor inputs that reproduce a searched candidate (``editor.configure(**settings.inputs())``)."""

    mesh: tuple[int, ...]  # the mesh of each stage
    stages: int
    micro_batches: int
    stage_of: dict[str, int]  # module unit -> stage
    choices: dict[str, str]  # forward op -> signature text
    hints: list[dict[str, Any]]  # {"pattern", "sbp", "role", "use"}: the search's storage decisions

    def inputs(self) -> dict[str, Any]:
        return {"preset": "pipeline", "inner": "none", "mesh_text": ", ".join(map(str, self.mesh)),
                "stages": self.stages, "micro_batches": self.micro_batches, "stage_of": dict(self.stage_of),
                "hints": list(self.hints), "choices": dict(self.choices)}


def editor_settings(c: Candidate) -> EditorSettings:
    """What the StrategyEditor needs to show candidate ``c`` (see the module docstring)."""
    st = c.strategy
    hints = [{"pattern": h.pattern, "sbp": fmt_sbp(h.sbp), "role": h.role or "", "use": h.use} for h in st.hints]
    return EditorSettings(tuple(c.mesh.shape), c.n_stages, c.micro_batches, dict(st.stage_of),
                          {name: repr(sig) for name, sig in c.signatures.items()}, hints)

