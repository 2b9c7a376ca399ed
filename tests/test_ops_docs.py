"""docs/ops.md is the table of ATen SBP rules (``sbplab/ops/aten/rules.py``), rendered by
``sbplab.ops.aten.docs``. ``test_the_page_is_up_to_date`` fails when the page and the rules disagree;
with ``SBPLAB_WRITE_DOCS=1`` it rewrites the page instead (``python -m sbplab.ops.aten.docs`` does too).

The page is rendered in a fresh process: rules that other tests register from user code
(``sl.register_rule``) live in this one and are not part of what sbplab ships."""

from __future__ import annotations

import subprocess
import sys

import torch
from conftest import check_generated_doc

from sbplab.ops.aten import RULES, rule_for
from sbplab.ops.aten.docs import DOC, families, render

RENDER = "import sys; from sbplab.ops.aten.docs import render; sys.stdout.write(render())"


def test_the_page_is_up_to_date():
    text = subprocess.run([sys.executable, "-c", RENDER], capture_output=True, text=True, check=True,
                          timeout=120).stdout
    check_generated_doc(DOC, text, "python -m sbplab.ops.aten.docs (or SBPLAB_WRITE_DOCS=1 pytest tests/test_ops_docs.py)")


def test_every_declared_op_and_family_is_on_the_page():
    text = render()
    shipped = {op: r for op, r in RULES.items() if r.family != "user"}
    assert len(shipped) >= 100
    assert [op for op in shipped if f"`{op}`" not in text] == []
    assert [fam for fam in families() if f"\n## {fam}\n" not in text] == []


def test_every_family_is_described_by_its_module():
    """Each family's rules call a ``family_*.py`` module whose docstring the page shows."""
    from sbplab.ops.aten.docs import _family_modules

    for fam, ops in families().items():
        mods = {m for _, r in ops for m in _family_modules(r)}
        assert mods and all(m.__doc__ for m in mods), fam


@torch.library.custom_op("sbplab_docs_test::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


TWICE = "sbplab_docs_test.twice.default"  # an op no rule is declared for, now or later


def test_the_fallbacks_are_described():
    text = render()
    assert rule_for("aten.atan.default").family == "pointwise" and "torch.Tag.pointwise" in text
    assert rule_for(TWICE).family == "replicated" and "sl.ReplicatedOpWarning" in text
    assert "sl.register_rule(" in text


def test_user_rules_are_left_out():
    import sbplab as sl
    from sbplab.ops.aten.rules import forget

    try:
        sl.register_rule(TWICE, lambda ins, outs, attrs: [])
        assert rule_for(TWICE).family == "user" and TWICE not in render()
    finally:
        RULES.pop(TWICE, None)
        forget(TWICE)
