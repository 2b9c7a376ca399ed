"""The numeric check of a parallel run: the same steps in plain single-device PyTorch, side by side.

Losses are compared step by step and every final parameter element by element; the check passes
when the largest absolute difference of both is within ``tol`` (float32 sums in another order
differ in the last bits, not more).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..compiler.reference import torch_steps
from .zoo import BuiltModel


@dataclass
class NumericCheck:
    losses: list[float]  # the parallel run
    ref_losses: list[float]  # torch.optim on one device
    param_diff: dict[str, float]  # max |run - torch| per parameter after the last step

    def __post_init__(self) -> None:
        if len(self.losses) != len(self.ref_losses):
            raise ValueError(f"the run has {len(self.losses)} losses but the reference {len(self.ref_losses)}; "
                             f"both must cover the same steps")

    @property
    def loss_diff(self) -> float:
        return max((abs(a - b) for a, b in zip(self.losses, self.ref_losses)), default=0.0)

    @property
    def max_param_diff(self) -> float:
        return max(self.param_diff.values(), default=0.0)

    @property
    def worst_param(self) -> str:
        return max(self.param_diff, key=self.param_diff.get) if self.param_diff else ""

    def passed(self, tol: float) -> bool:
        return self.loss_diff <= tol and self.max_param_diff <= tol

    def rows(self) -> list[dict[str, Any]]:
        return [{"step": i, "run": a, "torch": b, "diff": abs(a - b)}
                for i, (a, b) in enumerate(zip(self.losses, self.ref_losses))]


def check_against_torch(model: BuiltModel, optimizer: Any, losses: list[float],
                        params: Mapping[str, torch.Tensor]) -> NumericCheck:
    """Train a copy of ``model.module`` for ``len(losses)`` steps with ``optimizer.torch`` and compare."""
    ref_losses, ref_params = torch_steps(model.module, model.inputs, target=model.target, loss_fn=model.loss_fn, optimizer=optimizer,
                                         steps=len(losses))
    missing = sorted(set(ref_params) - set(params))
    if missing:
        raise ValueError(f"the run did not give back parameters {', '.join(missing[:5])}; "
                         f"it has {', '.join(sorted(params)[:5])} ...")
    diff = {n: (params[n].detach().float() - p.float()).abs().max().item() for n, p in ref_params.items()}
    return NumericCheck(list(losses), ref_losses, diff)
