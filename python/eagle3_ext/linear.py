"""Linear layers routed by their shape on CPU: few rows through the library's streaming kernel,
many rows of half precision through float32 where the CPU has no native half-precision GEMM, and
many rows of float32 through oneDNN where ATen's own float32 GEMM is slow.

Few rows. A draft step multiplies one row per tree node (a chain: one row a request) by each
weight, and a round's commit a handful: matrix-vector products, bound by reading the weight.
ATen sends them to oneDNN, whose per-call setup is most of such a product's time;
``eagle3.fused_aux_fc`` (k segments, here one or two) reads the weight once with fp32
accumulation, faster than ``F.linear`` over one to a few rows in bfloat16 and float32
(docs/perf_notes.md has the measurements). The draft calls it through ``linear`` / ``linears``;
modules written elsewhere (the target's projections in an eager verify, a half-precision
target's inside its compiled one) through ``RoutedLinears(stream=...)``. Many rows (prefill,
training) stay with ``F.linear``, and so does every device but the CPU. Training keeps
``F.linear`` whatever the rows: gradients need not flow through the op.

Many rows. On a CPU without AVX512-BF16 / AMX (AVX512-FP16 for float16), ATen multiplies bfloat16
matrices through a slow fallback, several times slower than converting the operands to float32,
multiplying and rounding back. Inside ``float32_gemms``, ``F.linear`` with half-precision operands
and at least ``MIN_ROWS`` rows converts them to float32, multiplies and rounds the product back
once: what ATen's half-precision GEMM computes (float32 accumulation, one rounding), in another
summation order. The generator uses it where many rows meet the weights in eager mode: the
target's prefill and the draft's pass over the prompt.

An eager verify forward takes both routes (``eager_linears``): a tree's few rows per request
stream, a batch's many rows of half precision go through float32. On SmolLM2-135M (2 cores,
AVX2, a 6-token tree) its verify took 104-108 ms through ATen in bfloat16 and 48-51 ms streamed;
96-108 ms against 58-62 ms in float32.

Many float32 rows on an AMD CPU. ATen multiplies float32 matrices through MKL on x86, which on
AMD CPUs runs well below the hardware: on a 2-core AMD EPYC (AVX-512, AVX512-BF16) SmolLM2-135M's
projections over 48 rows took 69 ms through ``F.linear`` and 40 ms through oneDNN
(``torch.ops.mkldnn._linear_pointwise`` over the plain weight, reordered inside each call), 84
against 48 ms over 64 rows, 118 against 62 over 96. There (``onednn_float32``) such products of
``MIN_ROWS`` rows or more go to oneDNN, with a backward of oneDNN products where gradients are
needed (``OneDNNLinear``): the target's prefill (a 48-token prompt's took 96 ms, 82 of them in its
products), a batch's eager verify, the training target's pass and a float32 draft's training. The
result is the same product in another summation order. Elsewhere ATen keeps them (MKL was not
measured to lose on Intel CPUs); ``EAGLE3_ONEDNN_FLOAT32=1`` / ``=0`` turns the route on / off
whatever the CPU.

Every route is one ``TorchFunctionMode`` (``RoutedLinears``), which a compiled graph traces
away; in eager mode a mode's cost falls on every torch call it sees, so an eager forward routes
its model's linear modules instead (``RoutedModules``, what ``eager_linears`` gives).
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from .errors import BadInputError

# Rows up to which the streaming kernel runs (the op itself hands more to ATen, which wins
# from about 24 rows on in bfloat16).
STREAM_ROWS = 16
# Fewer rows stay in half precision: converting the weight on every call costs as much as the
# product there (the float32 route lost at 4 rows and won from 8).
MIN_ROWS = 16
HALF = (torch.bfloat16, torch.float16)


# --- few rows: the streaming kernel ------------------------------------------------------------
def _few_cpu_rows(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.numel() <= STREAM_ROWS * x.shape[-1]


def streams(x: torch.Tensor, layer: nn.Module) -> bool:
    """Whether ``layer`` over ``x`` ([..., in_features]) runs through the streaming kernel: a
    plain ``nn.Linear`` (a subclass or another module may compute something else), on CPU, over
    few rows, without gradients."""
    return (type(layer) is nn.Linear and _few_cpu_rows(x)
            and not (torch.is_grad_enabled() and layer.weight.requires_grad))


def linear(layer: nn.Module, *parts: torch.Tensor) -> torch.Tensor:
    """``layer(torch.cat(parts, -1))``: ``parts`` are [..., H] tensors of one shape that together
    make the layer's input (the concatenation is never built on the streaming path)."""
    first = parts[0]
    if streams(first, layer):
        return torch.ops.eagle3.fused_aux_fc(list(parts), layer.weight, layer.bias)
    return layer(torch.cat(parts, -1) if len(parts) > 1 else first)


