"""Op registry and the op library. Importing this package registers every op."""

from __future__ import annotations

from .registry import (  # noqa: F401
    REGISTRY,
    LocalContext,
    NdSignature,
    OpDef,
    Signature,
    TensorMeta,
    get_op,
    nd_signatures,
    one_d_signatures,
    register,
    run_local,
)
