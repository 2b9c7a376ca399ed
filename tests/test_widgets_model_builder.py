"""ModelBuilder state without a browser: set input traits (as the page would), check the derived ones."""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("anywidget")

from sbplab.compiler import from_torch  # noqa: E402
from sbplab.models import GPT, MLP, GPTConfig, MLPConfig  # noqa: E402
from sbplab.viz import dot_available, logical_dot  # noqa: E402
from sbplab.widgets import ModelBuilder  # noqa: E402
from sbplab.widgets._assets import asset_path  # noqa: E402
from sbplab.widgets.zoo import LayerStack, layer_names  # noqa: E402


def test_zoo_model_matches_the_zoo_and_its_graph():
    w = ModelBuilder("mlp", n_blocks=3, hidden=48)
    assert w.error == "" and w.mode == "zoo" and w.version == 1
    ref = MLP(MLPConfig(n_blocks=3, hidden=48))
    assert w.n_params == sum(p.numel() for p in ref.parameters()) == w.model.n_params
    assert {f["name"]: f["value"] for f in w.config_fields}["n_blocks"] == 3
    (x,), y = ref.example_batch(8)
    assert torch.equal(w.model.inputs[0], x) and torch.equal(w.model.target, y)
    g = from_torch(w.module, w.model.inputs, w.model.loss_fn, w.model.target)
    assert [o.type for o in w.graph.ops] == [o.type for o in g.ops] and w.n_ops == len(g.ops)
    assert w.dot == logical_dot(w.graph, collapse=True, title="mlp: logical graph (forward)")
    assert w.graph_text == w.graph.dump()
    if dot_available():
        assert w.graph_svg.lstrip().startswith(("<?xml", "<svg", "<!--")) and w.graph_note == ""
    else:
        assert w.graph_svg == "" and "graphviz" in w.graph_note


def test_sizes_change_the_model_and_repeats_collapse():
    w = ModelBuilder("gpt", n_layer=4, n_embd=16, n_head=2, vocab_size=32, block_size=8)
    cfg = GPTConfig(n_layer=4, n_embd=16, n_head=2, vocab_size=32, block_size=8)
    assert w.n_params == sum(p.numel() for p in GPT(cfg).parameters())
    assert "repeat:blocks.1-2" in w.dot  # blocks 1..2 drawn as one node, 0 and 3 expanded
    v = w.version
    w.collapse = False
    assert "repeat:" not in w.dot and w.version == v + 1
    w.set_size("n_layer", 1)
    assert w.n_params == sum(p.numel() for p in GPT(GPTConfig(n_layer=1, n_embd=16, n_head=2, vocab_size=32,
                                                               block_size=8)).parameters())
    assert w.config["n_layer"] == 1 and "blocks.1" not in w.dot


def test_bad_sizes_are_messages_and_keep_the_last_good_model():
    w = ModelBuilder("gpt", n_layer=1, n_embd=16, n_head=2, vocab_size=16, block_size=4)
    good, v = w.model, w.version
    shown = (w.summary, w.graph_svg, w.graph_text)
    assert not w.stale and w.graph_text
    w.set_size("n_head", 3)
    assert w.error == "n_head (3) must divide n_embd (16)" and w.model is good and w.version == v
    assert w.stale and (w.summary, w.graph_svg, w.graph_text) == shown  # the last good model stays on the page
    w.set_size("n_head", "x")
    assert w.error == "gpt config n_head: 'x' is not a whole number"
    w.set_state({"config": {**w.config, "n_head": 4}})  # the page sends a whole config dict
    assert w.error == "" and w.version == v + 1 and not w.stale
    w.config = {**w.config, "depth": 3}
    assert "gpt config has no field 'depth'" in w.error and "n_layer" in w.error
    w.config = {k: v for k, v in w.config.items() if k != "depth"}
    w.batch = 0
    assert "batch must be >= 1" in w.error
    w.zoo_model = "resnet"
    assert "'resnet' is not in the zoo; pick one of mlp, gpt, wide_deep, cnn" in w.error
    w.mode = "both"
    assert "mode 'both'" in w.error


