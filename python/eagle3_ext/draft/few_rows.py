"""Linear layers over few rows on CPU through the library's streaming kernel: the draft's
(``linear``, ``linears``), and a half-precision target's inside its compiled verify
(``StreamedLinears``).

A draft step multiplies one row per tree node (a chain: one row a request) by each weight, and
a round's commit a handful: matrix-vector products, bound by reading the weight. ATen sends
them to oneDNN, whose per-call setup is most of such a product's time; ``eagle3.fused_aux_fc``
(k segments, here one or two) reads the weight once with fp32 accumulation, faster than
``F.linear`` over one to a few rows in bfloat16 and float32 (docs/perf_notes.md has the
measurements).

Many rows (prefill, training) stay with ``F.linear``, and so does every device but the CPU.
Training keeps ``F.linear`` whatever the rows: gradients need not flow through the op.
"""

from __future__ import annotations

from typing import List, Sequence

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
