"""Eager global tensors over the op registry and the boxing planner."""

from __future__ import annotations

from .dispatch import SignatureError, set_default_cluster  # noqa: F401
from .records import BoxingRecord, ExplainLog, OpRecord, explain_log  # noqa: F401
from .tensor import GlobalTensor, apply, explain, from_local, tensor  # noqa: F401
