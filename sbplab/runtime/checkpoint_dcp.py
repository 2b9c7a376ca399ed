"""Training state in torch.distributed.checkpoint (DCP) format: each rank writes and reads its own blocks.

A State actor's local value is one rectangular block of a logical tensor, named by the State's key
(a module's parameter name, ``"<param>.exp_avg"`` for optimizer state), or under a strided split
``S(d, chunks=k)`` (a fused QKV layer) k blocks, its slice of each chunk, each given to DCP as a chunk. DCP stores every tensor as
chunks with their offsets in the logical tensor, and reads any layout back by intersecting the chunks
it wants with the ones stored. So a checkpoint written under one strategy loads under another, and
into a plain torch module, whatever each strategy cut.

DTensor would describe the blocks for DCP, but its ``Shard`` follows ``torch.chunk`` (ceil-sized
pieces) while SBP's split is OneFlow's balanced one (the first ``n % parts`` pieces get one more):
on an uneven split the two disagree. So the planners here give DCP each block's offsets themselves;
everything else (the global plan, deduplication of replicated blocks across ranks, the metadata, the
files, resharding on read) is DCP's own.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping

import torch
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint import load as dcp_load
from torch.distributed.checkpoint import save as dcp_save
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan, SavePlan, TensorWriteData, WriteItem, WriteItemType
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from .checkpoint_blocks import STEPS_KEY, Piece, ShardBlock


class _BlockSavePlanner(DefaultSavePlanner):
    """Writes each value of the state dict as the block ``blocks[key]`` says (DCP dedups equal blocks)."""

    def __init__(self, blocks: Mapping[str, ShardBlock]) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.blocks = blocks

    def create_local_plan(self) -> SavePlan:
        items = []
        for key, t in self.state_dict.items():
            b = self.blocks.get(key)
            size = torch.Size(b.size if b else t.shape)
            parts = b.parts() if b else (Piece((0,) * t.dim(), (0,) * t.dim(), tuple(t.shape)),)
            props = TensorProperties.create_from_tensor(t)
            for p in parts:  # a strided split's value is several blocks of the logical tensor
                offsets = torch.Size(p.offsets)
                items.append(WriteItem(index=MetadataIndex(key, offsets), type=WriteItemType.SHARD,
                                       tensor_data=TensorWriteData(chunk=ChunkStorageMetadata(offsets,
                                                                                              torch.Size(p.shape)),
                                                                   properties=props, size=size)))
        self.plan = SavePlan(items)
        return self.plan

    def lookup_object(self, index: MetadataIndex) -> torch.Tensor:
        t = self.state_dict[index.fqn]
        b = self.blocks.get(index.fqn)
        if b is None or not b.pieces:
            return t
        piece = next(p for p in b.pieces if torch.Size(p.offsets) == index.offset)
        return piece.view(t).contiguous()  # DCP writes a block's own storage, not its parent's


class _BlockLoadPlanner(DefaultLoadPlanner):
    """Reads into each value of the state dict the block ``blocks[key]`` says, from whatever chunks the
    checkpoint holds (DCP's resharding)."""

    def __init__(self, blocks: Mapping[str, ShardBlock]) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.blocks = blocks

    def create_local_plan(self) -> LoadPlan:
        assert self.metadata is not None
        stored = self.metadata.state_dict_metadata
        reads = []
        for key, t in self.state_dict.items():
            md = stored.get(key)
            b = self.blocks.get(key)
            size = tuple(b.size if b else t.shape)
            if not isinstance(md, TensorStorageMetadata):
                raise KeyError(key)
            if tuple(md.size) != size:
                raise ValueError(f"{key!r} is {tuple(md.size)} in the checkpoint, {size} here")
            parts = b.parts() if b else (Piece((0,) * t.dim(), (0,) * t.dim(), tuple(t.shape)),)
            reads += create_read_items_for_chunk_list(
                key, md, [ChunkStorageMetadata(torch.Size(p.offsets), torch.Size(p.shape)) for p in parts])
        self.plan = LoadPlan(reads)
        return self.plan

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        t = self.state_dict[index.fqn]
        b = self.blocks.get(index.fqn)
        if b is None or not b.pieces:
            return t
        return b.pieces[index.index].view(t)  # a view: DCP's copy into it lands in the local value


def write_blocks(path: str | os.PathLike, values: Mapping[str, torch.Tensor], blocks: list[ShardBlock],
                 steps: int) -> None:
    """This rank's part of a checkpoint: each block's value under its key, and the step count. Every rank
    of the default process group calls it (DCP plans collectively; a rank without blocks writes nothing
    of its own). values: State name -> local value."""
    state = {b.key: values[b.name] for b in blocks}
    state[STEPS_KEY] = torch.tensor(steps, dtype=torch.int64)
    with warnings.catch_warnings():  # "Detected an existing checkpoint ... overwriting": as documented
        warnings.filterwarnings("ignore", "Detected an existing checkpoint", UserWarning)
        dcp_save(state, storage_writer=FileSystemWriter(os.fspath(path), overwrite=True),
                 planner=_BlockSavePlanner({b.key: b for b in blocks}))


def read_blocks(path: str | os.PathLike, blocks: list[ShardBlock], device: torch.device) -> tuple[dict, int]:
    """This rank's blocks read from a checkpoint (State name -> local value on ``device``), and the step
    count it was written at. Collective like ``write_blocks``; blocks of one key on several States of this
    rank are read once."""
    by_key: dict[str, ShardBlock] = {}
    for b in blocks:
        by_key.setdefault(b.key, b)
    state = {k: torch.empty(b.shape, dtype=b.dtype, device=device) for k, b in by_key.items()}
    state[STEPS_KEY] = torch.zeros((), dtype=torch.int64)
    dcp_load(state, storage_reader=FileSystemReader(os.fspath(path)), planner=_BlockLoadPlanner(by_key))
    out = {b.name: state[b.key] if by_key[b.key] is b else state[b.key].clone() for b in blocks}
    return out, int(state[STEPS_KEY])


def stored_keys(path: str | os.PathLike) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Logical name -> (shape, dtype) of every tensor in a checkpoint, from its metadata alone."""
    md = FileSystemReader(os.fspath(path)).read_metadata()
    return {k: (tuple(v.size), v.properties.dtype) for k, v in md.state_dict_metadata.items()
            if isinstance(v, TensorStorageMetadata)}
