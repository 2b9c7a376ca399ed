"""Plain kernels for hand-built actor plans, referred to as ``"sbplab.runtime.kernels:NAME"``.

Compiled plans use registry ops; these few exist so a plan can be written by hand to learn the
runtime (a linear layer's forward, backward and SGD step, a loss) and to exercise it (an empty
kernel for overhead, a delay for unequal stage costs, a failing kernel for fault handling, a gate
that holds a run until the driver has done something).
Every kernel is ``f(inputs: list[Tensor], attrs: dict) -> tuple[Tensor, ...]``.
"""

from __future__ import annotations

import os
import time

import torch

from ..boxing.kinds import local_kinds, p2p_kinds

_EMPTY = torch.empty(0)


def noop(inputs: list[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
    """Does nothing: passes its first input through (or an empty tensor)."""
    return (inputs[0] if inputs else _EMPTY,) * attrs.get("outputs", 1)


def spin(inputs: list[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
    """Keeps its core busy for ``us`` microseconds (as a kernel would), then passes its first input on."""
    end = time.perf_counter() + attrs.get("us", 100.0) / 1e6
    while time.perf_counter() < end:
        pass
    return (inputs[0] if inputs else _EMPTY,)


def delay(inputs: list[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
    """Sleeps ``ms`` milliseconds, then passes its inputs through: a stage of known cost."""
    time.sleep(attrs.get("ms", 1.0) / 1000.0)
    return tuple(inputs) if inputs else (_EMPTY,)


def fail(inputs: list[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
    """Raises (or, with ``kill=True``, kills its own process): for fault handling."""
    if attrs.get("kill"):
        os.kill(os.getpid(), 9)
    raise RuntimeError(attrs.get("message", "kernel failed on purpose"))


def gate(inputs: list[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
    """Waits until the file ``{path}.{n}`` exists, ``n`` being the first input's first element, then
    passes its inputs through. With a step counter as input, step n of a run waits for the driver
    to have seen step n - 1 (whoever creates the file); n below ``first`` (default 1) passes at once.
    """
    n = int(inputs[0].reshape(-1)[0])
    if n >= attrs.get("first", 1):
        target, limit = f"{attrs['path']}.{n}", attrs.get("timeout", 30.0)
        deadline = time.monotonic() + limit
        while not os.path.exists(target):
            if time.monotonic() > deadline:
                raise RuntimeError(f"gate: {target} did not appear within {limit} s")
            time.sleep(0.002)
    return tuple(inputs)


def matmul(inputs: list[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
    """x @ w: (m, k) x (k, n) -> (m, n)."""
    x, w = inputs
    return (x @ w,)


def matmul_tn(inputs: list[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
    """a^T @ b: a weight's gradient from the layer input and the output gradient."""
    a, b = inputs
    return (a.transpose(-1, -2) @ b,)


def matmul_nt(inputs: list[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
    """a @ b^T: an input's gradient from the output gradient and the weight."""
    a, b = inputs
    return (a @ b.transpose(-1, -2),)


def relu(inputs: list[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
    return (torch.relu(inputs[0]),)


def relu_backward(inputs: list[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
    """(relu input, output gradient) -> input gradient."""
    x, dy = inputs
    return (dy * (x > 0).to(dy.dtype),)


def mse_loss(inputs: list[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
    """(prediction, target) -> (sum((y - t)^2) / norm, its gradient wrt y).

    ``norm`` is the element count of the GLOBAL batch (or micro-batch), so shards of a
    batch-split prediction hold addends of the mean: the loss comes out partial-sum (P).
    """
    y, t = inputs
    d = y - t
    norm = float(attrs.get("norm", d.numel()))
    return ((d * d).sum() / norm, d * (2.0 / norm))


def sgd(inputs: list[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
    """(param, grad) -> param - lr * grad."""
    w, g = inputs
    return (w - attrs["lr"] * g,)


def sgd_momentum(inputs: list[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
    """(param, grad, buf) -> (new param, new buf), torch.optim.SGD's rule with dampening 0."""
    w, g, buf = inputs
    nb = buf * attrs["momentum"] + g
    return (w - attrs["lr"] * nb, nb)


def add(inputs: list[torch.Tensor], attrs: dict) -> tuple[torch.Tensor, ...]:
    """The sum of all inputs (a join of branches)."""
    out = inputs[0]
    for x in inputs[1:]:
        out = out + x
    return (out,)


# --- local boxing steps and moves: the kinds' own kernels (``sbplab.boxing.kinds``), named here too ----
narrow_piece = local_kinds.narrow_piece
to_partial = local_kinds.to_partial
take_block = p2p_kinds.take_block
put_blocks = p2p_kinds.put_blocks
