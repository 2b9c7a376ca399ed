"""Signature hints: a strategy forces an op's n-D signature; deduction obeys it, boxes the inputs to
fit, explains it, and the step still trains exactly like single-device PyTorch. Also the caches
deduction shares across runs (same answers, bounded)."""

from __future__ import annotations

import pytest

from sbplab.boxing import plan_boxing
from sbplab.compiler import SGD, Strategy, compile, presets
from sbplab.compiler.deduction.caches import PLANS, SCORES, Memo
from sbplab.compiler.deduction.presets import as_mesh
from sbplab.compiler.deduction.ranking import options
from sbplab.compiler.deduction.signature_hints import SignatureError, escape, parse_signature
from sbplab.compiler.deduction.strategy import HintError
from sbplab.compiler.reference import compare
from sbplab.hardware import Hardware
from sbplab.models import GPT, MLP, GPTConfig, MLPConfig
from sbplab.ops.registry import NdSignature, TensorMeta, nd_signatures
from sbplab.sbp import B, P, S

OPT = SGD(lr=0.1)


@pytest.fixture(scope="module")
def mlp():
    m = MLP(MLPConfig())
    (x,), y = m.example_batch(8)
    return m, (x,), y


@pytest.fixture(scope="module")
def gpt():
    m = GPT(GPTConfig(n_layer=1))
    xs, y = m.example_batch(8)
    return m, xs, y


def _compile(model, st):
    m, xs, y = model
    return compile(m, xs, loss_fn=m.loss_fn, target=y, optimizer=OPT, strategy=st)


# --- the text form ----------------------------------------------------------------------------------
def test_parse_one_d_two_d_and_every_repr_back():
    assert parse_signature("S(0), B -> S(0)") == (((S(0),), (B,)), ((S(0),),))
    assert parse_signature("(S(0)), (B) -> (S(0))") == parse_signature("S(0),B->S(0)")
    assert parse_signature(" (S(0), B), (B, S(-1)) -> (S(0), P(max)) ") == (
        ((S(0), B), (B, S(-1))), ((S(0), P("max")),))
    assert parse_signature("(S(1),), (P) -> (P,)") == (((S(1),), (P,)), ((P,),))
    for mesh, metas in [(as_mesh(2), [TensorMeta((4, 6)), TensorMeta((6, 8))]),
                        (as_mesh((2, 2)), [TensorMeta((4, 6)), TensorMeta((6, 8))])]:
        sigs = nd_signatures("matmul", metas, {}, mesh)
        assert len(sigs) > 4
        for sig in sigs:  # what the editor and the errors print reads back as the same signature
            ins, outs = parse_signature(repr(sig))
            assert NdSignature(ins, outs) == sig


@pytest.mark.parametrize("text,msg", [
    ("S(0), B", "exactly one '->'"),
    ("S(0) -> B -> B", "exactly one '->'"),
    ("(S(0), B -> S(0)", "'(' is never closed"),
    ("S(0)), B -> S(0)", "')' closes nothing"),
    ("S(0),, B -> S(0)", "empty entry between commas"),
    ("S(0), Q -> S(0)", "cannot parse SBP"),
    ("S(0) ->", "no outputs"),
])
def test_bad_text_is_refused_where_it_is_written(text, msg):
    st = presets.data_parallel(2)
    with pytest.raises(ValueError, match="cannot parse signature") as e:
        st.signature("blocks.0.fc1", text)
    assert msg in str(e.value) and "'S(0), B -> S(0)'" in str(e.value)
    assert st.signatures == []
    with pytest.raises(TypeError, match="a string like"):
        st.signature("x", 3)
    with pytest.raises(ValueError, match="op name or glob"):
        st.signature(" ", "B -> B")


