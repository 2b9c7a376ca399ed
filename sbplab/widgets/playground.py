"""SbpPlayground: pick a tensor, a mesh and an SBP per mesh axis; see the layout and the boxing to a target.

The state is plain traitlets. People (or the front end) set the input traits; every change recomputes
the derived traits from the core objects (LayoutPicture, plan_boxing), so what the page shows is
exactly what ``sl.layout_picture`` and ``sl.boxing.plan_boxing`` say. Bad input becomes the ``error``
trait, shown inline by the front end; nothing raises out of an observer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
import traitlets as t

from ..fmt import fmt_bytes
from ..placement import Placement
from ..sbp import Split, fmt_sbp, parse_sbp
from ..viz.layout_picture import LayoutPicture
from . import static_view as static
from ._assets import widget_module, widget_style
from .parse import parse_dims
from .widget_base import SbplabWidget

DTYPES = ("float32", "float16", "bfloat16", "float64")
DEVICE_TYPES = ("cpu", "cuda")
MAX_RANKS = 64
MAX_TENSOR_DIMS = 4
MAX_MESH_DIMS = 3


def sbp_choices(tensor_ndim: int) -> list[str]:
    """What a mesh axis may pick for a tensor of ``tensor_ndim`` dims: B, P and one S(i) per dim."""
    return ["B", "P"] + [f"S({i})" for i in range(tensor_ndim)]


def button_testid(side: str, axis: int, value: str) -> str:
    """The ``data-testid`` of an SBP button in the page.

    ``button_testid("src", 0, "S(1)") == "src-axis0-S1"``
    """
    return f"{side}-axis{axis}-{value.replace('(', '').replace(')', '').replace(' ', '')}"


def _entries(sbp: Any) -> list[str]:
    """User SBP input (string, tuple, list of strings) -> one string per mesh axis."""
    if isinstance(sbp, str):
        return [repr(x) for x in parse_sbp(sbp)]
    return [x if isinstance(x, str) else repr(x) for x in sbp]


def _text(dims: Iterable[int]) -> str:
    return ", ".join(str(int(n)) for n in dims)




class SbpPlayground(SbplabWidget):
    """A tensor's layout under an SBP, and the boxing that takes it to a target SBP.

    ``SbpPlayground(shape=(8, 6), mesh=(2, 2), sbp="S(0), B", target="B, S(1)")``
    """

    _esm = widget_module("sbp_playground.js")
    _css = widget_style("sbp_playground.css")

    # --- inputs: set by people or by clicks in the page ---------------------------------------
    shape_text = t.Unicode("8, 6").tag(sync=True)  # tensor (global) shape, e.g. "8, 6"
    mesh_text = t.Unicode("2, 2").tag(sync=True)  # device mesh shape, ranks 0..n-1 row-major
    src_sbp = t.List(t.Unicode(), default_value=["S(0)", "B"]).tag(sync=True)  # one entry per mesh axis
    dst_sbp = t.List(t.Unicode(), default_value=["B", "B"]).tag(sync=True)  # the target, same length
    dtype = t.Unicode("float32").tag(sync=True)  # element type: sets bytes moved
    device_type = t.Unicode("cpu").tag(sync=True)  # cpu or cuda: picks the cost model's links

    # --- derived: written here, read by the page -----------------------------------------------
    shape = t.List(t.Int()).tag(sync=True)
    mesh_shape = t.List(t.Int()).tag(sync=True)
    choices = t.List(t.Unicode()).tag(sync=True)  # buttons per mesh axis
    axis_names = t.List(t.Unicode()).tag(sync=True)
    src_svg = t.Unicode("").tag(sync=True)
    dst_svg = t.Unicode("").tag(sync=True)
    src_type = t.Unicode("").tag(sync=True)  # "from: f32[8@axis0,6] (S(0), B) local f32[4,6]"
    dst_type = t.Unicode("").tag(sync=True)
    local_shapes = t.List(t.Dict()).tag(sync=True)  # per rank: coords, src and dst local shapes
    steps = t.List(t.Dict()).tag(sync=True)  # boxing steps: kind, axis, from, to, bytes, time, why
    total_bytes = t.Int(0).tag(sync=True)
    time_us = t.Float(0.0).tag(sync=True)
    boxing_text = t.Unicode("").tag(sync=True)  # BoxingPlan.describe()
    error = t.Unicode("").tag(sync=True)  # what is wrong with the input; "" when all is well
    note = t.Unicode("").tag(sync=True)  # what was adjusted for you (e.g. a split dim that vanished)

    def __init__(self, shape: Iterable[int] = (8, 6), mesh: Iterable[int] = (2, 2), sbp: Any = "S(0), B",
                 target: Any = "B, B", dtype: str = "float32", device_type: str = "cpu",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._busy = False
        self.picture: LayoutPicture | None = None  # the source layout, when valid
        self.target_picture: LayoutPicture | None = None
        self.plan = None  # the BoxingPlan, when valid
        with self.hold_trait_notifications():
            self._busy = True
            self.shape_text, self.mesh_text = _text(shape), _text(mesh)
            self.src_sbp, self.dst_sbp = _entries(sbp), _entries(target)
            self.dtype, self.device_type = dtype, device_type
            self._busy = False
        self._recompute()

    def select(self, side: str, axis: int, value: str) -> None:
        """What a click does: set mesh ``axis`` of the ``"src"`` or ``"dst"`` SBP to ``value``."""
        if side not in ("src", "dst"):
            raise ValueError(f"side must be 'src' or 'dst', got {side!r}")
        name = f"{side}_sbp"
        cur = list(getattr(self, name))
        if not 0 <= axis < len(cur):
            raise ValueError(f"mesh axis {axis} out of range; the mesh has {len(cur)} axes")
        cur[axis] = value
        setattr(self, name, cur)

    @t.observe("shape_text", "mesh_text", "src_sbp", "dst_sbp", "dtype", "device_type")
    def _on_input(self, change: dict) -> None:
        if not self._busy:
            self._recompute()

    def static_html(self) -> str:
        """Both layouts, their types, and the boxing steps between them."""
        steps = [(s.get("kind", ""), s.get("axis", ""), s.get("from", ""), s.get("to", ""), s.get("bytes", ""))
                 for s in self.steps]
        shapes = [(r["rank"], tuple(r["coords"]), tuple(r["src"]), tuple(r.get("dst", ()))) for r in self.local_shapes]
        return static.card("SbpPlayground", [
            static.line(self.error), static.line(self.src_type), static.line(self.dst_type),
            static.table(("rank", "mesh coordinates", "local shape from", "local shape to"), shapes),
            static.table(("boxing step", "mesh axis", "from", "to", "bytes"), steps)])

    # --- the one place derived state is computed ---------------------------------------------
    def _recompute(self) -> None:
        self._busy = True
        try:
            with self.hold_sync(), self.hold_trait_notifications():
                self._clear()
                try:
                    self._derive()
                except Exception as e:  # shown inline; the message says what was wrong
                    if isinstance(e, KeyError):
                        self.error = str(e).strip("'\"")
                    elif isinstance(e, (ValueError, TypeError)):
                        self.error = str(e)
                    else:
                        self.error = f"{type(e).__name__}: {e}"
        finally:
            self._busy = False

    def _clear(self) -> None:
        self.picture = self.target_picture = self.plan = None
        self.src_svg = self.dst_svg = self.src_type = self.dst_type = self.boxing_text = ""
        self.local_shapes, self.steps = [], []
        self.total_bytes, self.time_us = 0, 0.0
        self.error = self.note = ""

    def _derive(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not offered; pick one of {', '.join(DTYPES)}")
        if self.device_type not in DEVICE_TYPES:
            raise ValueError(f"device type {self.device_type!r}: pick one of {', '.join(DEVICE_TYPES)}")
        shape = parse_dims(self.shape_text, "tensor shape", MAX_TENSOR_DIMS)
        mesh = parse_dims(self.mesh_text, "mesh shape", MAX_MESH_DIMS, max_total=MAX_RANKS)
        self.shape, self.mesh_shape = list(shape), list(mesh)
        self.choices = sbp_choices(len(shape))
        ranks = np.arange(int(np.prod(mesh))).reshape(mesh).tolist()
        placement = Placement(self.device_type, ranks)
        self.axis_names = [placement.axis_label(a) for a in range(placement.ndim)]
        notes: list[str] = []
        self.src_sbp = self._fit(self.src_sbp, len(shape), len(mesh), "source", notes)
        self.dst_sbp = self._fit(self.dst_sbp, len(shape), len(mesh), "target", notes)
        self.note = "; ".join(notes)
        dtype = getattr(torch, self.dtype)
        src = parse_sbp(", ".join(self.src_sbp))
        dst = parse_sbp(", ".join(self.dst_sbp))
        self.picture = LayoutPicture(shape, placement, src, dtype, name="from")
        self.src_svg, self.src_type = self.picture.to_svg(), self.picture.summary()
        self.target_picture = LayoutPicture(shape, placement, dst, dtype, name="to")
        self.dst_svg, self.dst_type = self.target_picture.to_svg(), self.target_picture.summary()
        self.local_shapes = [
            {"rank": b.rank, "coords": list(b.coords), "src": list(b.local_shape),
             "dst": list(self.target_picture.block_of(b.rank).local_shape)}
            for b in self.picture.blocks
        ]
        from ..boxing import plan_boxing

        plan = plan_boxing(shape, src, dst, placement, dtype=dtype)
        self.plan = plan
        self.steps = [
            {"kind": s.label,
             "axis": s.axis_text(), "from": fmt_sbp(s.src_sbp), "to": fmt_sbp(s.dst_sbp),
             "groups": [list(g) for g in s.groups], "max_bytes_per_rank": s.max_bytes_per_rank,
             "total_bytes": s.total_bytes, "bytes": fmt_bytes(s.total_bytes),
             "time_us": s.time_s * 1e6, "why": s.why}
            for s in plan.steps
        ]
        self.total_bytes = int(plan.total_bytes)
        self.time_us = plan.time_s * 1e6
        self.boxing_text = plan.describe()

    def _fit(self, entries: list[str], tensor_ndim: int, mesh_ndim: int, what: str,
             notes: list[str]) -> list[str]:
        """One valid-looking entry per mesh axis: pad with B, drop extra axes, B for vanished split dims."""
        out = list(entries[:mesh_ndim]) + ["B"] * max(0, mesh_ndim - len(entries))
        for a, e in enumerate(out):
            try:
                (x,) = parse_sbp(e)
            except ValueError:
                raise ValueError(f"{what} SBP on axis{a}: {e!r} is not an SBP; pick one of "
                                 f"{', '.join(sbp_choices(tensor_ndim))}") from None
            if isinstance(x, Split) and not -tensor_ndim <= x.dim < tensor_ndim:
                notes.append(f"{what} axis{a}: {e} does not fit a {tensor_ndim}-D tensor, set to B")
                out[a] = "B"
        return out
