"""Ask DTensor's own sharding propagation about every distinct ATen op instance of the corpus, and
compare with sbplab's 1-D signatures: run as a script (``python tests/dtensor_rules_probe.py``) it
prints one JSON report; ``tests/test_aten_rules_dtensor.py`` runs it in a subprocess and judges it.

A fake process group of 2 ranks (``torch.testing``'s FakeStore, no processes) backs a 1-D mesh; each
op instance gets DTensors (meta local tensors, the instance's global shapes) with every combination
of placements Shard(d), Replicate(), Partial("sum") on its tensor inputs, and goes through DTensor's
dispatcher front (``unwrap_to_op_info``, the exact OpSchema eager DTensor builds) and
``ShardingPropagator.propagate``. A combination is *accepted as is* when DTensor asks for no
redistribution of the inputs (no suggestion, or a suggestion with the same placements: view ops
always get one, to localise their shape argument). Instances with more than ``CAP`` combinations
(layer-norm backward, a cat or stack of 8) try a seeded subset instead: all-Replicate,
each input alone split or partial, every input split on the same dim (aligned from the left and
from the right), all-Partial, sbplab's own signatures, and every suggestion DTensor makes for
those, until no new one comes up. Shard(d) of a dim of size 1 is never tried (sbplab never splits
one), and instances that no rule can tell apart (``shape_class``) are asked once.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
import time
from collections import defaultdict

import torch

CAP = 256  # at most this many placement combinations tried in full per instance


def instances() -> list[tuple[str, tuple, dict, str]]:
    from sbplab.models import corpus

    return corpus.op_instances()


def shape_class(name: str, metas: tuple, attrs: dict) -> tuple:
    """Instances that no rule (sbplab's or DTensor's) can tell apart: sizes renamed by first
    appearance (size 1 kept, parity kept), so equal sizes stay equal and broadcasting stays visible;
    the attrs verbatim (a view's target shape keeps its instances apart)."""
    names: dict[int, str] = {}
    shapes = []
    for m in metas:
        dims = []
        for s in m.shape:
            if s == 1:
                dims.append("1")
            else:
                dims.append(names.setdefault(s, f"{len(names)}{'e' if s % 2 == 0 else 'o'}"))
        shapes.append((tuple(dims), str(m.dtype)))
    return (name, tuple(shapes), tuple(sorted(attrs.items(), key=lambda kv: kv[0])))


def main() -> dict:
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
    from torch.distributed.tensor._decompositions import DecompShardingStrategy
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.utils._pytree import tree_leaves

    from sbplab.ops.aten.calls import fill, resolve
    from sbplab.ops.registry import get_op, one_d_signatures
    from sbplab.sbp import B as SB
    from sbplab.sbp import Partial as SP
    from sbplab.sbp import Split

    t0 = time.time()
    all_instances = instances()
    t_capture = time.time() - t0

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    mesh = DeviceMesh("cpu", [0, 1])
    dispatcher = DTensor._op_dispatcher
    propagator = dispatcher.sharding_propagator

    def to_sbp(p):
        if isinstance(p, Replicate):
            return SB
        if type(p) is Shard:  # _StridedShard (a Shard subclass) has no sbplab equivalent
            return Split(p.dim)
        if type(p) is Partial and p.reduce_op in ("sum", "max", "min"):  # not _MaskPartial, not "avg"
            return SP(p.reduce_op)
        return None

    def to_dt(x):
        if isinstance(x, Split):
            return Shard(x.dim)
        if isinstance(x, SP):
            return Partial(x.op)
        return Replicate()

    def fmt(xs) -> str:
        return "[" + ", ".join("?" if x is None else repr(x) for x in xs) + "]"

    def dtensor(meta, placement) -> DTensor:
        shape = tuple(meta.shape)
        stride = torch.empty(shape, device="meta").stride()
        spec = DTensorSpec(mesh, (placement,), tensor_meta=TensorMeta(torch.Size(shape), stride, meta.dtype))
        return DTensor(torch.empty(shape, dtype=meta.dtype, device="meta"), spec, requires_grad=False)

    def lists(x):
        """sbplab freezes the call's lists into tuples; ATen's schema (and DTensor's rules) want lists."""
        if isinstance(x, tuple):
            return [lists(v) for v in x]
        return x

    def specs(schema) -> list:
        return [x for x in tree_leaves((schema.args_schema, schema.kwargs_schema)) if isinstance(x, DTensorSpec)]

    class NoStrategy(Exception):
        pass

    def ask(op, metas, attrs, combo):
        """DTensor's verdict on input placements ``combo``: ("accept", output placements),
        ("reject", suggested input placements or None)."""
        ts = [dtensor(m, p) for m, p in zip(metas, combo)]
        args = lists(fill(attrs["args"], ts, torch.device("cpu")))
        kwargs = {k: lists(v) for k, v in fill(attrs.get("kwargs", ()), ts, torch.device("cpu"))}
        info = dispatcher.unwrap_to_op_info(op, tuple(args), kwargs)
        try:
            propagator.propagate(info)
        except NotImplementedError as e:
            if "sharding strategy" in str(e) or "registered" in str(e):
                raise NoStrategy(str(e).splitlines()[0]) from None
            raise
        except RuntimeError as e:
            if "redistribut" in str(e).lower():
                return "reject", None
            raise
        sharding = info.output_sharding
        given = [s.placements for s in specs(info.schema)]
        rs = sharding.redistribute_schema
        if rs is not None and [s.placements for s in specs(rs)] != given:
            # the suggestion in slot order: the schema's DTensors are the slots' DTensors in call order
            order = [id(x) for x in tree_leaves((args, kwargs)) if isinstance(x, DTensor)]
            by_slot = [order.index(id(t)) if id(t) in order else None for t in ts]
            sug = [s.placements[0] for s in specs(rs)]
            return "reject", (tuple(sug[i] if i is not None else Replicate() for i in by_slot)
                              if len(sug) == len(order) else None)
        outs = sharding.output_spec
        leaves = [outs] if isinstance(outs, DTensorSpec) else list(outs) if isinstance(outs, (tuple, list)) else []
        return "accept", [None if s is None else s.placements[0] for s in leaves]

    classes: dict[tuple, list] = {}
    for inst in all_instances:
        classes.setdefault(shape_class(inst[0], inst[1], inst[2]), []).append(inst)

    compared_ops, compared_instances = set(), 0
    combos_total = accepted_total = agreed_total = 0
    skipped_no_tensor, skipped_no_strategy, errors = set(), {}, {}
    findings = []  # {"kind": "disagree"|"missing", ...}
    extensions = defaultdict(set)  # op -> sbplab signatures DTensor does not accept as is
    seeded = set()
    skipped_size1 = 0
    op_seconds = {}

    for (name, metas, attrs, model), *_ in classes.values():
        if not metas:
            skipped_no_tensor.add(name)
            continue
        if name in skipped_no_strategy:
            continue
        try:
            op = resolve(attrs.get("op", name), attrs.get("lib"))
        except Exception as e:  # noqa: BLE001
            errors[name] = repr(e)
            continue
        if not any(op in table for table in (propagator.op_strategy_funcs, propagator.op_to_rules,
                                               propagator.op_single_dim_strategy_funcs)):
            # DTensor would derive a strategy by tracing the op's decomposition (SDPA on CPU): that
            # says which placements survive the decomposed ops, not what the op's own kernel does on
            # shards, and tracing every combination costs minutes. Not compared.
            skipped_no_strategy[name] = ("decomposed by DTensor" if DecompShardingStrategy.has_decomp(op)
                                         else "no sharding strategy")
            continue
        t_op = time.time()
        ones = one_d_signatures(get_op(name), metas, attrs)
        by_inputs = defaultdict(set)
        for s in ones:
            by_inputs[s.inputs].add(s.outputs)
        # Shard(d) of a size-1 (or empty) dim is never tried: sbplab never splits one (see the test's ALLOWED)
        choices = [[Shard(d) for d in range(len(m.shape)) if m.shape[d] > 1] + [Replicate(), Partial("sum")]
                   for m in metas]
        skipped_size1 += math.prod(len(m.shape) + 2 for m in metas) - math.prod(len(c) for c in choices)
        sb_combos = [tuple(to_dt(x) for x in s.inputs) for s in ones]
        if math.prod(len(c) for c in choices) <= CAP:
            todo = list(itertools.product(*choices))
        else:
            seeded.add(name)
            n = len(metas)
            todo = [tuple(Replicate() for _ in metas), tuple(Partial("sum") for _ in metas)]
            for i, c in enumerate(choices):
                todo += [tuple(p if j == i else Replicate() for j in range(n)) for p in c]
            for d in range(max(len(m.shape) for m in metas)):
                todo.append(tuple(Shard(d) if d < len(m.shape) else Replicate() for m in metas))
                nd = max(len(m.shape) for m in metas)
                todo.append(tuple(Shard(len(m.shape) - nd + d) if len(m.shape) - nd + d >= 0 else Replicate()
                                  for m in metas))
        todo += sb_combos
        tried = set()
        dt_accepts = set()
        try:
            while todo:
                combo = todo.pop(0)
                if combo in tried:
                    continue
                tried.add(combo)
                verdict, detail = ask(op, metas, attrs, combo)
                combos_total += 1
                if verdict == "reject":
                    if name in seeded and detail is not None and detail not in tried:
                        todo.append(detail)
                    continue
                accepted_total += 1
                ins = tuple(to_sbp(p) for p in combo)
                dt_accepts.add(ins)
                outs = tuple(to_sbp(p) if p is not None else SB for p in detail)
                mine = by_inputs.get(ins, set())
                out_metas = get_op(name).infer(metas, attrs)
                live = [j for j, m in enumerate(out_metas) if m.numel > 0 and j < len(detail) and detail[j] is not None]
                row = {"op": name, "model": model, "shapes": [list(m.shape) for m in metas],
                       "dtypes": [str(m.dtype)[6:] for m in metas], "attrs": repr(attrs)[:200],
                       "inputs": fmt(ins), "dtensor": fmt(outs), "sbplab": sorted(fmt(o) for o in mine)}
                if any(all(o[j] == outs[j] for j in live) for o in mine):
                    agreed_total += 1
                elif mine:
                    findings.append({"kind": "disagree", **row})
                else:
                    findings.append({"kind": "missing", **row})
        except NoStrategy as e:
            skipped_no_strategy[name] = str(e)
            continue
        except Exception as e:  # noqa: BLE001
            errors.setdefault(name, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300])
            continue
        compared_ops.add(name)
        op_seconds[name] = op_seconds.get(name, 0) + time.time() - t_op
        compared_instances += len(classes[shape_class(name, metas, attrs)])
        for s in ones:
            if s.inputs not in dt_accepts and any(not isinstance(x, type(SB)) for x in s.inputs):
                extensions[name].add(f"{fmt(s.inputs)} -> {fmt(s.outputs)}")

    dist.destroy_process_group()
    return {
        "instances": len(all_instances), "classes": len(classes), "all_ops": sorted({i[0] for i in all_instances}), "compared_ops": sorted(compared_ops),
        "compared_instances": compared_instances, "combinations": combos_total, "accepted": accepted_total,
        "agreed": agreed_total, "seeded": sorted(seeded), "skipped_no_tensor_inputs": sorted(skipped_no_tensor),
        "skipped_no_strategy": skipped_no_strategy, "errors": errors, "findings": findings,
        "extensions": {k: sorted(v) for k, v in sorted(extensions.items())},
        "skipped_size1_combinations": skipped_size1,
        "op_seconds": {k: round(v, 2) for k, v in sorted(op_seconds.items(), key=lambda kv: -kv[1])},
        "seconds": {"capture": round(t_capture, 1), "total": round(time.time() - t0, 1)},
    }


if __name__ == "__main__":
    torch.set_num_threads(1)
    report = main()
    json.dump(report, sys.stdout)