# --- obeyed by deduction ------------------------------------------------------------------------------
def test_forced_signature_is_taken_boxed_explained_and_trains_like_torch(mlp):
    op = "blocks.0.fc1"
    base = _compile(mlp, presets.data_parallel(2)).deduction
    opts = options(base, op)
    assert (opts[0].signature, opts[0].cost) == (base.choices[op].signature, base.choices[op].cost)
    pick = next(o for o in opts if o.cost > 0 and o.changes >= 2)  # a real change: inputs must move
    st = presets.data_parallel(2).signature(op, pick.text, why="test")
    c = _compile(mlp, st)
    d = c.deduction
    ch = d.choices[op]
    assert ch.signature == pick.signature and ch.cost == pick.cost
    assert ch.reason.startswith(f"forced by signature hint '{op}' [test]; deduction would take "
                                f"{opts[0].signature} ({opts[0].cost} B)")
    assert f"chosen {pick.signature} ({pick.cost} B of boxing): forced by signature hint" in c.explain(op)
    assert (opts[0].signature, opts[0].cost) in ch.rejected
    # every input the signature reads differently is boxed into exactly that layout, by a real plan
    node = c.graph.op_by_name[op]
    boxed_bytes = 0
    for i, t in enumerate(node.inputs):
        want = pick.signature.inputs[i]
        if base.sbp[t] == want:
            assert ch.reads[i] is None
            continue
        b = d.boxings[ch.reads[i]]
        assert (b.tensor, b.src_sbp, b.dst_sbp, b.kind) == (t, base.sbp[t], want, "input") and op in b.consumers
        ref = plan_boxing(c.graph.tensors[t].shape, base.sbp[t], want, node.placement, dtype=c.graph.tensors[t].meta.dtype)
        assert b.plan.kinds == ref.kinds and b.bytes == ref.total_bytes
        boxed_bytes += b.bytes
    assert boxed_bytes == pick.cost > 0
    assert c.summary() != _compile(mlp, presets.data_parallel(2)).summary()
    m, xs, y = mlp
    r = compare(m, xs, target=y, loss_fn=m.loss_fn, optimizer=OPT, strategy=st, steps=2)
    assert r.loss_err < 2e-5 and r.max_param_err < 2e-5, r


def test_two_d_text_and_a_glob_force_every_matching_op(gpt):
    base = _compile(gpt, presets.dp_tp((2, 2))).deduction
    act = [o.name for o in base.graph.ops if o.phase == "forward" and o.type == "gelu"]
    assert act == ["blocks_0_mlp_act"] and repr(base.choices[act[0]].signature) == "(S(0), S(2)) -> (S(0), S(2))"
    st = presets.dp_tp((2, 2)).signature("*_mlp_act", "(S(0), S(1)) -> (S(0), S(1))", why="2-D")
    st.signature("blocks.*.attn.proj", base.choices["blocks.0.attn.proj"].signature)  # an NdSignature itself
    c = _compile(gpt, st)
    sig = c.deduction.choices[act[0]].signature
    assert sig == NdSignature(((S(0), S(1)),), ((S(0), S(1)),))
    assert c.deduction.choices[act[0]].reason.startswith("forced by signature hint '*_mlp_act' [2-D]")
    assert c.deduction.choices["blocks.0.attn.proj"].reason == ("forced by signature hint 'blocks.*.attn.proj'; "
                                                                "outputs must end as blocks.0.attn.proj (S(0), B) "
                                                                "(store hint '*.proj' (activations) [Megatron g: "
                                                                "the output is all-reduced])")
    assert set(c.deduction.forced) == {act[0], "blocks.0.attn.proj"}
    # the activation leaves S(1) on the tp axis, so its consumer sees the new layout
    fc2 = c.graph.op_by_name["blocks.0.mlp.fc2"]
    assert c.deduction.produced[fc2.inputs[0]] == (S(0), S(1))
    m, xs, y = gpt
    r = compare(m, xs, target=y, loss_fn=m.loss_fn, optimizer=OPT, strategy=st, steps=2)
    assert r.loss_err < 2e-5 and r.max_param_err < 2e-5, r


def test_forcing_deductions_own_picks_changes_nothing(gpt):
    base = _compile(gpt, presets.dp_tp((2, 2)))
    st = presets.dp_tp((2, 2))
    for op in base.graph.ops:
        st.signature(escape(op.name), repr(base.deduction.choices[op.name].signature))
    c = _compile(gpt, st)
    assert len(c.deduction.forced) == len(base.graph.ops)
    key = [(b.tensor, b.kind, b.src_sbp, b.dst_sbp, b.bytes) for b in base.deduction.boxings]
    assert [(b.tensor, b.kind, b.src_sbp, b.dst_sbp, b.bytes) for b in c.deduction.boxings] == key
    for o in base.graph.ops:  # deduction's own pick: no "deduction would take" remark
        assert c.deduction.choices[o.name].reason.split(";")[0] == f"forced by signature hint {escape(o.name)!r}"


# --- errors -----------------------------------------------------------------------------------------------------
def test_a_signature_the_op_lacks_names_the_op_the_request_and_the_valid_ones(mlp):
    for text, why in [("(S(9)), (B), (B) -> (S(0))", "S(9) is out of range for a 2-D tensor"),
                      ("S(0) -> S(0)", "it names 1 input(s) and 1 output(s), the op has 3 and 1"),
                      ("(S(0), B), (B, B), (B, B) -> (S(0), B)", "has 2 entries but the placement's mesh has 1"),
                      ("(S(1)), (B), (B) -> (S(0))", "is not a valid layout for these shapes")]:
        st = presets.data_parallel(2).signature("blocks.0.fc1", text)
        with pytest.raises(SignatureError) as e:
            _compile(mlp, st)
        msg = str(e.value)
        assert e.value.op == "blocks.0.fc1" and isinstance(e.value, HintError)
        assert msg.startswith(f"op 'blocks.0.fc1' (linear) has no signature {text!r} on a mesh of shape (2,)"), msg
        assert why in msg and "valid: (B), (B), (B) -> (B); (S(0)), (B), (B) -> (S(0))" in msg