def _frozen_graph() -> bool:
    """Whether this runs while a graph is traced for Inductor with frozen weights."""
    if not torch.compiler.is_compiling():
        return False
    import torch._inductor.config as inductor_config  # (loaded by then; on its own it is slow to import)

    return bool(inductor_config.freezing)


def _stackable(layers: Sequence[nn.Module], x: torch.Tensor) -> bool:
    """Whether ``layers`` over ``x`` all stream and their weights (and biases) stack: one dtype,
    a bias on all of them or none."""
    return (all(streams(x, layer) for layer in layers)
            and len({layer.weight.dtype for layer in layers}) == 1
            and len({layer.bias is None for layer in layers}) == 1)


def linears(layers: Sequence[nn.Module], *parts: torch.Tensor) -> List[torch.Tensor]:
    """``[linear(layer, *parts) for layer in layers]``: layers that read the same input (a draft
    layer's q, k and v; its gate and up).

    In a graph compiled with frozen weights (``torch.compile`` with Inductor's ``freezing``, as
    the compiled generator builds on CPU) the products run as one streaming call over the layers'
    stacked weights, its output split after: Inductor folds the concatenation of the constant
    weights into one constant when it compiles, so each call reads the same bytes, and a draft
    step makes 5 kernel calls instead of 8 (each call has its own launch and thread fork). Out of
    such a graph the concatenation would be a copy on every call, so the layers run one by one."""
    if len(layers) > 1 and _frozen_graph() and _stackable(layers, parts[0]):
        weight = torch.cat([layer.weight for layer in layers])
        bias = None if layers[0].bias is None else torch.cat([layer.bias for layer in layers])
        out = torch.ops.eagle3.fused_aux_fc(list(parts), weight, bias)
        return list(out.split([layer.out_features for layer in layers], -1))
    return [linear(layer, *parts) for layer in layers]


# --- many rows of half precision: float32 products ----------------------------------------------
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


def gemm_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype a product of ``dtype`` operands is best computed in on ``device``: float32 for
    half precision on a CPU without a native GEMM for it, else ``dtype`` itself."""
    if torch.device(device).type == "cpu" and dtype in HALF and not native_half_gemm(dtype):
        return torch.float32
    return dtype


# --- many rows of float32 on an AMD CPU: oneDNN ------------------------------------------------
def cpu_vendor() -> str:
    """The CPU's vendor string (``vendor_id`` of /proc/cpuinfo: GenuineIntel, AuthenticAMD), or ""
    where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("vendor_id")), "")
    except OSError:
        return ""


# Overrides the CPU's vendor for ``onednn_float32``: 1 (oneDNN wherever this torch build has its
# linear), 0 (ATen everywhere); read once a process.
ONEDNN_FLOAT32 = "EAGLE3_ONEDNN_FLOAT32"


