"""Hand-built actor plans: the shapes a compiler produces, written out so they can be read.

- ``data_parallel_linear``: y = x @ w with x split over the batch (``S(0)``), w broadcast (``B``),
  an MSE loss, gradients accumulated over micro-batches, one all-reduce, one SGD step.
- ``pipeline_mlp``: one linear layer (and a relu between stages) per stage, one stage per rank;
  activations go forward and gradients backward by send/recv; every stage accumulates its
  weight gradient over the micro-batches and updates once per step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..layout import shard
from ..placement import Placement
from ..sbp import B, P, S
from .actor_plan import ActorPlan
from .specs import Accumulate, Actor, Collective, Compute, Recv, Ref, Send, Sink, Source, State

K = "sbplab.runtime.kernels:"


def data_parallel_linear(n: int, w0: torch.Tensor, *, lr: float, batch: int, micro_batches: int = 1,
                         registers: int = 2, device_type: str = "cpu") -> ActorPlan:
    """DP over ``n`` ranks. ``batch`` must split evenly into micro-batches (the loss norm assumes it)."""
    if batch % micro_batches:
        raise ValueError(f"batch {batch} must be a multiple of micro_batches {micro_batches}")
    pl = Placement(device_type, list(range(n)))
    w_local = shard(w0, pl, (B,))
    norm = batch // micro_batches * w0.shape[1]  # elements of one global micro-batch's output
    ranks: dict[int, list[Actor]] = {}
    for r in range(n):
        ranks[r] = [
            Source("x", feed="x", placement=pl, sbp=(S(0),), registers=registers),  # (b/n, k) S(0)
            Source("t", feed="t", placement=pl, sbp=(S(0),), registers=registers),  # (b/n, m) S(0)
            State("w", init=w_local[r], update=Ref("sgd"), key="w", placement=pl, sbp=(B,)),  # (k, m) B
            Compute("fwd", op=K + "matmul", inputs=("x", "w"), registers=registers),  # (b/n, m) S(0)
            Compute("loss", op=K + "mse_loss", inputs=("fwd", "t"), outputs=2, attrs={"norm": norm},
                    registers=registers),  # () P, (b/n, m) S(0)
            Sink("loss_out", inputs=("loss",), key="loss", placement=pl, sbp=(P,)),
            Compute("dw", op=K + "matmul_tn", inputs=("x", Ref("loss", 1)), phase="backward",
                    registers=registers),  # (k, m) P
            Accumulate("acc", inputs=("dw",), reduce="mean", phase="backward", registers=1),
            Collective("ar", kind_="all_reduce", group=tuple(range(n)), inputs=("acc",), scope="step",
                       phase="backward", registers=1, order=0),  # P -> B
            Compute("sgd", op=K + "sgd", inputs=("w", "ar"), scope="step", phase="update", attrs={"lr": lr},
                    registers=1),
        ]
    return ActorPlan.build(n, ranks, micro_batches=micro_batches, device_type=device_type,
                           name=f"dp-linear-{n}")


def pipeline_mlp(weights: Sequence[torch.Tensor], *, lr: float, batch: int, micro_batches: int,
                 registers: int = 2, stage_ms: Sequence[float] | None = None,
                 device_type: str = "cpu") -> ActorPlan:
    """Stage s (rank s) holds ``weights[s]``; ``stage_ms[s]`` adds a delay to its forward (unequal costs)."""
    if batch % micro_batches:
        raise ValueError(f"batch {batch} must be a multiple of micro_batches {micro_batches}")
    n = len(weights)
    mb = batch // micro_batches
    norm = mb * weights[-1].shape[1]
    ranks: dict[int, list[Actor]] = {}
    for s, w in enumerate(weights):
        pl = Placement(device_type, [s])
        R = registers
        acts: list[Actor] = []
        if s == 0:
            acts.append(Source("in", feed="x", placement=pl, sbp=(B,), registers=R))  # (mb, d0)
        else:
            acts.append(Recv("in", peer=s - 1, tag=0, shape=(mb, w.shape[0]), registers=R))
        acts.append(State("w", init=w.clone(), update=Ref("sgd"), key=f"w{s}", placement=pl, sbp=(B,)))
        acts.append(Compute("h", op=K + "matmul", inputs=("in", "w"), registers=R))  # (mb, d_{s+1})
        h = "h"
        if stage_ms and stage_ms[s]:
            acts.append(Compute("cost", op=K + "delay", inputs=("h",), attrs={"ms": stage_ms[s]},
                                registers=R))
            h = "cost"
        if s < n - 1:
            acts += [Compute("a", op=K + "relu", inputs=(h,), registers=R),
                     Send("a_out", inputs=("a",), peer=s + 1, tag=0, registers=R),
                     Recv("g_in", peer=s + 1, tag=1, shape=(mb, w.shape[1]), phase="backward", registers=R),
                     Compute("dh", op=K + "relu_backward", inputs=(h, "g_in"), phase="backward", registers=R)]
            dh = Ref("dh")
        else:
            acts += [Source("t", feed="t", placement=pl, sbp=(B,), registers=R),
                     Compute("loss", op=K + "mse_loss", inputs=(h, "t"), outputs=2, attrs={"norm": norm},
                             registers=R),
                     Sink("loss_out", inputs=("loss",), key="loss", placement=pl, sbp=(B,))]
            dh = Ref("loss", 1)
        acts += [Compute("dw", op=K + "matmul_tn", inputs=("in", dh), phase="backward", registers=R),
                 Accumulate("acc", inputs=("dw",), reduce="mean", phase="backward", registers=1),
                 Compute("sgd", op=K + "sgd", inputs=("w", "acc"), scope="step", phase="update",
                         attrs={"lr": lr}, registers=1)]
        if s > 0:
            acts += [Compute("dx", op=K + "matmul_nt", inputs=(dh, "w"), phase="backward", registers=R),
                     Send("g_out", inputs=("dx",), peer=s - 1, tag=1, phase="backward", registers=R)]
        ranks[s] = acts
    return ActorPlan.build(n, ranks, micro_batches=micro_batches, device_type=device_type,
                           name=f"pipeline-{n}-stages")


def reference_mlp_steps(weights: Sequence[torch.Tensor], batches: Sequence[dict], lr: float,
                        steps: int) -> tuple[list[float], list[torch.Tensor]]:
    """Single-device PyTorch: the same MLP (relu between layers), MSE loss, torch.optim.SGD."""
    ws = [w.clone().requires_grad_() for w in weights]
    opt = torch.optim.SGD(ws, lr=lr)
    losses = []
    for s in range(steps):
        h = batches[s]["x"]
        for i, w in enumerate(ws):
            h = h @ w
            if i < len(ws) - 1:
                h = torch.relu(h)
        loss = ((h - batches[s]["t"]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [w.detach() for w in ws]
