"""The notebooks teach the public API only: they import ``sbplab`` and its public sub-packages
(``sbplab.models``, ``sbplab.viz``, ``sbplab.widgets``), never a module inside the compiler or the
runtime, and every ``sl.<name>`` they use is one of ``sbplab.__all__``. A notebook that reached into
``sbplab.compiler.reference`` would teach readers an import path we are free to move."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import sbplab

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
PUBLIC = {"sbplab", "sbplab.models", "sbplab.viz", "sbplab.widgets"}


def _code(path: Path) -> list[tuple[int, ast.Module]]:
    """Each code cell of the notebook, parsed; IPython magics and shell lines are left out."""
    cells = json.loads(path.read_text())["cells"]
    out = []
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"])
        lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in src.splitlines()]
        out.append((i, ast.parse("\n".join(lines), filename=f"{path.name}, cell {i}")))
    return out


def _sbplab_imports(tree: ast.Module) -> list[str]:
    """Every module under ``sbplab`` the cell imports (``from sbplab import x`` counts as ``sbplab``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "sbplab"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "sbplab":
            found.append(node.module)
    return found


def _aliases(trees: list[ast.Module]) -> set[str]:
    """Names the notebook binds to the sbplab package itself (``import sbplab as sl``)."""
    return {a.asname or a.name for t in trees for node in ast.walk(t) if isinstance(node, ast.Import)
            for a in node.names if a.name == "sbplab"}


def test_the_notebooks_are_found():
    assert len(NOTEBOOKS) >= 7, NOTEBOOKS
    assert {p.name[:2] for p in NOTEBOOKS} >= {"01", "02", "03", "04", "05", "06", "09"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_imports_only_public_packages(path):
    bad = [f"cell {i}: {m}" for i, tree in _code(path) for m in _sbplab_imports(tree) if m not in PUBLIC]
    assert not bad, f"{path.name} imports private sbplab modules ({', '.join(bad)}); use only {sorted(PUBLIC)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_uses_only_names_sbplab_exports(path):
    cells = _code(path)
    alias = _aliases([t for _, t in cells])
    used = {(i, node.attr) for i, tree in cells for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in alias}
    bad = sorted(f"cell {i}: sl.{name}" for i, name in used if name not in sbplab.__all__)
    assert not bad, f"{path.name} uses names outside sbplab.__all__: {', '.join(bad)}"


def test_the_checker_catches_private_imports_and_names():
    tree = ast.parse("import sbplab as sl\nfrom sbplab.compiler.reference import compare\n"
                     "import sbplab.runtime.trace\nfrom sbplab.viz import timeline\nfrom sbplab import models\n"
                     "sl.compiler.reference")
    assert [m for m in _sbplab_imports(tree) if m not in PUBLIC] == ["sbplab.compiler.reference",
                                                                     "sbplab.runtime.trace"]
    assert _aliases([tree]) == {"sl"} and "compiler" not in sbplab.__all__


def test_public_names_exist_and_the_export_loads_on_first_use():
    for name in sbplab.__all__:
        assert getattr(sbplab, name) is not None, name
    code = ("import sys, sbplab as sl\n"
            "before = 'sbplab.export' in sys.modules\n"
            "from sbplab.export import to_dtensor\n"
            "print(before, sl.to_dtensor is to_dtensor)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]
    from sbplab.compiler.reference import compare, torch_steps
    from sbplab.runtime import Trace

    assert (sbplab.compare_with_torch, sbplab.torch_steps, sbplab.Trace) == (compare, torch_steps, Trace)
