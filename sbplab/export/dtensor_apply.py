"""Apply a ``DTensorExport`` to a torch module inside torch.distributed (every rank calls it).

Imports of torch.distributed live inside the functions: this file is loaded only when a user
applies an export, never by ``import sbplab``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .dtensor import DTensorExport


def _check_mesh(exp: DTensorExport, device_mesh: Any) -> None:
    shape = tuple(device_mesh.shape)
    if shape != tuple(exp.mesh_shape):
        raise ValueError(f"the device mesh has shape {shape}, the exported strategy {exp.strategy!r} needs "
                         f"{tuple(exp.mesh_shape)}: init_device_mesh({exp.device_type!r}, {tuple(exp.mesh_shape)}, "
                         f"mesh_dim_names={exp.mesh_dim_names})")


def parallel_styles(plan: dict[str, str]) -> dict[str, Any]:
    """The plan's ParallelStyle objects (ColwiseParallel() for "ColwiseParallel()")."""
    from torch.distributed.tensor import parallel as tp

    known = {"ColwiseParallel()": tp.ColwiseParallel, "RowwiseParallel()": tp.RowwiseParallel,
             "SequenceParallel()": tp.SequenceParallel}
    out = {}
    for module, style in plan.items():
        if style not in known:
            raise ValueError(f"plan entry {module!r}: unknown ParallelStyle {style!r}; known: {sorted(known)}")
        out[module] = known[style]()
    return out


def apply(exp: DTensorExport, module: Any, device_mesh: Any) -> Any:
    """``parallelize_module``, ``fully_shard`` or one DTensor per parameter, as ``exp.mode`` says."""
    import torch

    if exp.mode == "pipeline":
        raise ValueError(f"{exp.strategy!r} is a pipeline, which DTensor cannot express: {exp.unsupported[0]}")
    _check_mesh(exp, device_mesh)
    names = {n for n, _ in module.named_parameters()}
    if names != set(exp.placements):
        raise ValueError(f"the module's parameters do not match the exported step's: missing "
                         f"{sorted(set(exp.placements) - names)[:5]}, extra {sorted(names - set(exp.placements))[:5]}")
    if exp.mode == "parallelize_module":
        from torch.distributed.tensor.parallel import parallelize_module

        return parallelize_module(module, device_mesh, parallel_styles(exp.plan))
    if exp.mode == "fully_shard":
        from torch.distributed.fsdp import fully_shard

        return fully_shard(module, mesh=device_mesh, reshard_after_forward=exp.reshard_after_forward)
    from torch.distributed.tensor import distribute_module, distribute_tensor

    # Tied weights (an LM head sharing the embedding's matrix) are one Parameter under two names:
    # named_parameters() gives it once, under the name the compiled step knows it by; every module
    # holding it gets the same DTensor parameter, so the tie survives.
    canonical = {id(p): n for n, p in module.named_parameters()}
    made: dict[int, torch.nn.Parameter] = {}

    def partition(prefix: str, sub: torch.nn.Module, mesh: Any) -> None:
        for name, p in list(sub.named_parameters(recurse=False)):
            if id(p) not in made:
                placements = [x.to_torch() for x in exp.placements[canonical[id(p)]]]
                made[id(p)] = torch.nn.Parameter(distribute_tensor(p.data, mesh, placements),
                                                 requires_grad=p.requires_grad)
            sub.register_parameter(name, made[id(p)])

    module = distribute_module(module, device_mesh, partition)
    if exp.module_outputs or exp.module_maps:
        from .module_maps import install

        install(module, device_mesh, exp.module_outputs, exp.module_maps)
    if exp.module_inputs:
        from .module_inputs import install_inputs

        install_inputs(module, device_mesh, exp.module_inputs)
    return module


def shard_batch(exp: DTensorExport, batch: dict[str, Any], device_mesh: Any) -> dict[str, Any]:
    """See ``DTensorExport.shard_batch``; ``batch`` holds full tensors, the same on every rank."""
    from torch.distributed.tensor import distribute_tensor

    unknown = set(batch) - set(exp.input_placements)
    if unknown:
        raise KeyError(f"batch names {sorted(unknown)}, the exported step's inputs are {sorted(exp.input_placements)}")
    if exp.mode == "parallelize_module":
        return dict(batch)
    out = {}
    for name, t in batch.items():
        dt = distribute_tensor(t, device_mesh, [x.to_torch() for x in exp.input_placements[name]])
        out[name] = dt.to_local() if exp.mode == "fully_shard" else dt
    return out
