"""Graph pictures as DOT text: the nodes, clusters, collapsed layers and edge types of real graphs."""

from __future__ import annotations

import re

import pytest
import torch

import sbplab as sl
from sbplab.compiler.frontend.from_torch import from_torch
from sbplab.compiler.training.autodiff import add_backward
from sbplab.models import MLP, MLPConfig
from sbplab.sbp import fmt_sbp
from sbplab.viz import layout_picture
from sbplab.viz.dot import DotPicture, dot_available, q
from sbplab.viz.graph_dot import logical_dot, logical_picture
from sbplab.viz.repeat import RepeatGroup, find_repeats, unit_of

NODE = re.compile(r'^\s*"([^"]+)" \[(.*)\];$', re.M)
EDGE = re.compile(r'^\s*"([^"]+)" -> "([^"]+)"(?: \[(.*)\])?;$', re.M)


def mlp_graph(n_blocks: int, backward: bool = False):
    m = MLP(MLPConfig(n_blocks=n_blocks))
    (x,), y = m.example_batch()
    g = from_torch(m, x, m.loss_fn, y)
    if backward:
        add_backward(g)
    return g


def nodes(dot: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in NODE.finditer(dot)}


def edges(dot: str) -> list[tuple[str, str, str]]:
    return [(m.group(1), m.group(2), m.group(3) or "") for m in EDGE.finditer(dot)]


def label(attrs: str) -> str:
    return re.search(r'label="((?:[^"\\]|\\.)*)"', attrs).group(1)


def test_units_and_repeats():
    assert unit_of("blocks.3.attn.q") == ("blocks", 3) and unit_of("head") is None and unit_of("") is None
    pairs = [(("b", i), t) for i in range(6) for t in ("linear", "relu")]
    assert find_repeats(pairs) == [RepeatGroup("b", 1, 4, 0, 2)]
    assert find_repeats(pairs, keep=2) == [RepeatGroup("b", 2, 3, 0, 2)]
    odd = [p for p in pairs if p[0] != ("b", 3)] + [(("b", 3), "gelu"), (("b", 3), "linear")]
    # b.3 differs: the run b.1-b.2 before it collapses, the single b.4 after it does not
    assert find_repeats(odd) == [RepeatGroup("b", 1, 2, 0, 2)]
    with pytest.raises(ValueError, match="keep must be >= 1"):
        find_repeats(pairs, keep=0)


def test_runs_of_equal_units_collapse_even_when_the_first_differs():
    def units(types_of):  # index -> op types
        return [(("blocks", i), t) for i, ts in enumerate(types_of) for t in ts]

    same, other = ("linear", "relu"), ("linear", "gelu", "linear")
    assert find_repeats(units([other] + [same] * 11)) == [RepeatGroup("blocks", 2, 10, 1, 2)]
    # a run whose layer is already drawn refers to it and collapses from its start
    assert find_repeats(units([same] * 4 + [other] + [same] * 6)) == [
        RepeatGroup("blocks", 1, 3, 0, 2), RepeatGroup("blocks", 5, 9, 0, 2)]
    assert find_repeats(units([other] + [same] * 11), keep=2) == [RepeatGroup("blocks", 3, 9, 1, 2)]
    # two runs of different layers each collapse on their own; prefixes are separate stacks
    mixed = units([same] * 4 + [other] * 4) + [(("heads", i), "linear") for i in range(4)]
    assert find_repeats(mixed) == [RepeatGroup("blocks", 1, 3, 0, 2), RepeatGroup("blocks", 5, 6, 4, 3),
                                   RepeatGroup("heads", 1, 2, 0, 1)]


class _Block(torch.nn.Module):
    def __init__(self, extra: bool) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.extra = extra

    def forward(self, x):
        y = torch.relu(self.fc(x))
        return torch.tanh(y) if self.extra else y


