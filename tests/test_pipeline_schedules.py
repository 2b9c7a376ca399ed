"""Pipeline schedules as per-rank action lists, checked action by action against
torch.distributed.pipelining's own schedules for the same stages and micro-batches.

torch builds its orders from real ``PipelineStage``s in a process group; the group here is torch's
fake backend (``FakeStore``: one process stands for rank 0 of ``n``, nothing is sent), which is
all the schedule constructors read (stage count, group size, rank)."""

from __future__ import annotations

import pytest
import torch
from torch import distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
from torch.testing._internal.distributed.fake_pg import FakeStore

import sbplab as sl
from sbplab.compiler.pipeline.schedules import pipeline_actions
from sbplab.runtime.pipeline_order import in_flight


@pytest.fixture
def fake_group():
    """A fake process group of ``n`` ranks (this process is rank 0), torn down after the test."""
    made = []

    def make(n: int) -> None:
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=n)
        made.append(n)

    yield make
    if made:
        dist.destroy_process_group()


def _torch_order(cls, n: int, micro: int, v: int = 1) -> dict[int, list[str]]:
    """torch's ``pipeline_order`` as "stage kind micro" strings per rank, idle slots and the final
    gradient reduction dropped."""
    # this process is rank 0 of the fake group: it holds stages 0, n, 2n, ... (torch's layout)
    stages = [PipelineStage(torch.nn.Linear(2, 2), k * n, n * v, torch.device("cpu")) for k in range(v)]
    sched = cls(stages if cls is ScheduleInterleaved1F1B else stages[0], micro)
    out = {}
    for r, acts in sched.pipeline_order.items():
        out[r] = [f"{a.stage_index}{a.computation_type.value}{a.microbatch_index}" for a in acts
                  if a is not None and a.computation_type.value in ("F", "B")]
    return out


@pytest.mark.parametrize("n,micro", [(2, 2), (2, 4), (3, 5), (4, 8)])
@pytest.mark.parametrize("name,cls", [("gpipe", ScheduleGPipe), ("1f1b", Schedule1F1B)])
def test_single_stage_schedules_equal_torch(fake_group, name, cls, n, micro):
    fake_group(n)
    ours = {r: [str(a) for a in acts] for r, acts in pipeline_actions(name, n, micro).items()}
    theirs = _torch_order(cls, n, micro)
    if name == "1f1b":
        # torch's ``Schedule1F1B.pipeline_order`` starts the last rank's forwards at micro-batch 1 (and
        # names micro-batch ``micro``, which does not exist); what its ``_step_microbatches`` runs
        # there is min(micro, stages - stage) = 1 forward, then one backward and one forward in turn
        last = theirs.pop(n - 1)
        assert f"{n - 1}F{micro}" in last
        assert ours.pop(n - 1) == [f"{n - 1}{k}{m}" for m in range(micro) for k in "FB"]
    assert ours == theirs


@pytest.mark.parametrize("n,micro,v", [(2, 4, 2), (2, 6, 2), (4, 8, 2), (2, 4, 3), (4, 4, 2)])
def test_interleaved_1f1b_equals_torch(fake_group, n, micro, v):
    fake_group(n)
    ours = {r: [str(a) for a in acts] for r, acts in pipeline_actions("interleaved_1f1b", n, micro, v).items()}
    assert ours == _torch_order(ScheduleInterleaved1F1B, n, micro, v)


def test_activations_in_flight():
    """What each schedule keeps alive on the first stage: GPipe all M, 1F1B at most the stages."""
    assert in_flight(pipeline_actions("gpipe", 4, 8)[0])[0] == 8
    assert in_flight(pipeline_actions("1f1b", 4, 8)[0])[0] == 4
    assert in_flight(pipeline_actions("1f1b", 4, 8)[3])[3] == 1


def test_bad_schedule_names_the_valid_ones():
    with pytest.raises(sl.InputError, match="gpipe.*1f1b.*interleaved_1f1b"):
        pipeline_actions("zero_bubble", 2, 4)
    with pytest.raises(sl.SbplabError, match="gpipe.*1f1b.*interleaved_1f1b"):
        sl.Pipeline("pp", micro_batches=2, schedule="1F1b")
