"""Ground truth: train the same model on one device with torch.optim, and compare with a compiled run.

``compare(model, inputs, target, optimizer, strategy, steps)`` compiles the model under the
strategy, runs ``steps`` training steps in the LocalExecutor (every rank in this process), runs
the same steps on a copy of the model with plain PyTorch (under torch.autocast with the strategy's
mixed precision, accumulating its micro-batches; recomputation changes no value, so torch runs
without it), and reports the largest differences in loss and in every parameter. This is the check every preset must pass before any process starts.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .api import Compiled, compile
from .deduction.precision import DTYPES, Precision
from .deduction.strategy import Strategy
from .training.precision_pass import autocast, autocast_dtype


@dataclass
class Comparison:
    losses: list[float]  # compiled run
    ref_losses: list[float]  # plain PyTorch
    param_err: dict[str, float]  # max |compiled - torch| per parameter after the last step
    compiled: Compiled

    @property
    def loss_err(self) -> float:
        return max(abs(a - b) for a, b in zip(self.losses, self.ref_losses))

    @property
    def max_param_err(self) -> float:
        return max(self.param_err.values())

    def __repr__(self) -> str:
        worst = max(self.param_err, key=self.param_err.get)
        return (f"Comparison({self.compiled.strategy.name}: loss err {self.loss_err:.2e}, "
                f"param err {self.max_param_err:.2e} ({worst}))")


def torch_steps(model: torch.nn.Module, inputs: tuple, *, target: torch.Tensor | None, loss_fn: Callable | None,
                optimizer: Any, steps: int, precision: Precision | None = None,
                micro_batches: int = 1) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Train a deep copy of ``model`` for ``steps`` steps; returns the losses and final parameters.

    precision: mixed precision as torch runs it: the forward under ``torch.autocast`` (CPU) on
        master weights of ``precision.master``, each gradient rounded to ``precision.grad`` and each
        optimizer state to ``precision.optim_state`` after the step (what storing them in that dtype does).
    micro_batches: gradient accumulation: the batch cut in M along dim 0, each micro-batch's loss
        divided by M before ``backward``; the step's loss is the mean of theirs.
    """
    precision = precision or Precision()
    mixed = precision != Precision()
    m = copy.deepcopy(model)
    if mixed:
        m = m.to(DTYPES[precision.master])
    opt = optimizer.torch(m.parameters())
    batches = [(tuple(inputs), target)] if micro_batches == 1 else \
        list(zip(zip(*(x.chunk(micro_batches) for x in inputs)), target.chunk(micro_batches)))
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        total = 0.0
        for xs, y in batches:
            with autocast(autocast_dtype(precision)):
                loss = loss_fn(m(*xs), y)
            (loss / micro_batches if micro_batches > 1 else loss).backward()
            total += loss.item() / micro_batches
        if mixed:
            _round(m, opt, precision)
        else:
            opt.step()
        losses.append(total if micro_batches > 1 else loss.item())
    return losses, {n: p.detach() for n, p in m.named_parameters()}


def _round(m: torch.nn.Module, opt: torch.optim.Optimizer, precision: Precision) -> None:
    """The optimizer step with gradients and optimizer states as ``precision`` keeps them."""
    for p in m.parameters():
        if p.grad is not None:
            p.grad = p.grad.to(DTYPES[precision.grad]).to(p.dtype)
    opt.step()
    for state in opt.state.values():
        for key, v in state.items():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                state[key] = v.to(DTYPES[precision.optim_state]).to(v.dtype)


def compare(model: torch.nn.Module, inputs: tuple, *, target: torch.Tensor | None, loss_fn: Callable | None,
            optimizer: Any, strategy: Strategy, steps: int = 3) -> Comparison:
    """Compiled (``strategy``, LocalExecutor) against single-device torch over ``steps`` steps."""
    c = compile(model, inputs, loss_fn=loss_fn, target=target, optimizer=optimizer, strategy=strategy)
    ex = c.executor()
    feeds = dict(zip(c.graph.inputs, list(inputs) + [target]))
    losses = [ex.step(feeds) for _ in range(steps)]
    ref_losses, ref_params = torch_steps(model, inputs, target=target, loss_fn=loss_fn, optimizer=optimizer, steps=steps,
                                         precision=strategy.precision, micro_batches=strategy.micro_batches)
    err = {n: (ex.value(n) - p).abs().max().item() for n, p in ref_params.items()}
    return Comparison(losses, ref_losses, err, c)
