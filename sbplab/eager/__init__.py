"""Eager global tensors over the op registry and the boxing planner."""

from __future__ import annotations

from ..ops.signature_text import SignatureError  # noqa: F401  (one class for eager and compiled)
from .dispatch import set_default_hardware  # noqa: F401
from .from_local import from_local  # noqa: F401
from .records import BoxingRecord, ExplainLog, OpRecord, explain_log  # noqa: F401
from .tensor import GlobalTensor, apply, explain, tensor  # noqa: F401
