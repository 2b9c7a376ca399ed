"""One API vocabulary: every entry point that takes a model takes ``(model, inputs, *, target, loss_fn,
optimizer, strategy, hardware)``: the same names, as keywords, in the same order."""

import inspect

import pytest

import sbplab as sl
from sbplab.widgets import SearchPanel, StrategyEditor

VOCABULARY = ["target", "loss_fn", "optimizer", "strategy", "hardware"]
ENTRY_POINTS = {
    "sl.compile": sl.compile,
    "sl.search": sl.search,
    "sl.compare_with_torch": sl.compare_with_torch,
    "sl.torch_steps": sl.torch_steps,
    "StrategyEditor": StrategyEditor.__init__,
    "SearchPanel": SearchPanel.__init__,
}


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_entry_point_speaks_the_vocabulary(name):
    params = [p for p in inspect.signature(ENTRY_POINTS[name]).parameters.values() if p.name != "self"]
    assert params[1].name == "inputs", f"{name}: second argument is {params[1].name!r}"
    named = {p.name: p for p in params}
    present = [v for v in VOCABULARY if v in named]
    assert present[:2] == ["target", "loss_fn"], f"{name}: {present}"
    assert [p.name for p in params if p.name in VOCABULARY] == present, f"{name}: out of order"
    for v in present:
        assert named[v].kind is inspect.Parameter.KEYWORD_ONLY, f"{name}: {v} is not keyword-only"


def test_simulate_defaults_to_the_machine_the_step_was_compiled_for():
    from sbplab.models import MLP, MLPConfig

    model = MLP(MLPConfig(in_dim=8, width=16, hidden=32, n_blocks=1, n_classes=4))
    (x,), y = model.example_batch(16)
    kw = dict(target=y, loss_fn=model.loss_fn, optimizer=sl.SGD(lr=0.1), strategy=sl.presets.data_parallel(2))
    step = sl.compile(model, (x,), **kw)
    assert sl.simulate(step).step_time == sl.simulate(step, sl.Hardware.cpu_box()).step_time
    h100 = sl.Hardware.h100_node()
    on_h100 = sl.compile(model, (x,), hardware=h100, **kw)
    assert sl.simulate(on_h100).step_time == sl.simulate(on_h100, h100).step_time
    with pytest.raises(TypeError):
        sl.compile(model, (x,), model.loss_fn, y)  # the positional dialect is gone