def test_switching_zoo_models_starts_from_their_defaults():
    w = ModelBuilder("mlp", n_blocks=1)
    w.zoo_model = "cnn"
    assert w.error == "" and w.batch == 8 and w.config["channels"] == "8, 16"
    fields = {f["name"]: f for f in w.config_fields}
    assert fields["channels"]["kind"] == "dims" and fields["in_channels"]["kind"] == "int"
    w.set_size("channels", "4, x")
    assert "cnn config channels" in w.error and "'x' is not a whole number" in w.error
    w.set_size("channels", "4, 6")
    assert w.error == "" and w.module.conv2.out_channels == 6
    w.zoo_model = "gpt"
    assert w.batch == 4 and w.config["n_layer"] == GPTConfig().n_layer
    assert {f["name"]: f["kind"] for f in w.config_fields}["bias"] == "bool"
    w.zoo_model = "mlp"
    assert {f["name"]: f for f in w.config_fields}["activation"]["choices"] == ["relu", "gelu", "tanh"]
    w.set_size("activation", "swish")
    assert "'swish' is not offered; pick one of relu, gelu, tanh" in w.error


def test_layers_added_one_by_one():
    w = ModelBuilder(layers=[{"kind": "Linear", "size": 12}, {"kind": "ReLU"}], in_features=6, batch=4)
    assert w.mode == "layers" and w.error == "" and w.layer_names == ["b0_fc1", "act1"]
    w.add_layer("Linear", 5)
    w.add_layer("LayerNorm")
    assert w.layer_names == ["b0_fc1", "act1", "b0_fc2", "ln3"]
    assert [o.type for o in w.graph.ops] == ["linear", "relu", "linear", "layer_norm", "cross_entropy"]
    m = w.module
    x = w.model.inputs[0]
    fc1, fc2, ln = m.layers["b0_fc1"], m.layers["b0_fc2"], m.layers["ln3"]
    want = ln(fc2(torch.relu(fc1(x))))
    assert torch.allclose(m(x), want) and tuple(m(x).shape) == (4, 5)
    assert int(w.model.target.max()) < 5  # classes = the last width
    w.remove_layer(1)
    assert [o.type for o in w.graph.ops] == ["linear", "linear", "layer_norm", "cross_entropy"]
    with pytest.raises(IndexError, match="there are 3 layers"):
        w.remove_layer(7)


def test_bad_layers_say_which_and_what_is_valid():
    w = ModelBuilder(layers=[{"kind": "Linear", "size": 8}])
    w.layers = [{"kind": "Conv"}]
    assert w.error == "layer 0: 'Conv' is not a layer kind; pick one of Linear, ReLU, GELU, Tanh, LayerNorm"
    w.layers = [{"kind": "ReLU"}, {"kind": "Linear", "size": 0}]
    assert w.error == "layer 1 (Linear): size must be a whole number >= 1, got 0"
    w.layers = [{"kind": "ReLU"}]
    assert "add at least one Linear layer" in w.error
    w.layers = [{"kind": "Linear", "size": 3}]
    assert w.error == "" and w.model.module.out_features == 3


def test_megatron_names_pair_consecutive_linear_layers():
    layers = [{"kind": k, "size": 4} if k == "Linear" else {"kind": k}
              for k in ("Linear", "GELU", "Linear", "Linear", "Tanh", "Linear", "Linear")]
    assert layer_names(layers) == ["b0_fc1", "act1", "b0_fc2", "b1_fc1", "act4", "b1_fc2", "b2_fc1"]
    m = LayerStack(3, layers)
    assert [n for n, _ in m.named_parameters()][:2] == ["layers.b0_fc1.weight", "layers.b0_fc1.bias"]


def test_state_reaches_the_page_and_testids_match():
    w = ModelBuilder("mlp")
    state = w.get_state()
    for name in ("graph_svg", "graph_text", "graph_note", "config_fields", "summary", "error", "layers", "zoo_names"):
        assert name in state
    assert re.match(r"mlp: [\d,]+ parameters in \d+ tensors, \d+ forward ops; inputs x float32\[8, 16\]",
                    w.summary)
    js = asset_path("model_builder.js").read_text()
    assert "export default" in js
    for tid in ("mode-select", "zoo-select", "config-fields", "layer-list", "add-layer", "error-message",
                "logical-graph", "graph-text", "batch-input"):
        assert f'"{tid}"' in js
    assert "`size-${f.name}`" in js and "`remove-layer-${i}`" in js
    assert ".sbplab-mb" in asset_path("model_builder.css").read_text()
