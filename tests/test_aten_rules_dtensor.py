"""sbplab's ATen rules checked against DTensor's own sharding propagation, for every distinct ATen op
instance of the real-model corpus.

``tests/dtensor_rules_probe.py`` asks DTensor (``ShardingPropagator.propagate`` behind the eager
dispatcher's own ``unwrap_to_op_info``, on a fake 2-rank process group and a 1-D mesh of 2) about
every combination of input placements Shard(d) / Replicate() / Partial("sum") (a seeded subset for
the few instances with over 256 combinations), and about sbplab's own signatures. For each
combination DTensor accepts *as is* (no redistribution of any input), sbplab's 1-D signatures must
hold one with the same inputs (Shard(d) -> S(d), Replicate -> B, Partial(op) -> P(op)) giving the
same outputs. sbplab disagreeing on an output, or lacking the combination, fails the test unless
``ALLOWED`` below says why.

The probe runs in a subprocess: ``init_process_group`` sets process-wide state (the default group,
DTensor's sharding-propagation caches, device meshes) that a fixture could only undo partly, and a
test failing half-way would leave it for every later test of the pytest process. A subprocess
leaves nothing behind, whatever happens.

Not compared (counted in the report): ops with no tensor input (arange, zeros, scalar_tensor:
DTensor finds no mesh), ops DTensor has no strategy for (library custom ops; SDPA on CPU, whose
strategy DTensor derives by tracing the op's decomposition: that says which placements survive the
decomposed ops, not what the fused kernel does on shards, and costs minutes), random ops (dropout).

sbplab accepts more than DTensor (its extensions, printed with ``-s``): partial sums through linear
ops DTensor keeps whole (x + 0, clone, an embedding of a partial table, (log-)softmax backward in
its gradient, where's two values), a convolution split on its output channels (weight S(0) ->
output S(1)) or on its input channels (-> P) and the backward of the channel split, convolution
and its backward with a partial input; and, where DTensor has no strategy, every rule it has.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
if not torch.distributed.is_available():
    pytest.skip("torch built without torch.distributed (no DTensor)", allow_module_level=True)

PROBE = Path(__file__).with_name("dtensor_rules_probe.py")


# Combinations DTensor accepts as is that sbplab lacks (or answers differently), and why sbplab is
# right to. Each entry: a name, the reason, and a predicate on a finding (op, shapes, dtypes,
# inputs, dtensor output, sbplab's outputs for those inputs).
#
# Allowed without being asked: a split of a size-1 dim (or of an empty tensor). DTensor accepts one
# (rank 1 then holds an empty shard); sbplab's rules never split a dim of size 1 (a rank with nothing
# to do, and a shape torch broadcasts differently on it), so the probe does not even try Shard(d)
# there: the number of combinations left out is the report's skipped_size1_combinations.
ALLOWED = [
    # A view merging dims, split on a dim that is not the first of its group (x.view(B*T, C) with x
    # split on T), comes out _StridedShard in DTensor: interleaved blocks. sbplab's S(d) is one
    # contiguous balanced block per rank, so it cannot say that layout (it reshards instead).
    ("strided output", "DTensor's _StridedShard output has no sbplab equivalent",
     lambda f: "?" in f["dtensor"]),
    # A partial of a bool tensor (an expanded attention mask, the sum of a bool mask) is something
    # sbplab refuses (layout.partial_ok: a sum of bools is not a bool, and no collective reduces
    # bools); DTensor passes Partial through such ops regardless of dtype.
    ("bool partial", "sbplab has no partial bools",
     lambda f: any(p == "P" and d == "bool" for p, d in zip(f["inputs"][1:-1].split(", "), f["dtypes"]))),
    # DTensor's bug, not sbplab's gap: its scan strategy (cumsum, cumprod, logcumsumexp) does not
    # normalise a negative dim, so cumsum(x, -1) with x split on its last dim is accepted as is and
    # each rank scans only its own piece (cumsum(x, 1) on the same split is redistributed).
    ("DTensor: scan with dim=-1", "DTensor scans a split dim locally when the dim is negative",
     lambda f: f["op"] == "aten.cumsum.default" and f["attrs"].endswith("-1), 'kwargs': ()}")
     and f["inputs"] == f"[S({len(f['shapes'][0]) - 1})]"),
]


@pytest.fixture(scope="module")
def report() -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, str(PROBE)], capture_output=True, text=True, timeout=600, env=env,
                          cwd=Path(__file__).parent.parent)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _allowed(f: dict) -> str | None:
    return next((name for name, _, pred in ALLOWED if pred(f)), None)


def test_the_comparison_is_not_vacuous(report):
    assert len(report["compared_ops"]) >= 60, report["compared_ops"]
    assert report["compared_instances"] >= 400
    assert report["combinations"] >= 3000 and report["accepted"] >= 1000, report
    assert report["agreed"] >= 0.9 * report["accepted"], report
    for op in ("aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.view.default",
               "aten.native_layer_norm.default", "aten.embedding.default", "aten.sum.dim_IntList",
               "aten._softmax.default", "aten.convolution.default", "aten.cat.default"):
        assert op in report["compared_ops"] or op not in report["all_ops"], op
    assert not report["errors"], report["errors"]


def test_dtensor_accepts_nothing_sbplab_lacks_or_answers_differently(report):
    bad, allowed = [], Counter()
    for f in report["findings"]:
        why = _allowed(f)
        if why:
            allowed[why] += 1
        else:
            bad.append(f"{f['kind']}: {f['op']} {f['shapes']} {f['dtypes']} {f['attrs']}: inputs {f['inputs']} "
                       f"-> DTensor {f['dtensor']}, sbplab {f['sbplab'] or 'none'}")
    print(f"\n{len(report['compared_ops'])} ops, {report['compared_instances']} of {report['instances']} instances "
          f"({report['classes']} shape classes), {report['combinations']} combinations asked, "
          f"{report['accepted']} accepted as is by DTensor, {report['agreed']} agreed; allowed: {dict(allowed)}; "
          f"size-1 splits not tried: {report['skipped_size1_combinations']}; not compared: "
          f"{report['skipped_no_strategy']} {report['skipped_no_tensor_inputs']}; {report['seconds']}")
    print("sbplab's extensions (signatures DTensor does not accept as is):")
    for op, sigs in report["extensions"].items():
        print(f"  {op}: {'; '.join(sigs)}")
    assert not bad, "\n".join(bad)
