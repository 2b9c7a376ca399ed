"""Op registry and the op library. Importing this package registers every op."""

from __future__ import annotations

# importing the op files registers their ops
from . import (  # noqa: F401  (the constants, accumulation and optimizer ops too)
    control,
    conv,
    elementwise,
    indexing,
    linalg,
    loss,
    nn,
    optim_ops,
    reduce,
    scalars,
    shape,
)
from .check import check_signature_numerics, random_shards, run_signature  # noqa: F401
from .registry import (  # noqa: F401
    REGISTRY,
    LocalContext,
    NdSignature,
    OpDef,
    Signature,
    TensorMeta,
    UnknownOpError,
    get_op,
    nd_signatures,
    one_d_signatures,
    register,
    run_local,
)
