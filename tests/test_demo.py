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
    page = report.read_text()
    for section in ("Losses", "Actor timeline", "Memory per device", "Communication", "Physical graph"):
        assert f"<h2>{section}</h2>" in page
    assert "matches single-device PyTorch" in page and "<svg" in page and "Plotly.newPlot" in page
    assert page.count("all_reduce") > 0
