"""The dtype names the command line and the configs accept, and their torch dtypes."""

from __future__ import annotations

from typing import Optional

import torch

from .errors import BadInputError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def check_dtype_name(name: str, value: Optional[str]) -> None:
    """Raises a clear error naming the argument unless ``value`` is None or a key of DTYPES."""
    if value is not None and value not in DTYPES:
        raise BadInputError(f"{name} must be one of {', '.join(DTYPES)}, got {value!r}")


def dtype_name(dtype: Optional[torch.dtype]) -> str:
    """The name of ``dtype`` in DTYPES; None (a model's own dtype) is float32."""
    if dtype is None:
        return "float32"
    for name, value in DTYPES.items():
        if value == dtype:
            return name
    raise BadInputError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype}")
