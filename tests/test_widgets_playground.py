"""SbpPlayground state without a browser: set input traits (as clicks would), check the derived ones."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

pytest.importorskip("anywidget")

import sbplab as sl  # noqa: E402
from sbplab.boxing import plan_boxing  # noqa: E402
from sbplab.viz import layout_picture  # noqa: E402
from sbplab.widgets import SbpPlayground, button_testid, sbp_choices  # noqa: E402
from sbplab.widgets._assets import asset_path  # noqa: E402

MESH22 = sl.Placement("cpu", [[0, 1], [2, 3]])


def test_default_state_matches_core_objects():
    w = SbpPlayground(shape=(8, 6), mesh=(2, 2), sbp="S(0), B", target="B, S(1)")
    assert w.error == "" and w.shape == [8, 6] and w.mesh_shape == [2, 2]
    assert w.choices == ["B", "P", "S(0)", "S(1)"] == sbp_choices(2)
    src = layout_picture((8, 6), MESH22, "S(0), B", name="from")
    assert w.src_type == src.summary() and w.src_svg == src.to_svg()
    assert w.local_shapes == [
        {"rank": r, "coords": list(MESH22.coords(r)),
         "src": list(sl.local_shape((8, 6), MESH22, (sl.S(0), sl.B), r)),
         "dst": list(sl.local_shape((8, 6), MESH22, (sl.B, sl.S(1)), r))} for r in range(4)]
    plan = plan_boxing((8, 6), "S(0), B", "B, S(1)", MESH22)
    assert [s["kind"] for s in w.steps] == [s.kind for s in plan.steps]
    assert w.total_bytes == plan.total_bytes and w.time_us == pytest.approx(plan.time_s * 1e6)
    assert w.boxing_text == plan.describe()


def test_click_changes_layout_and_boxing_with_brief_byte_counts():
    w = SbpPlayground(shape=(8, 6), mesh=(2, 2), sbp="S(0), B", target="S(0), B")
    assert w.steps == [] and w.total_bytes == 0
    before_svg = w.dst_svg
    w.select("dst", 0, "B")  # S(0) -> B on axis0: all-gather, T(p-1)/p per rank
    assert w.dst_svg != before_svg and w.dst_sbp == ["B", "B"]
    (step,) = w.steps
    T = 8 * 6 * 4  # logical bytes on that axis (the whole tensor: axis 1 is B)
    assert step["kind"] == "all_gather" and step["axis"] == "axis0"
    assert step["max_bytes_per_rank"] == T * (2 - 1) // 2
    assert step["groups"] == [[0, 2], [1, 3]]
    w.src_sbp = ["B", "P"]  # P -> B on axis1: all-reduce, 2T(p-1)/p per rank
    (step,) = w.steps
    assert step["kind"] == "all_reduce(sum)" and step["max_bytes_per_rank"] == 2 * T * (2 - 1) // 2
    assert "P addend" in w.src_svg and "partial" in w.src_svg


def test_browser_messages_go_through_set_state():
    # a click in the page arrives as a comm message that ipywidgets turns into set_state
    w = SbpPlayground()
    w.set_state({"src_sbp": ["S(1)", "S(0)"]})
    assert w.src_type == layout_picture((8, 6), MESH22, "S(1), S(0)", name="from").summary()
    state = w.get_state()
    for name in ("src_svg", "dst_svg", "steps", "error", "choices", "local_shapes", "boxing_text"):
        assert name in state  # synced to the page
    assert state["src_sbp"] == ["S(1)", "S(0)"]


def test_bad_input_is_a_message_not_a_traceback():
    w = SbpPlayground()
    w.shape_text = "8, x"
    assert re.search(r"'x' is not a whole number", w.error)
    assert w.src_svg == "" and w.steps == [] and w.picture is None
    w.shape_text = "3, 6"
    w.mesh_text = "4"
    w.src_sbp = ["S(0)"]
    assert "dim 0 has 3 elements" in w.error and "split into 4 parts" in w.error
    w.src_sbp = ["Q"]
    assert "'Q' is not an SBP" in w.error and "S(1)" in w.error
    w.mesh_text = "8, 8, 2"
    assert "at most 64" in w.error
    w.dtype = "float8"
    assert "pick one of float32" in w.error
    w.dtype, w.mesh_text, w.src_sbp, w.shape_text = "float32", "2", ["S(1)"], "4, 6"
    assert w.error == "" and w.src_type.startswith("from: f32[4,6@axis0]")
    with pytest.raises(ValueError, match="side must be"):
        w.select("left", 0, "B")


def test_mesh_and_shape_changes_keep_sbp_lists_consistent():
    w = SbpPlayground(shape=(8, 6), mesh=(2, 2), sbp="S(0), S(1)", target="B, S(1)")
    w.mesh_text = "2, 2, 2"
    assert w.src_sbp == ["S(0)", "S(1)", "B"] and w.dst_sbp == ["B", "S(1)", "B"]
    assert len(w.local_shapes) == 8 and w.error == ""
    w.mesh_text = "4"
    assert w.src_sbp == ["S(0)"] and w.dst_sbp == ["B"]
    w.mesh_text, w.src_sbp = "2, 2", ["S(0)", "S(1)"]
    w.shape_text = "8"
    assert w.src_sbp == ["S(0)", "B"] and "S(1) does not fit a 1-D tensor" in w.note
    assert w.choices == ["B", "P", "S(0)"]


def test_dtype_and_devices_change_cost_not_layout():
    w = SbpPlayground(shape=(16, 16), mesh=(4,), sbp="P", target="B")
    b32, t32 = w.total_bytes, w.time_us
    w.dtype = "float64"
    assert w.total_bytes == 2 * b32 and w.src_type.startswith("from: f64[16,16]")
    w.dtype, w.device_type = "float32", "cuda"
    expect = plan_boxing((16, 16), "P", "B", sl.Placement("cuda", 4))
    assert w.total_bytes == b32 and w.time_us == pytest.approx(expect.time_s * 1e6) and w.time_us != t32


def test_testids_match_the_page_and_assets_are_found():
    assert button_testid("src", 0, "S(1)") == "src-axis0-S1"
    assert button_testid("dst", 2, "P(max)") == "dst-axis2-Pmax"
    js = asset_path("sbp_playground.js").read_text()
    assert "export default" in js
    tids = ("shape-input", "mesh-input", "error-message", "boxing-summary", "boxing-steps", "local-shapes")
    for tid in tids:
        assert f'"{tid}"' in js
    assert "`${name}-axis${axis}-${token(choice)}`" in js and "`${name}-layout`" in js
    assert ".sbp-choice.selected" in asset_path("sbp_playground.css").read_text()
    w = SbpPlayground()
    assert "export default" in str(w._esm)


def test_wheel_ships_assets_where_the_lookup_finds_them(tmp_path: Path):
    pytest.importorskip("hatchling")
    root = Path(__file__).resolve().parent.parent
    subprocess.run([sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(tmp_path / "dist")],
                   cwd=root, check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    spec = importlib.util.spec_from_file_location("installed_assets", site / "sbplab/widgets/_assets.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    found = mod.asset_path("sbp_playground.js")
    assert found == site / "sbplab/_widgets/sbp_playground.js"
    assert found.read_text() == asset_path("sbp_playground.js").read_text()


def test_global_tensor_dtype_reaches_picture():
    pic = layout_picture((4, 4), sl.Placement("cpu", 2), "S(1)", dtype=torch.bfloat16)
    assert pic.local_types() == ["bf16[4,2]"]


WIDGET_FILES = ("sbp_playground", "model_builder", "strategy_editor", "run_panel")


def test_esm_and_css_are_the_files_and_the_shared_helpers_travel_as_traits():
    """Each widget's module and CSS are its own files (anywidget watches those in development mode);
    dom.js and base.css are written once and reach every widget as the traits it imports them from."""
    import re

    from sbplab.widgets import ModelBuilder, RunPanel, StrategyEditor
    from sbplab.widgets._assets import shared_module, shared_style, widget_module
    from sbplab.widgets.widget_base import SbplabWidget

    dom, base = shared_module().read_text(), shared_style().read_text()
    exported = set(re.findall(r"^export function (\w+)", dom, flags=re.M))
    assert {"h", "fmtBytes", "redrawOn", "onEnter", "onEnterOrChange", "showValue", "useBaseCss"} <= exported
    assert base.count(".sbplab-widget {") == 1
    for cls, name in ((SbpPlayground, "sbp_playground"), (ModelBuilder, "model_builder"),
                      (StrategyEditor, "strategy_editor"), (RunPanel, "run_panel")):
        assert issubclass(cls, SbplabWidget), cls
        assert cls._esm._path == asset_path(f"{name}.js").resolve()  # anywidget's FileContents of the path
        assert cls._css._path == asset_path(f"{name}.css").resolve()
        assert cls._dom_js.default_value == dom and cls._base_css.default_value == base
    w = SbpPlayground()
    assert w._dom_js == dom and w._base_css == base and w._esm == asset_path("sbp_playground.js").read_text()
    assert {"_dom_js", "_base_css", "_esm", "_css"} <= set(w.get_state())
    for name in WIDGET_FILES:
        src = widget_module(f"{name}.js").read_text()
        # the helpers come from dom.js, not from a copy: a second definition would drift from it
        assert not re.search(r"^(?:export )?function (?:h|redrawOn|fmtBytes|onEnterOrChange)\(", src, flags=re.M)
        assert 'model.get("_dom_js")' in src and "export default { initialize, render }" in src
    with pytest.raises(ValueError, match="give a widget's own .js file"):
        widget_module("dom.js")


def test_widget_styles_use_only_the_themes_colours():
    """Light and dark JupyterLab themes both stay readable: no colour is written into the CSS or JS;
    every colour is one of JupyterLab's variables (--jp-...)."""
    import re

    for name in (*WIDGET_FILES, "base", "dom"):
        for ext in ("css", "js"):
            path = asset_path(f"{name}.{ext}") if (name, ext) not in (("base", "js"), ("dom", "css")) else None
            if path is None:
                continue
            text = path.read_text()
            assert not re.search(r"#[0-9a-fA-F]{3,8}\b|\brgba?\(|\bhsla?\(", text), path.name
            for var in re.findall(r"var\((--[\w-]+)", text):
                assert var.startswith("--jp-"), (path.name, var)
            if ext == "css":  # named colours too: each colour-bearing declaration names a theme variable
                for prop, value in re.findall(r"([\w-]*(?:color|background|border|outline|shadow)[\w-]*)\s*:\s*([^;}]+)",
                                              re.sub(r"/\*.*?\*/", "", text, flags=re.S)):
                    if prop in ("border-collapse", "border-radius"):
                        continue
                    colourless = re.fullmatch(r"\s*(none|inherit|transparent|currentColor|[\d.]+px)\s*", value)
                    assert colourless or "var(--jp-" in value, (path.name, prop, value)


def test_a_saved_shared_file_reaches_live_widgets():
    """Development mode: an edited dom.js is re-sent and the widget's module re-sent with a marker (so
    anywidget's hot reload runs it again); an edited base.css is re-sent as it is."""
    from sbplab.widgets import widget_base

    w = SbpPlayground()
    own = asset_path("sbp_playground.js").read_text()
    widget_base._dom_js_saved("export function h() {}\n")
    assert w._dom_js == "export function h() {}\n" and w._esm.startswith(own) and "dom.js reloaded" in w._esm
    widget_base._base_css_saved(".sbplab-widget { color: var(--jp-ui-font-color0); }")
    assert w._base_css == ".sbplab-widget { color: var(--jp-ui-font-color0); }"
    fresh = SbpPlayground()  # the next widget starts from the files again
    assert fresh._dom_js == asset_path("dom.js").read_text() and fresh._esm == own
