"""A small model zoo of plain torch.nn modules, each with a dataclass config and an example batch.

They are ordinary PyTorch: train them with torch.optim to get the reference, compile them with
``sl.from_torch`` to get the parallel version. Names of submodules follow a convention the
presets rely on (``fc1``/``fc2`` in MLP blocks, ``q``/``k``/``v``/``proj`` in attention).
"""

from __future__ import annotations

from .cnn import CNN, CNNConfig
from .gpt import GPT, GPTConfig
from .mlp import MLP, MLPConfig
from .wide_deep import WideDeep, WideDeepConfig

__all__ = ["CNN", "CNNConfig", "GPT", "GPTConfig", "MLP", "MLPConfig", "WideDeep", "WideDeepConfig"]
