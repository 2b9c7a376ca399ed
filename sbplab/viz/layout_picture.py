"""Which block of a tensor each device holds, as data, as JAX-like text and (layout_svg) as a picture.

Everything here is derived from ``sbplab.layout.local_block``, the one source of truth for SBP
layout, so the picture can never disagree with what the shards really hold.

Tensors with more than two dims: the picture shows the last two dims as a plane. The leading dims
are cut into the distinct ranges that some split produces, and each such range (a "slab") gets one
panel, labelled like ``[0:2, :, :]``; unsplit leading dims collapse into a single slab. So a
``(4, 8, 6)`` tensor split ``S(0)`` over 2 ranks gives two panels, one per rank's slab.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch

from ..errors import InputError, InputKeyError, InputTypeError
from ..layout import Block, check_layout, holds_value, local_block
from ..placement import Placement
from ..sbp import NdSbp, Partial, Split, as_nd_sbp, fmt_sbp

_DTYPE_SHORT = {
    torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
    torch.bool: "bool",
}


def dtype_short(dtype: torch.dtype | str) -> str:
    """``torch.float32`` or ``"float32"`` -> ``f32`` (JAX's spelling of element types)."""
    if isinstance(dtype, str):
        try:
            dtype = getattr(torch, dtype.removeprefix("torch."))
        except AttributeError:
            raise InputError(f"unknown dtype {dtype!r}; use a torch dtype name such as 'float32'") from None
    if not isinstance(dtype, torch.dtype):
        raise InputTypeError(f"dtype must be a torch.dtype or its name, got {dtype!r}")
    return _DTYPE_SHORT.get(dtype, str(dtype).removeprefix("torch."))


def partial_word(ops: list[str]) -> str:
    """What a rank under P holds: an addend of a sum, a candidate of a max or min."""
    return "addend" if ops == ["P"] else "candidate" if "P" not in ops else "partial value"


def fmt_range(r: tuple[int, int], n: int) -> str:
    return ":" if r == (0, n) else f"{r[0]}:{r[1]}"


@dataclass(frozen=True)
class DeviceBlock:
    """What one rank holds: its global index ranges, local shape, and the mesh axes it is partial on."""

    rank: int
    coords: tuple[int, ...]
    block: Block  # per tensor dim [start, stop)
    local_shape: tuple[int, ...]
    partial_axes: tuple[int, ...]  # mesh axes with P: this rank holds an addend (or max/min candidate)
    holds_value: bool  # for P built from a full value: does this rank keep it (else the identity)


@dataclass(frozen=True)
class LayoutPicture:
    """The layout of one global tensor; shows itself as SVG in a notebook and as text in a terminal."""

    shape: tuple[int, ...]  # global (logical) shape
    placement: Placement
    sbp: NdSbp  # one entry per mesh axis
    dtype: torch.dtype = torch.float32
    name: str = ""  # the tensor's name, shown in titles and panel labels when it has one
    blocks: tuple[DeviceBlock, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        shape = tuple(int(s) for s in self.shape)
        if any(s < 0 for s in shape):
            raise InputError(f"{self.what}: shape {shape} has a negative dim")
        object.__setattr__(self, "shape", shape)
        nd = as_nd_sbp(self.sbp, self.placement.ndim, len(shape), what=self.what)
        object.__setattr__(self, "sbp", nd)
        check_layout(shape, self.placement, nd, what=self.what)
        dtype_short(self.dtype)  # validates
        partial = tuple(a for a, x in enumerate(nd) if isinstance(x, Partial))
        blocks = []
        for rank in self.placement.rank_list:
            blk = local_block(shape, self.placement, nd, rank)
            blocks.append(DeviceBlock(
                rank=rank, coords=self.placement.coords(rank), block=blk,
                local_shape=tuple(e - s for s, e in blk), partial_axes=partial,
                holds_value=holds_value(self.placement, nd, rank),
            ))
        object.__setattr__(self, "blocks", tuple(blocks))

    @property
    def what(self) -> str:
        """How error messages name the tensor."""
        return self.name or "tensor"

    # --- JAX-like type strings -------------------------------------------------------------
    def axis_label(self, axis: int) -> str:
        return self.placement.axis_label(axis)

    def type_string(self) -> str:
        """``f32[8@axis0,6]``: global sizes, ``@axes`` on split dims, ``{P:axis1}`` for partial axes."""
        parts = []
        for d, n in enumerate(self.shape):
            axes = [self.axis_label(a) for a, x in enumerate(self.sbp) if isinstance(x, Split) and x.dim == d]
            if not axes:
                parts.append(str(n))
            elif len(axes) == 1:
                parts.append(f"{n}@{axes[0]}")
            else:
                parts.append(f"{n}@({','.join(axes)})")
        out = f"{dtype_short(self.dtype)}[{','.join(parts)}]"
        pending: dict[str, list[str]] = {}
        for a, x in enumerate(self.sbp):
            if isinstance(x, Partial):
                pending.setdefault(repr(x), []).append(self.axis_label(a))
        if pending:
            out += "{" + "; ".join(f"{k}:{','.join(v)}" for k, v in pending.items()) + "}"
        return out

    def local_type(self, rank: int) -> str:
        """``f32[4,6]``: the shape rank ``rank`` really stores."""
        b = self.block_of(rank)
        return f"{dtype_short(self.dtype)}[{','.join(map(str, b.local_shape))}]"

    def local_types(self) -> list[str]:
        """Distinct local types, largest first: one entry when the split is even, more when uneven."""
        seen = dict.fromkeys(self.local_type(b.rank) for b in
                             sorted(self.blocks, key=lambda b: tuple(-s for s in b.local_shape)))
        return list(seen)

    @property
    def uneven(self) -> bool:
        return len({b.local_shape for b in self.blocks}) > 1

    def summary(self) -> str:
        """``x: f32[8@axis0,6] (S(0), B) local f32[4,6]``: one line, for captions and widget labels (the
        ``x: `` only when the tensor has a name)."""
        head = f"{self.name}: " if self.name else ""
        return f"{head}{self.type_string()} {fmt_sbp(self.sbp)} local {' | '.join(self.local_types())}"

    # --- the grid of distinct blocks -----------------------------------------------------------
    def block_of(self, rank: int) -> DeviceBlock:
        for b in self.blocks:
            if b.rank == rank:
                return b
        raise InputKeyError(f"rank {rank} is not in placement {self.placement}")

    @property
    def plane_dims(self) -> tuple[int | None, int | None]:
        """Tensor dims drawn as (rows, cols): the last two; a 1-D tensor is one row, a scalar one cell."""
        n = len(self.shape)
        return (n - 2 if n >= 2 else None, n - 1 if n >= 1 else None)

    def cuts(self, dim: int) -> list[tuple[int, int]]:
        """The distinct ranges of tensor dim ``dim`` that some rank's block starts or stops at."""
        return sorted({b.block[dim] for b in self.blocks})

    @cached_property
    def slabs(self) -> list[tuple[tuple[int, int], ...]]:
        """Distinct ranges over the leading dims (all but the last two): one panel each."""
        lead = max(0, len(self.shape) - 2)
        return sorted({b.block[:lead] for b in self.blocks})

    def slab_label(self, slab: tuple[tuple[int, int], ...]) -> str:
        if not slab:
            return ""
        return "[" + ", ".join([fmt_range(r, n) for r, n in zip(slab, self.shape)] + [":"] * 2) + "]"

    def holders(self, block: Block) -> list[list[int]]:
        """Ranks holding ``block``, grouped into partial sums: ``[[0, 1], [2, 3]]`` reads "0+1, 2+3"."""
        groups: dict[tuple[int, ...], list[int]] = {}
        for b in self.blocks:
            if b.block == block:
                key = tuple(c for a, c in enumerate(b.coords) if a not in b.partial_axes)
                groups.setdefault(key, []).append(b.rank)
        return list(groups.values())

    def holder_label(self, block: Block) -> str:
        return ",".join("+".join(map(str, g)) for g in self.holders(block))

    def plane_blocks(self, slab: tuple[tuple[int, int], ...]) -> list[Block]:
        """Distinct blocks of one slab, row-major over the plane's cut grid."""
        return sorted({b.block for b in self.blocks if b.block[:len(slab)] == slab})

    # --- text ------------------------------------------------------------------------------
    def rank_table(self) -> str:
        """One line per rank: mesh coords, global block, local type, and what the rank's values mean."""
        rows = [("rank", "coords", "block", "local", "holds")]
        for b in self.blocks:
            blk = "[" + ", ".join(fmt_range(r, n) for r, n in zip(b.block, self.shape)) + "]"
            if b.partial_axes:
                ops = sorted({repr(self.sbp[a]) for a in b.partial_axes})
                axes = ",".join(self.axis_label(a) for a in b.partial_axes)
                holds = f"{'/'.join(ops)} {partial_word(ops)} over {axes}"
            elif all(r == (0, n) for r, n in zip(b.block, self.shape)):
                holds = "whole tensor"
            else:
                holds = "slice"
            coords = "(" + ",".join(map(str, b.coords)) + ")"
            rows.append((str(b.rank), coords, blk, self.local_type(b.rank), holds))
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)

    def grid_text(self) -> str:
        """A box grid of the plane per slab, each cell naming its holders (JAX visualize_array_sharding)."""
        out = []
        r_dim, c_dim = self.plane_dims
        for slab in self.slabs:
            if slab:
                out.append(f"{self.name}{self.slab_label(slab)}")
            blocks = self.plane_blocks(slab)
            rows = sorted({b[r_dim] for b in blocks}) if r_dim is not None else [None]
            cols = sorted({b[c_dim] for b in blocks}) if c_dim is not None else [None]
            cell = {}
            for b in blocks:
                key = (b[r_dim] if r_dim is not None else None, b[c_dim] if c_dim is not None else None)
                cell[key] = self.holder_label(b)
            col_head = [f"{c[0]}:{c[1]}" if c is not None else "" for c in cols]
            row_head = [f"{r[0]}:{r[1]}" if r is not None else "" for r in rows]
            w = [max(len(col_head[j]), *(len(cell[(r, c)]) for r in rows)) + 2 for j, c in enumerate(cols)]
            lw = max(len(h) for h in row_head) + 1
            out.append(" " * lw + " " + " ".join(h.center(x) for h, x in zip(col_head, w)))
            out.append(" " * lw + "┌" + "┬".join("─" * x for x in w) + "┐")
            for i, r in enumerate(rows):
                body = "│".join(cell[(r, c)].center(x) for c, x in zip(cols, w))
                out.append(row_head[i].rjust(lw) + "│" + body + "│")
                if i < len(rows) - 1:
                    out.append(" " * lw + "├" + "┼".join("─" * x for x in w) + "┤")
            out.append(" " * lw + "└" + "┴".join("─" * x for x in w) + "┘")
        return "\n".join(out)

    def text(self) -> str:
        mesh = "x".join(map(str, self.placement.shape))
        head = f"{self.summary()}  on {self.placement.device_type or 'device-free'} mesh {mesh} {self.placement.mesh.tolist()}"
        partial = any(isinstance(x, Partial) for x in self.sbp)
        note = "  (a+b: partial values, reduced to the tensor; a,b: copies)" if partial else ""
        return f"{head}\n{self.grid_text()}{note}\n{self.rank_table()}"

    def __str__(self) -> str:
        return self.text()

    # --- notebook display ------------------------------------------------------------------
    def to_svg(self) -> str:
        from .layout_svg import layout_svg

        return layout_svg(self)

    def _repr_svg_(self) -> str:
        return self.to_svg()

    def _repr_html_(self) -> str:
        """The SVG at its own size (text never shrinks to fit a narrow cell: the box scrolls instead),
        with the text form folded underneath."""
        import html

        from .zoom_box import zoom_box

        box = zoom_box(self.to_svg(), max_height_px=None, title=self.summary(), grow=1.0)
        return (f"<div class='sbplab-layout'>{box}<details><summary>text</summary>"
                f"<pre>{html.escape(self.text())}</pre></details></div>")


def layout_picture(x: Any, placement: Placement | None = None, sbp: Any = None,
                   dtype: torch.dtype | str | None = None, name: str | None = None) -> LayoutPicture:
    """The layout of a global tensor, or of a (shape, placement, sbp) triple.

    ``layout_picture(t)`` reads ``t.shape``, ``t.placement``, ``t.sbp`` (and ``t.dtype`` and
    ``t.name``) from a global tensor; ``layout_picture((8, 6), mesh, "S(0), B")`` needs no data at
    all. ``name`` titles the picture (default: the global tensor's name; a bare shape has none).
    """
    if hasattr(x, "placement") and hasattr(x, "sbp"):
        placement = placement or x.placement
        sbp = sbp if sbp is not None else x.sbp
        dtype = dtype or getattr(x, "dtype", None)
        name = name or getattr(x, "name", None)
        shape: Sequence[int] = tuple(x.shape)
    elif isinstance(x, torch.Size) or isinstance(x, (tuple, list)):
        shape = tuple(x)
    elif isinstance(x, int):
        shape = (x,)
    else:
        raise InputTypeError(f"layout_picture needs a global tensor or a shape, got {type(x).__name__}")
    if placement is None or sbp is None:
        raise InputError("layout_picture of a shape needs placement= and sbp=")
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."), None) or dtype
    return LayoutPicture(tuple(shape), placement, sbp, dtype or torch.float32, name or "")


def type_string(shape: Sequence[int], placement: Placement, sbp: Any,
                dtype: torch.dtype | str = torch.float32) -> str:
    """``f32[8@axis0,6]`` for a tensor of ``shape`` with ``sbp`` on ``placement``."""
    return layout_picture(tuple(shape), placement, sbp, dtype).type_string()
