"""Half-precision GEMMs of many rows computed in float32 on CPUs without native half-precision
GEMMs.

On a CPU without AVX512-BF16 / AMX (AVX512-FP16 for float16), ATen multiplies bfloat16 matrices
through a slow fallback, several times slower than converting the operands to float32,
multiplying and rounding back (docs/perf_notes.md has the measurements). Inside ``float32_gemms``, ``F.linear`` with
half-precision operands and at least ``MIN_ROWS`` rows converts them to float32, multiplies and
rounds the product back once: what ATen's half-precision GEMM computes (float32 accumulation, one
rounding), in another summation order. The generator uses it where many rows meet the weights in
eager mode: the target's prefill and the draft's pass over the prompt.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..draft.few_rows import linear_arguments

# Fewer rows stay in half precision: converting the weight on every call costs as much as the
# product there (on the machine above the float32 route lost at 4 rows and won from 8).
MIN_ROWS = 16
HALF = (torch.bfloat16, torch.float16)


@functools.cache  # the CPU does not change; asked on every eager extend, a round's hot path
def native_half_gemm(dtype: torch.dtype) -> bool:
    """Whether oneDNN multiplies ``dtype`` natively on this CPU (float32 always counts as native)."""
    checks = {torch.bfloat16: "_is_mkldnn_bf16_supported", torch.float16: "_is_mkldnn_fp16_supported"}
    if dtype not in checks:
        return True
    try:
        return bool(getattr(torch.ops.mkldnn, checks[dtype])())
    except (AttributeError, RuntimeError):
        return False


class _Float32Gemms(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight, bias = linear_arguments(args, kwargs)
            if x.dtype in HALF and weight.dtype == x.dtype and x.numel() >= MIN_ROWS * x.shape[-1]:
                out = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
                return out.to(x.dtype)
        return func(*args, **kwargs)


def gemm_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype a product of ``dtype`` operands is best computed in on ``device``: float32 for
    half precision on a CPU without a native GEMM for it, else ``dtype`` itself."""
    if torch.device(device).type == "cpu" and dtype in HALF and not native_half_gemm(dtype):
        return torch.float32
    return dtype


def float32_gemms(device: torch.device, dtype: torch.dtype, rows: int):
    """A context in which half-precision ``F.linear`` of ``MIN_ROWS`` rows or more runs in float32
    (module docstring), for forwards of about ``rows`` rows in ``dtype`` on ``device`` that has no
    native GEMM for it; elsewhere a no-op (the mode's own cost falls on every op it sees)."""
    if rows >= MIN_ROWS and dtype != gemm_dtype(device, dtype):
        return _Float32Gemms()
    return contextlib.nullcontext()
