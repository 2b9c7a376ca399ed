"""The Python a user would write for an exported strategy: it does what ``DTensorExport.apply`` and
``shard_batch`` do, spelled out with torch.distributed, so it can be pasted into a training script.

The text expects ``model`` (the torch module) and the batch tensors under the graph's input names
(``x``, ``target``) to exist, full and the same on every rank, inside an initialised process group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .placements import text

if TYPE_CHECKING:
    from .dtensor import DTensorExport


def _mesh_lines(exp: DTensorExport) -> list[str]:
    return ["from torch.distributed.device_mesh import init_device_mesh",
            "",
            f"mesh = init_device_mesh({exp.device_type!r}, {tuple(exp.mesh_shape)}, "
            f"mesh_dim_names={tuple(exp.mesh_dim_names)})"]


def _batch_lines(exp: DTensorExport, local: bool) -> list[str]:
    out = []
    for name, pl in exp.input_placements.items():
        out.append(f"{name} = distribute_tensor({name}, mesh, {text(pl)})" + (".to_local()" if local else ""))
    return out


def _module_lines(exp: DTensorExport) -> list[str]:
    """Module outputs redistributed where they leave (PrepareModuleOutput's job, written as the forward
    hook it installs); modules run on their shards are named (``exp.apply`` wraps them in local_map)."""
    out = []
    if exp.module_outputs:
        out += ["",
                "",
                "def leave_as(placements):",
                "    def hook(module, args, out):",
                "        out = out.redistribute(mesh, placements)",
                "        # DTensor cannot redistribute a partial gradient back into the embedding's masked",
                "        # partial: reduce it first",
                "        out.register_hook(lambda g: g.redistribute(mesh, [Replicate() if p.is_partial() else p "
                "for p in g.placements]))",
                "        return out",
                "    return hook",
                "",
                ""]
        out += [f"model.get_submodule({m.module!r}).register_forward_hook(leave_as({text(m.placements)}))  # {m.why}"
                for m in exp.module_outputs]
    out += [f"# {m.describe()}: exp.apply wraps its forward (sbplab.export.module_maps)" for m in exp.module_maps]
    if exp.module_inputs:
        out += ["",
                "",
                "def enter_as(shape, placements):  # PrepareModuleInput, for the argument of that global shape",
                "    def hook(module, args, kwargs):",
                "        def prep(x):",
                "            ok = isinstance(x, DTensor) and tuple(x.shape) == shape",
                "            return x.redistribute(mesh, placements) if ok else x",
                "        return tuple(map(prep, args)), {k: prep(v) for k, v in kwargs.items()}",
                "    return hook",
                "",
                ""]
        out += [f"model.get_submodule({m.module!r}).register_forward_pre_hook(enter_as({m.shape}, "
                f"{text(m.placements)}), with_kwargs=True)" for m in exp.module_inputs]
    return out


def code(exp: DTensorExport) -> str:
    head = [f"# {exp.strategy}: DTensor mode {exp.mode}"]
    head += [f"# not expressible in DTensor: {u}" for u in exp.unsupported]
    head += [f"# DTensor has no rule here, run it through {c.describe()}" for c in exp.local_maps]
    if exp.local_maps:
        head.append("# (exp.running() does that: with exp.running(): loss = ...; loss.backward())")
    if exp.mode == "pipeline":
        return "\n".join(head + ["raise NotImplementedError('pipeline: see torch.distributed.pipelining above')"])
    if exp.mode == "parallelize_module":
        styles = sorted({s.split("(")[0] for s in exp.plan.values()})
        body = ["from torch.distributed.tensor.parallel import " + ", ".join(styles + ["parallelize_module"]),
                *_mesh_lines(exp),
                "plan = {"]
        body += [f"    {m!r}: {s}," for m, s in exp.plan.items()]
        body += ["}", "model = parallelize_module(model, mesh, plan)",
                 "# every rank feeds the whole batch; layers not in the plan stay replicated"]
        return "\n".join(head + body)
    if exp.mode == "fully_shard":
        body = ["from torch.distributed.fsdp import fully_shard",
                "from torch.distributed.tensor import Replicate, Shard, distribute_tensor",
                *_mesh_lines(exp),
                f"model = fully_shard(model, mesh=mesh, reshard_after_forward={exp.reshard_after_forward})",
                "# each rank feeds its own slice of the batch",
                *_batch_lines(exp, local=True)]
        return "\n".join(head + body)
    kinds = sorted({type_name for pls in (*exp.placements.values(), *exp.input_placements.values())
                    for type_name in (repr(x).split("(")[0] for x in pls)}
                   | ({"Replicate"} if exp.module_outputs else set())
                   | {repr(x).split("(")[0] for m in exp.module_inputs for x in m.placements}
                   | ({"DTensor"} if exp.module_inputs else set()))
    body = ["import torch",
            "from torch.distributed.tensor import " + ", ".join(kinds + ["distribute_module", "distribute_tensor"]),
            *_mesh_lines(exp),
            "placements = {"]
    body += [f"    {p!r}: {text(pl)}," for p, pl in exp.placements.items()]
    body += ["}",
             "",
             "",
             "def partition(prefix, module, mesh):",
             "    for name, p in list(module.named_parameters(recurse=False)):",
             "        full = f'{prefix}.{name}' if prefix else name",
             "        module.register_parameter(name, torch.nn.Parameter(distribute_tensor(p.data, mesh, "
             "placements[full])))",
             "",
             "",
             "model = distribute_module(model, mesh, partition)",
             "# the batch as DTensors; the loss comes out a DTensor (loss.full_tensor() to read it)",
             *_batch_lines(exp, local=False)]
    body += _module_lines(exp)
    if exp.plan:
        body.append(f"# the same tensor parallelism as ParallelStyles on mesh[{exp.tp_dim!r}]: {exp.plan}")
    return "\n".join(head + body)