def test_pins_matches_and_contradictions(mlp):
    st = presets.tensor_parallel(2).signature("blocks.0.fc1", "(B), (B), (B) -> (B)")
    with pytest.raises(SignatureError, match="contradicts a hint: store hint '\\*fc1.weight' \\(params\\) "
                                              "\\[Megatron column parallel\\] pins 'blocks.0.fc1.weight' to \\(S\\(0\\)\\)"):
        _compile(mlp, st)
    st = presets.data_parallel(2).signature("blocks.9.*", "B -> B")
    with pytest.raises(SignatureError, match="signature hint 'blocks.9.\\*' \\('B -> B'\\) matches no op; "
                                              "forward ops are: proj_in, blocks.0.fc1"):
        _compile(mlp, st)
    st = presets.data_parallel(2).signature("blocks.*.fc1", "(S(0)), (B), (B) -> (S(0))")
    st.signature("blocks.0.fc1", "(B), (B), (B) -> (B)", why="mine")
    with pytest.raises(SignatureError, match="op 'blocks.0.fc1' is given two signatures: \\(S\\(0\\)\\), .* by "
                                              "signature hint 'blocks.\\*.fc1' and .* by signature hint 'blocks.0.fc1' \\[mine\\]"):
        _compile(mlp, st)
    st = presets.data_parallel(2).signature("blocks.*.fc1", "(S(0)), (B), (B) -> (S(0))")
    st.signature("blocks.0.fc1", "S(0), B, B -> S(0)")  # the same signature twice is no contradiction
    assert _compile(mlp, st).deduction.forced.keys() == {"blocks.0.fc1", "blocks.1.fc1"}
    assert escape("a*b?[c]") == "a[*]b[?][[]c]"


# --- caches shared by deductions ------------------------------------------------------------------------------------
def test_caches_are_shared_keyed_by_cluster_and_bounded(mlp):
    st = presets.data_parallel(2)
    first = _compile(mlp, st)
    misses = (PLANS.misses, SCORES.misses)
    again = _compile(mlp, st)
    assert (PLANS.misses, SCORES.misses) == misses  # nothing planned or scored twice
    assert [b.plan for b in again.deduction.boxings] == [b.plan for b in first.deduction.boxings]
    slow = Hardware("slow", (1e6,), (1e-3,), 1e6, 1e-3, 1e9, 1e9)
    m, xs, y = mlp
    c = compile(m, xs, loss_fn=m.loss_fn, target=y, optimizer=OPT, strategy=st, hardware=slow)
    assert c.deduction.boxings and all(b.plan.hardware == slow for b in c.deduction.boxings)
    assert all(b.plan.hardware != slow for b in first.deduction.boxings)
    memo = Memo("t", 2)
    memo.put("a", 1), memo.put("b", 2)
    assert memo.get("a") == 1  # "b" is now the least recently used
    memo.put("c", 3)
    assert (memo.get("b"), memo.get("a"), memo.get("c"), len(memo)) == (None, 1, 3, 2)
    with pytest.raises(ValueError, match="cannot store None"):
        memo.put("d", None)


def test_single_device_strategy_accepts_a_forced_signature(mlp):
    st = Strategy(as_mesh(1), name="single").signature("head", "(B), (B), (B) -> (B)")
    c = _compile(mlp, st)
    assert c.deduction.choices["head"].reason == "forced by signature hint 'head'"


def test_exact_names_are_looked_up_and_globs_scanned_alike(gpt):
    """A search result names thousands of ops exactly (``escape``): the report looks each up instead of
    matching it against every op, and finds what ``fnmatch`` finds, globs and bracketed names included."""
    import fnmatch

    from sbplab.compiler import from_torch
    from sbplab.compiler.deduction.strategy import _literal

    m, xs, y = gpt
    g = from_torch(m, xs, m.loss_fn, y)
    names = [op.name for op in g.ops]
    patterns = [escape(n) for n in names[:40]] + [escape("x[0]*?"), "blocks.*", "*.mm_?", "[bh]*", "nothing"]
    st = Strategy(as_mesh(2))
    for p in patterns:
        st.signature(p, "B -> B")
    report = st.match_report(g)
    assert [hits for _, hits in report.signatures] == [[n for n in names if fnmatch.fnmatchcase(n, p)] for p in patterns]
    assert _literal(escape("x[0]*?")) == "x[0]*?" and _literal("blocks.*") is None and _literal("[bh]x") is None
