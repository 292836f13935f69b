"""Linear layers over few rows on CPU through the library's streaming kernel: the draft's
(``linear``), and a half-precision target's inside its compiled verify (``StreamedLinears``).

A draft step multiplies one row per tree node (a chain: one row a request) by each weight, and
a round's commit a handful: matrix-vector products, bound by reading the weight. ATen sends
them to oneDNN, whose per-call setup is most of such a product's time; ``eagle3.fused_aux_fc``
(k segments, here one or two) reads the weight once with fp32 accumulation. Measured on a
2-core AVX512-BF16 CPU, the bundled draft's shapes, weights in cache: one row 2.5-3x faster
than ``F.linear`` in bfloat16 (the 4096-row head 58 against 157 us, the 768 -> 640 attention
input 21 against 62 us), 1.3-2x in float32; six rows 1.3-2x in both.

Many rows (prefill, training) stay with ``F.linear``, and so does every device but the CPU.
Training keeps ``F.linear`` whatever the rows: gradients need not flow through the op.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

# Rows up to which the streaming kernel runs (the op itself hands more to ATen, which wins
# from about 24 rows on in bfloat16).
STREAM_ROWS = 16


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


def linear_arguments(args, kwargs):
    """(input, weight, bias) of an ``F.linear`` call seen by a TorchFunctionMode."""
    x = args[0] if args else kwargs["input"]
    weight = args[1] if len(args) > 1 else kwargs["weight"]
    bias = args[2] if len(args) > 2 else kwargs.get("bias")
    return x, weight, bias


class StreamedLinears(TorchFunctionMode):
    """Inside the context, ``F.linear`` over few rows of ``dtypes`` on CPU, without gradients,
    runs through the streaming kernel: for modules written elsewhere (a Hugging Face target's
    projections). Meant to be traced into a compiled graph, where the mode costs nothing a
    call; in eager mode every torch call would pass through it."""

    def __init__(self, dtypes: Sequence[torch.dtype]):
        super().__init__()
        self.dtypes = tuple(dtypes)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight, bias = linear_arguments(args, kwargs)
            if (x.dtype in self.dtypes and weight.dtype == x.dtype and _few_cpu_rows(x)
                    and not torch.is_grad_enabled()):
                return torch.ops.eagle3.fused_aux_fc([x], weight, bias)
        return func(*args, **kwargs)
