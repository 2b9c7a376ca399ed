"""docs/ops.md, generated from the table of SBP rules (``rules.RULES``).

    python -m sbplab.ops.aten.docs            # rewrites docs/ops.md
    python -m sbplab.ops.aten.docs --check    # exit status 1 when docs/ops.md is out of date

Each family is listed in the order ``rules.py`` declares it, with the docstring of the family module
its rules call (``family_*.py``), the notes its ``declare(...)`` lines give, and every op it covers.
Rules added from user code (``sl.register_rule``, family "user") are left out: the page describes what
sbplab ships. ``tests/test_ops_docs.py`` fails when the page and the table disagree.
"""

from __future__ import annotations

import inspect
import sys
import types
from pathlib import Path

from . import rules
from .rules import RULES, Rule

DOC = Path(__file__).resolve().parents[3] / "docs" / "ops.md"
FAMILY_PREFIX = f"{__package__}.family_"


def _family_modules(rule: Rule) -> list[types.ModuleType]:
    """The ``family_*`` modules whose functions ``rule`` calls: the function itself, or those a lambda
    in ``rules.py`` reaches through a module alias (``red.reduce_signatures``)."""
    fn = rule.sig_fn
    found: list[types.ModuleType] = []
    mod = sys.modules.get(getattr(fn, "__module__", "") or "")
    if mod is not None and mod.__name__.startswith(FAMILY_PREFIX):
        found.append(mod)
    code = getattr(fn, "__code__", None)
    for name in code.co_names if code is not None else ():
        value = getattr(rules, name, None)
        if isinstance(value, types.ModuleType) and value.__name__.startswith(FAMILY_PREFIX):
            found.append(value)
        elif inspect.isfunction(value) and value.__module__.startswith(FAMILY_PREFIX):
            found.append(sys.modules[value.__module__])
    return list(dict.fromkeys(found))


def _paragraphs(doc: str | None) -> list[str]:
    """A docstring as markdown paragraphs (``x`` spelled `x`)."""
    text = inspect.cleandoc(doc or "").replace("``", "`")
    return [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]


def families() -> dict[str, list[tuple[str, Rule]]]:
    """Family name -> its (op, rule) pairs, in declaration order; user rules left out."""
    out: dict[str, list[tuple[str, Rule]]] = {}
    for op, rule in RULES.items():
        if rule.family != "user":
            out.setdefault(rule.family, []).append((op, rule))
    return out


def render() -> str:
    """The text of docs/ops.md."""
    fams = families()
    n_ops = sum(len(v) for v in fams.values())
    lines = [
        "# SBP rules of the ATen ops",
        "",
        "Generated from `sbplab/ops/aten/rules.py` by `python -m sbplab.ops.aten.docs`; `tests/test_ops_docs.py`",
        "fails when this page and the table of rules disagree (`SBPLAB_WRITE_DOCS=1 pytest tests/test_ops_docs.py`",
        "rewrites it too).",
        "",
        "A model captured at ATen level (`sl.compile(..., capture=\"aten\")`, or `\"auto\"` where torch.fx cannot",
        "map it) is a graph of ATen ops, each named by its overload (`aten.addmm.default`). An op's SBP rule",
        "gives its 1-D signatures; the registry always adds all-`B` (every rank computes the whole op) and",
        "builds n-D signatures as products over the mesh axes, kept where every rank's local shapes agree.",
        "The local kernel is always the ATen op itself, run on the shards; shapes come from meta tensors and",
        "FLOPs from `torch.utils.flop_counter`. Every rule is checked on shards against torch for every op",
        "instance the real-model corpus captures (`tests/test_aten_rules.py`).",
        "",
        f"{n_ops} ops in {len(fams)} families are declared; ops marked with * also rewrite their arguments for",
        "each shard (`localize`: a view's target shape, an arange's range), which happens when the step is",
        "compiled, so workers need nothing but torch.",
        "",
        "| family | ops |",
        "|---|---|",
    ]
    for fam, ops in fams.items():
        lines.append(f"| [{fam}](#{fam}) | {len(ops)} |")
    described: dict[str, str] = {}  # family module -> the family under which its docstring is shown
    for fam, ops in fams.items():
        lines += ["", f"## {fam}", ""]
        mods = list(dict.fromkeys(m for _, r in ops for m in _family_modules(r)))
        for mod in mods:
            path = f"`{mod.__name__.replace('.', '/')}.py`"
            if mod.__name__ in described:
                first = described[mod.__name__]
                lines += [f"Rules in {path}, described under [{first}](#{first}).", ""]
                continue
            described[mod.__name__] = fam
            for para in _paragraphs(mod.__doc__):
                lines += [para, ""]
            lines += [f"Rules in {path}.", ""]
        notes = list(dict.fromkeys(r.note for _, r in ops if r.note))
        for note in notes:
            lines += [f"Note: {note}.", ""]
        lines.append(", ".join(f"`{op}`" + ("*" if r.localize is not None else "") for op, r in ops))
    lines += [
        "",
        "## Ops with no declared rule",
        "",
        "**Pointwise by torch's tag.** An `aten` op that is not declared above but carries",
        "`torch.Tag.pointwise` (an elementwise op such as `aten.atan.default`) gets the pointwise family's",
        "rule: any output dim split, inputs split where they broadcast into it. Partial sums (`P`) pass only",
        "through the ops the pointwise family lists as linear, so an undeclared op never receives one.",
        "",
        "**Replicated.** Any other op (an ATen op outside the table, a library's custom op such as",
        "`transformers.grouped_mm_fallback.default`) still runs, whole on every rank: its only signature is",
        "all-`B`, so its inputs are gathered or broadcast first. The capture warns with a",
        "`sl.ReplicatedOpWarning` that names each such op and the modules it appears in.",
        "",
        "**Adding a rule.** In sbplab, one `declare(family, ops, signatures)` line in",
        "`sbplab/ops/aten/rules.py` (and a family function in a `family_*.py` file if no family fits), then",
        "`python -m sbplab.ops.aten.docs` to rewrite this page. From user code, without editing sbplab:",
        "",
        "```python",
        "sl.register_rule(\"mylib.scaled_tanh.default\",",
        "                 lambda ins, outs, attrs: [sl.Signature((sl.S(0),), (sl.S(0),))])",
        "```",
        "",
        "`signatures(in_metas, out_metas, attrs)` returns 1-D `sl.Signature`s (all-`B` is always added);",
        "`localize=` rewrites an op's arguments for one shard where they depend on it. The rule replaces",
        "any declared one and forgets every answer cached from the old rule.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = render()
    if "--check" in argv:
        if not DOC.exists() or DOC.read_text() != text:
            print(f"{DOC} is out of date: run python -m sbplab.ops.aten.docs", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