@functools.cache  # the CPU does not change; asked on every prefill
def onednn_float32() -> bool:
    """Whether many-row float32 products on this CPU go through oneDNN rather than ATen's GEMM
    (module docstring): an AMD CPU, with oneDNN's linear in this torch build, unless
    ``EAGLE3_ONEDNN_FLOAT32`` says otherwise (a value other than 0 or 1 raises a ValueError naming
    it)."""
    wanted = os.environ.get(ONEDNN_FLOAT32, "")
    if wanted not in ("", "0", "1"):
        raise BadInputError(f"{ONEDNN_FLOAT32} must be 0 or 1, got {wanted!r}")
    if wanted == "0" or (not wanted and cpu_vendor() != "AuthenticAMD") or not torch.backends.mkldnn.is_available():
        return False
    return hasattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise")


def _onednn_product(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x @ weight.T + bias`` by oneDNN's linear, no fused activation (no autograd)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [None], "")


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` through oneDNN (float32 on CPU), differentiable: the op has no
    backward of its own, so ``OneDNNLinear`` gives it one where gradients are needed."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias)):
        return OneDNNLinear.apply(x, weight, bias)
    return _onednn_product(x, weight, bias)


class OneDNNLinear(torch.autograd.Function):
    """``F.linear`` through oneDNN with both backward products through oneDNN too: the input's
    gradient is ``grad @ weight`` (a linear with ``weight.t()``), the weight's ``grad^T @ x`` (a
    linear of ``grad^T`` with ``x^T``). Training the draft in float32 on an AMD CPU takes this
    route (SmolLM2's draft shapes over 4096 rows: 175-217 GFLOP/s through ATen in the three
    products, 247-497 through oneDNN; docs/perf_notes.md)."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _onednn_product(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _onednn_product(grad, weight.t())
        rows = grad.reshape(-1, grad.shape[-1])
        if ctx.needs_input_grad[1]:
            grad_w = _onednn_product(rows.t(), x.reshape(-1, x.shape[-1]).t())
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = rows.sum(0)
        return grad_x, grad_w, grad_b


# --- the one interceptor ----------------------------------------------------------------------
def _linear_arguments(args, kwargs):
    """(input, weight, bias) of an ``F.linear`` call seen by a TorchFunctionMode."""
    x = args[0] if args else kwargs["input"]
    weight = args[1] if len(args) > 1 else kwargs["weight"]
    bias = args[2] if len(args) > 2 else kwargs.get("bias")
    return x, weight, bias


def _plain(*tensors: Optional[torch.Tensor]) -> bool:
    """Whether these are plain tensors (or parameters): a subclass (a tensor-parallel target's
    DTensor weights) has no rule for oneDNN's op, so it keeps ``F.linear``."""
    return all(t is None or type(t) in (torch.Tensor, nn.Parameter) for t in tensors)


def _routed(x: torch.Tensor, weight: torch.Tensor, bias, stream: Sequence[torch.dtype],
            float32: bool, onednn: bool = False) -> Optional[torch.Tensor]:
    """``F.linear(x, weight, bias)`` by the route that applies (``RoutedLinears``), or None."""
    if weight.dtype == x.dtype:
        if x.dtype in stream and _few_cpu_rows(x) and not torch.is_grad_enabled():
            return torch.ops.eagle3.fused_aux_fc([x], weight, bias)
        many = x.numel() >= MIN_ROWS * x.shape[-1]
        if float32 and x.dtype in HALF and many:
            out = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
            return out.to(x.dtype)
        if (onednn and many and x.dtype == torch.float32 and x.device.type == "cpu"
                and (bias is None or bias.dtype == torch.float32) and _plain(x, weight, bias)):
            return onednn_linear(x, weight, bias)
    return None


class RoutedLinears(TorchFunctionMode):
    """Inside the context, ``F.linear`` (weight of the input's dtype) takes its route:

    - ``stream`` (dtypes): few rows of these dtypes on CPU, without gradients, run through the
      streaming kernel. Traced into a compiled graph the mode costs nothing a call; in eager mode
      every torch call passes through it (``RoutedModules`` routes one model's linears instead).
    - ``float32``: half precision of ``MIN_ROWS`` rows or more is multiplied in float32 and
      rounded back once (enter it through ``float32_gemms`` or ``eager_linears``, which check
      the CPU).
    - ``onednn``: float32 of ``MIN_ROWS`` rows or more on CPU runs through oneDNN, differentiable
      (likewise entered where ``onednn_float32`` says so)."""

    def __init__(self, stream: Sequence[torch.dtype] = (), float32: bool = False, onednn: bool = False):
        super().__init__()
        self.stream = tuple(stream)
        self.float32 = float32
        self.onednn = onednn

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            out = _routed(*_linear_arguments(args, kwargs), self.stream, self.float32, self.onednn)
            if out is not None:
                return out
        return func(*args, **kwargs)


def _routed_forward(layer: nn.Linear, stream: Sequence[torch.dtype], float32: bool, onednn: bool,
                    x: torch.Tensor) -> torch.Tensor:
    out = _routed(x, layer.weight, layer.bias, stream, float32, onednn)
    return F.linear(x, layer.weight, layer.bias) if out is None else out


class RoutedModules:
    """``RoutedLinears``' routes for the plain ``nn.Linear`` modules of one model, as a reusable
    context: inside it each such module's ``forward`` is the routed one (set on the module, removed
    on exit). An eager forward then pays the route's check on its linears only, where a mode pays
    on every torch call: SmolLM2-135M's eager 6-token verify took 43 / 54 ms against 49 / 60 ms
    (best / median of 12 alternating runs, 2 cores of an AVX-512 VM). A module whose ``forward``
    is already its own (a hook library's wrapper) keeps it."""

    def __init__(self, model: nn.Module, stream: Sequence[torch.dtype] = (), float32: bool = False,
                 onednn: bool = False):
        self.layers = [m for m in model.modules() if type(m) is nn.Linear and "forward" not in vars(m)]
        self.stream = tuple(stream)
        self.float32 = float32
        self.onednn = onednn

    def __enter__(self) -> "RoutedModules":
        for layer in self.layers:
            layer.forward = functools.partial(_routed_forward, layer, self.stream, self.float32, self.onednn)
        return self

    def __exit__(self, *exc) -> None:
        for layer in self.layers:
            vars(layer).pop("forward", None)


def eager_linears(model: nn.Module):
    """A reusable context for eager forwards of ``model`` over any number of rows: on CPU, few
    rows through the streaming kernel and many rows in float32 without a native GEMM for the
    model's half precision, or through oneDNN for a float32 model where ``onednn_float32`` (module
    docstring); elsewhere a no-op."""
    weight = model.get_input_embeddings().weight
    device, dtype = weight.device, weight.dtype
    if device.type != "cpu":
        return contextlib.nullcontext()
    return RoutedModules(model, stream=(dtype,), float32=dtype != gemm_dtype(device, dtype),
                         onednn=dtype == torch.float32 and onednn_float32())


def float32_gemms(device: torch.device, dtype: torch.dtype, rows: int):
    """A context for forwards of about ``rows`` rows in ``dtype`` on ``device`` (module docstring):
    from ``MIN_ROWS`` rows on, half-precision ``F.linear`` runs in float32 where the CPU has no
    native GEMM for it, and float32 ``F.linear`` through oneDNN where ``onednn_float32``;
    elsewhere a no-op (the mode's own cost falls on every op it sees)."""
    if rows < MIN_ROWS or torch.device(device).type != "cpu":
        return contextlib.nullcontext()
    if dtype != gemm_dtype(device, dtype):
        return RoutedLinears(float32=True)
    if dtype == torch.float32 and onednn_float32():
        return RoutedLinears(onednn=True)
    return contextlib.nullcontext()
