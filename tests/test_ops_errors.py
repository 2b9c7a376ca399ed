"""Bad shapes and attrs raise a ValueError that names the op and the offending shapes or values."""

from __future__ import annotations

import pytest
import torch

from sbplab.ops import TensorMeta, UnknownOpError, get_op

F32, I64 = torch.float32, torch.int64

CASES = [
    # op, input (shape, dtype) list, attrs, words the message must contain
    ("matmul", [((3, 4), F32), ((5, 6), F32)], {}, ["(3, 4)", "(5, 6)", "inner"]),
    ("matmul", [((2, 3, 4), F32), ((3, 4, 5), F32)], {}, ["(2, 3, 4)", "(3, 4, 5)", "batch"]),
    ("matmul", [((4,), F32), ((4, 2), F32)], {}, ["(4,)"]),
    ("linear", [((3, 4), F32), ((5, 6), F32)], {}, ["(3, 4)", "(5, 6)", "(out, in)"]),
    ("linear", [((3, 4), F32), ((5, 4), F32), ((4,), F32)], {}, ["bias", "(4,)", "(5,)"]),
    ("add", [((3, 4), F32), ((5,), F32)], {}, ["(3, 4)", "(5,)", "broadcast"]),
    ("div", [((2, 3), F32)], {}, ["takes 2", "(2, 3)"]),
    ("gelu", [((2, 3), F32)], {"approximate": "fast"}, ["'fast'", "'tanh'"]),
    ("sum", [((2, 3), F32)], {"dims": (0, 5)}, ["dim=5", "(2, 3)", "-2..1"]),
    ("sum", [((2, 3), F32)], {"dims": (1, -1)}, ["twice", "(2, 3)"]),
    ("mean", [((2, 3), I64)], {}, ["floating", "(2, 3)"]),
    ("max", [((2, 3), F32)], {}, ["dim"]),
    ("softmax", [((2, 3), F32)], {"dim": 2}, ["dim=2", "(2, 3)"]),
    ("layer_norm", [((2, 3), F32), ((4,), F32), ((4,), F32)], {"normalized_shape": (4,)},
     ["(4,)", "(2, 3)", "trailing"]),
    ("layer_norm", [((2, 3), F32), ((3,), F32), ((2,), F32)], {"normalized_shape": (3,)}, ["bias (2,)"]),
    ("embedding", [((2, 3), F32), ((10, 4), F32)], {}, ["ids", "integer", "(2, 3)"]),
    ("embedding", [((2, 3), I64), ((10, 4, 2), F32)], {}, ["(vocab, dim)", "(10, 4, 2)"]),
    ("gather", [((2, 3), F32), ((4, 3), I64)], {"dim": 1}, ["(4, 3)", "(2, 3)", "dim 0"]),
    ("gather", [((2, 3), F32), ((2,), I64)], {"dim": 0}, ["same number of dims"]),
    ("transpose", [((2, 3), F32)], {"dim0": 0}, ["dim0 and dim1"]),
    ("permute", [((2, 3, 4), F32)], {"dims": (0, 0, 1)}, ["permutation", "(2, 3, 4)"]),
    ("reshape", [((2, 3), F32)], {"shape": (4, 2)}, ["(2, 3)", "(4, 2)", "element"]),
    ("reshape", [((2, 3), F32)], {"shape": (-1, -1)}, ["one -1"]),
    ("view", [((2, 3), F32)], {"shape": (4, -1)}, ["(2, 3)", "(4, -1)"]),
    ("concat", [((2, 3), F32), ((3, 3), F32)], {"dim": 1}, ["(2, 3)", "(3, 3)", "outside dim 1"]),
    ("slice", [((2, 3), F32)], {"dim": 1, "start": 0, "stop": 2, "step": 0}, ["step", ">= 1"]),
    ("cross_entropy", [((4, 3), F32), ((3,), I64)], {}, ["(4, 3)", "(3,)", "(N,)"]),
    ("cross_entropy", [((4, 3), F32), ((4,), F32)], {}, ["target", "integer"]),
    ("conv2d", [((1, 3, 5, 5), F32), ((4, 2, 3, 3), F32)], {}, ["(1, 3, 5, 5)", "(4, 2, 3, 3)", "groups"]),
    ("conv2d", [((1, 3, 2, 2), F32), ((4, 3, 3, 3), F32)], {}, ["(3, 3)", "larger"]),
    ("conv2d", [((1, 3, 5, 5), F32), ((4, 3, 3, 3), F32)], {"stride": (1, 2, 3)}, ["stride", "pair"]),
]


@pytest.mark.parametrize("name, inputs, attrs, words", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_bad_input_names_op_and_shapes(name, inputs, attrs, words):
    metas = [TensorMeta(s, d) for s, d in inputs]
    with pytest.raises(ValueError) as e:
        get_op(name).infer(metas, attrs)
    msg = str(e.value)
    assert msg.startswith(f"{name}:"), msg
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"


def test_unknown_op_lists_the_registered_ones():
    with pytest.raises(UnknownOpError, match="matmul"):
        get_op("matmull")
