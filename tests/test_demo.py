"""The main job end to end, at a small size: real processes, losses checked, report written."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.multiprocess


def test_demo_trains_gpt_dp_tp_on_four_processes_and_matches_torch(tmp_path):
    report = tmp_path / "report.html"
    out = subprocess.run([sys.executable, "-m", "sbplab.demo", "--layers", "1", "--width", "32",
                          "--steps", "3", "--report", str(report)],
                         capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stdout + out.stderr
    diffs = [float(d) for d in re.findall(r"\|diff\| ([0-9.e+-]+)\n", out.stdout)]
    assert len(diffs) == 3 and max(diffs) < 1e-4, out.stdout
    assert "losses match single-device PyTorch" in out.stdout
    issued, before = map(int, re.search(r"each rank issues (\d+) .*the physical graph has (\d+)", out.stdout).groups())
    assert 0 < issued < before
    page = report.read_text()
    for section in ("Losses", "Actor timeline", "Memory per device", "Communication", "Physical graph"):
        assert f"<h2>{section}</h2>" in page
    assert "matches single-device PyTorch" in page and "<svg" in page and "Plotly.newPlot" in page
    assert page.count("all_reduce") > 0


def test_demo_help_shows_every_default():
    out = subprocess.run([sys.executable, "-m", "sbplab.demo", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for flag, default in (("--layers", "2"), ("--width", "64"), ("--steps", "3"), ("--report", "report.html")):
        assert re.search(rf"{flag} \S+\s+.*\(default: {re.escape(default)}\)", out.stdout), (flag, out.stdout)


def test_demo_counts_collectives_as_issued_after_bucketing():
    import torch

    import sbplab as sl
    from sbplab.demo import collective_counts
    from sbplab.models import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=128, block_size=16, n_layer=1, n_head=4, n_embd=32))
    (idx,), targets = model.example_batch(8, seed=0)
    step = sl.compile(model, (idx,), loss_fn=GPT.loss_fn, target=targets, optimizer=sl.SGD(lr=0.1),
                      strategy=sl.presets.dp_tp((2, 2)))
    before, issued = collective_counts(step, 4)
    plan = step.plan(world_size=4)
    per_rank = [sum(a.kind == "collective" for a in rp.actors) for rp in plan.ranks.values()]
    assert issued == max(per_rank) and before == len(step.physical.collectives)
    # bucketing packs each data-parallel gradient all-reduce into a few: a rank issues far fewer
    grads = sum(c.phase == "backward" and c.kind == "all_reduce" and c.mesh_axis == 0 for c in step.physical.collectives)
    assert grads > 4 and issued < before
