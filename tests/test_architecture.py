"""One home per rule, checked on the source: the layering and naming docs/architecture.md describes."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import sbplab as sl

PKG = Path(sl.__file__).parent
COLLECTIVE_NAMES = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast", "send_recv")


def _sources(under: Path = PKG) -> list[Path]:
    return sorted(p for p in under.rglob("*.py") if "__pycache__" not in p.parts)


def test_only_the_boxing_package_compares_collective_names():
    """Code outside sbplab/boxing asks a step kind what it is; it never compares a collective's name."""
    pattern = re.compile(r"(==|!=|\bin\b)\s*[(\[{]?\s*[\"'](" + "|".join(COLLECTIVE_NAMES) + r")[\"']")
    found = [f"{p.relative_to(PKG)}:{i}: {line.strip()}"
             for p in _sources() if "boxing" not in p.relative_to(PKG).parts
             for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, "compare against a boxing kind's properties instead:\n" + "\n".join(found)


def _imported_modules(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports (relative imports resolved)."""
    rel = path.relative_to(PKG.parent).with_suffix("")
    package = list(rel.parts[:-1]) if rel.name != "__init__" else list(rel.parts[:-1])
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.add(name)
            out.update(f"{name}.{a.name}" for a in node.names)
    return out


def test_runtime_imports_nothing_from_the_compiler():
    """The runtime runs actor plans; the compiler lowers to them, never the other way round."""
    bad = {str(p.relative_to(PKG)): sorted(m for m in _imported_modules(p) if m.startswith("sbplab.compiler"))
           for p in _sources(PKG / "runtime")}
    assert not {k: v for k, v in bad.items() if v}


def test_core_packages_below_the_compiler_do_not_import_it():
    """ops, boxing and eager sit below the compiler: the eager API must not need it."""
    for sub in ("ops", "boxing", "eager"):
        for p in _sources(PKG / sub):
            assert not [m for m in _imported_modules(p) if m.startswith("sbplab.compiler")], p


def test_no_two_modules_or_classes_share_a_name():
    modules = Counter(p.name for p in _sources() if p.name != "__init__.py")
    assert [m for m, n in modules.items() if n > 1] == []
    classes = Counter(node.name for p in _sources() for node in ast.parse(p.read_text()).body
                      if isinstance(node, ast.ClassDef))
    assert [c for c, n in classes.items() if n > 1] == []


def test_hardware_replaces_cluster():
    assert not hasattr(sl, "Cluster")
    hw = sl.Hardware.h100_ib(4)
    assert hw.link(0) != hw.link(1) and not hw.measured and hw.origin == "spec sheet"


def test_compiler_reads_as_the_pipeline():
    subs = {p.name for p in (PKG / "compiler").iterdir() if (p / "__init__.py").exists()}
    assert {"frontend", "training", "deduction", "physical", "lowering"} <= subs
    flat = [p.name for p in (PKG / "compiler").glob("*.py") if p.name != "__init__.py"]
    assert len(flat) <= 6, flat