class _Stack(torch.nn.Module):
    """Six blocks; ``blocks.0`` does one op more than the others."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([_Block(i == 0) for i in range(6)])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def test_a_different_first_block_leaves_the_others_collapsed_in_dot_text():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    g = from_torch(_Stack(), (x,), torch.nn.functional.mse_loss, y)
    ns = nodes(logical_dot(g))
    (rep,) = [n for n in ns if n.startswith("repeat:")]
    assert rep == "repeat:blocks.2-4"
    assert label(ns[rep]) == r"blocks.2 … blocks.4\n3 × same as blocks.1\n2 ops each"
    shown = {o.name for o in g.ops if f"op:{o.name}" in ns}
    assert {unit_of(o.module) for o in g.ops if o.name in shown and o.module} == {("blocks", i) for i in (0, 1, 5)}


def test_physical_graph_after_a_signature_change_in_blocks_0_still_collapses():
    from sbplab.compiler import SGD, compile, presets
    from sbplab.viz import physical_dot

    m = MLP(MLPConfig(n_blocks=6))
    (x,), y = m.example_batch(8)
    st = presets.data_parallel(2).signature("blocks.0.fc1", "(B), (S(0)), (S(0)) -> (S(1))")
    c = compile(m, (x,), loss_fn=m.loss_fn, target=y, optimizer=SGD(lr=0.1), strategy=st)
    dot = physical_dot(c.physical, c.graph, ranks=[0])
    ns = nodes(dot)
    (rep,) = [n for n in ns if "repeat:" in n]
    assert rep == "r0:repeat:blocks.2-4"
    assert label(ns[rep]).startswith(r"blocks.2 … blocks.4\n3 × same as blocks.1\n")
    assert re.findall(r'subgraph "cluster_[^"]*"', dot) == ['subgraph "cluster_rank0"']
    assert any(n.startswith("n") and "blocks.0.fc1" in label(a) for n, a in ns.items())
    assert any(n.startswith("n") and "blocks.1.fc1" in label(a) for n, a in ns.items())
    assert not any(n.startswith("n") and "blocks.3.fc1" in label(a) for n, a in ns.items())


def test_repeated_blocks_collapse_into_one_summary_node():
    g = mlp_graph(6)
    dot = logical_dot(g)
    ns = nodes(dot)
    (rep,) = [n for n in ns if n.startswith("repeat:")]
    assert label(ns[rep]) == r"blocks.1 … blocks.4\n4 × same as blocks.0\n4 ops each"
    shown = {n.removeprefix("op:") for n in ns if n.startswith("op:")}
    hidden = {o.name for o in g.ops if unit_of(o.module) in {("blocks", i) for i in range(1, 5)}}
    assert shown == {o.name for o in g.ops} - hidden and len(hidden) == 16
    assert re.findall(r'subgraph "cluster_([^"]+)"', dot) == ["blocks.0", "blocks.5"]
    es = edges(dot)
    add_0 = g.tensors["add"].producer  # output of blocks.0 feeds the collapsed run
    assert (f"op:{add_0}", rep) in {(a, b) for a, b, _ in es}
    assert {b for a, b, _ in es if a == rep} == {"op:blocks.5.fc1", "op:add_5"}
    assert not any(n.startswith("tensor:blocks.2.") for n in ns)  # params of collapsed layers hidden


def test_uncollapsed_graph_has_every_op_and_typed_edges():
    g = mlp_graph(3)
    dot = logical_dot(g, collapse=False)
    ns = nodes(dot)
    assert {n.removeprefix("op:") for n in ns if n.startswith("op:")} == {o.name for o in g.ops}
    assert len(re.findall(r'subgraph "cluster_', dot)) == 3
    for a, b, attrs in edges(dot):
        name = b.removeprefix("op:")
        op = g.op_by_name[name]
        srcs = [t for t in op.inputs if (g.tensors[t].producer and f"op:{g.tensors[t].producer}" == a)
                or f"tensor:{t}" == a]
        t = g.tensors[srcs[0]]
        dtype = "i64" if "int64" in str(t.meta.dtype) else "f32"
        assert label(attrs) == f"{dtype}[{','.join(map(str, t.shape))}]"
    loss = g.tensors[g.loss].producer
    assert 'peripheries="2"' in ns[f"op:{loss}"]
    no_params = nodes(logical_dot(g, collapse=False, show_params=False))
    assert not any(n.startswith("tensor:") and "weight" in n for n in no_params)
    assert "tensor:x" in no_params


def test_edges_carry_sbp_and_local_shape():
    g = mlp_graph(2)
    mesh = sl.Placement("cpu", [[0, 1], [2, 3]], axis_names=("dp", "tp"))
    sbp = {"x": (sl.S(0), sl.B), "blocks.0.fc1": (sl.S(0), sl.S(1))}
    dot = logical_dot(g, sbp=sbp, placement=mesh)
    labels = {(a, b): label(attrs) for a, b, attrs in edges(dot)}
    assert labels[("tensor:x", "op:proj_in")] == r"f32[8@dp,16] (S(0), B)\nlocal f32[4,16]"
    hidden = g.tensors["blocks.0.fc1"]
    want = f"f32[{hidden.shape[0]}@dp,{hidden.shape[1]}@tp] (S(0), S(1))"
    act = g.tensors["blocks.0.fc1"].consumers[0]
    assert labels[("op:blocks.0.fc1", f"op:{act}")].startswith(want)


def test_backward_phase_colours_and_titles():
    g = mlp_graph(2, backward=True)
    fwd_only = nodes(logical_dot(g, collapse=False))
    both = nodes(logical_dot(g, phases=("forward", "backward"), collapse=False, title="train step"))
    back = [o.name for o in g.ops if o.phase == "backward"]
    assert back and not any(f"op:{b}" in fwd_only for b in back)
    assert all('fillcolor="#f6dcdc"' in both[f"op:{b}"] for b in back)
    assert 'label="train step"' in logical_dot(g, title="train step")


def test_dot_quoting_and_rendering():
    assert q('a "b"\nc\\d') == r'"a \"b\"\nc\\d"'
    pic = logical_picture(mlp_graph(4))
    assert isinstance(pic, DotPicture) and str(pic) == pic.source
    if not dot_available():
        pytest.skip("graphviz 'dot' is not installed here")
    svg = pic.svg()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    assert "blocks.1 … blocks.2" in svg
    html = pic._repr_html_()  # the notebook's view: the same drawing in a pan-and-zoom box
    assert html.count("<svg") == 1 and "blocks.1 … blocks.2" in html and 'class="sbplab-zoom"' in html


def test_deduced_graph_shows_sbp_and_boxing_nodes():
    from sbplab.compiler import presets
    from sbplab.compiler.deduction.deduce import deduce

    g = mlp_graph(2)
    d = deduce(g, presets.dp_tp([2, 2]))
    dot = logical_dot(g, deduction=d, show_params=False)
    ns = nodes(dot)
    es = edges(dot)
    boxes = {n for n in ns if n.startswith("box:")}
    # every boxing some op reads through is drawn (parameters are hidden here), and nothing else
    read = {d.choices[o.name].reads[i] for o in g.ops for i, t in enumerate(o.inputs)
            if g.tensors[t].role != "param"} - {None}
    assert boxes == {f"box:{i}" for i in read}
    talking = {b.id for b in d.collective_boxings("forward")}
    assert talking  # Megatron's block output is reduced before the next block
    for n in boxes:
        b = d.boxings[int(n.removeprefix("box:"))]
        lab = label(ns[n])
        assert lab.startswith(" + ".join(b.plan.kinds)) and b.tensor in lab
        assert ('fillcolor="#f9c784"' in ns[n]) == (b.id in talking)
        (into,) = [attrs for a, c, attrs in es if c == n]
        meta = g.tensors[b.tensor].meta
        src_type = layout_picture(meta.shape, b.src_placement, b.src_sbp, meta.dtype).type_string()
        dst_type = layout_picture(meta.shape, b.dst_placement, b.dst_sbp, meta.dtype).type_string()
        assert label(into).startswith(f"{src_type} {fmt_sbp(b.src_sbp)}")
        for a, _, attrs in es:
            if a == n:
                assert label(attrs).startswith(f"{dst_type} {fmt_sbp(b.dst_sbp)}")
    # plain edges carry the tensor's SBP as stored and its local shape
    fc1 = g.tensors["blocks.0.fc1"]
    act = f"op:{fc1.consumers[0]}"
    (lab,) = [label(attrs) for a, c, attrs in es if a == "op:blocks.0.fc1" and c == act]
    loc = sl.local_shape(fc1.shape, d.placement["blocks.0.fc1"], d.sbp["blocks.0.fc1"], 0)
    assert fmt_sbp(d.sbp["blocks.0.fc1"]) in lab and f"local f32[{','.join(map(str, loc))}]" in lab
