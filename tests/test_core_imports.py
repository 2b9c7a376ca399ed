"""The core library never imports Jupyter packages, and plotly/graphviz load only when drawing."""

from __future__ import annotations

import subprocess
import sys

FRONT_END = ("IPython", "ipywidgets", "anywidget", "jupyterlab", "jupyter_server", "ipykernel", "plotly", "graphviz")


def test_import_sbplab_pulls_in_no_front_end_package():
    code = ("import sys, sbplab\n"
            f"bad = sorted({{m.split('.')[0] for m in sys.modules}} & set({FRONT_END!r}))\n"
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import sbplab loaded {out.stdout.strip()}"


def test_worker_entry_point_imports_no_front_end_package():
    code = ("import sys, sbplab.worker\n"
            f"print(','.join(sorted({{m.split('.')[0] for m in sys.modules}} & set({FRONT_END!r}))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
