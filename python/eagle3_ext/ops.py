"""Typed wrappers and fake (meta) kernels for the torch.ops.eagle3 ops.

The schemas live in csrc/registration.cpp; the kernels in csrc/<op>/. The fake kernels
give torch.compile and FakeTensor tracing each op's output shape without running it.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch


def fused_aux_fc(
    aux_hidden: Sequence[torch.Tensor],
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Project the captured target hidden states without concatenating them.

    Computes ``cat(aux_hidden, -1) @ weight.T (+ bias)`` with fp32 accumulation.

    Args:
        aux_hidden: k >= 1 tensors ``[..., H]`` of one shape, dtype (float32, float16 or
            bfloat16) and device: the target hidden states captured for the draft.
        weight: ``[H_out, k * H]``, the draft's fc weight.
        bias: ``[H_out]`` or None.

    Returns:
        ``[..., H_out]`` in the input dtype.

    Raises:
        RuntimeError: naming the argument and the numbers when the shapes disagree, most
        importantly when ``k * H != weight.size(1)``: the captured layers are not the ones
        the draft was trained on.
    """
    return torch.ops.eagle3.fused_aux_fc(list(aux_hidden), weight, bias)


@torch.library.register_fake("eagle3::fused_aux_fc")
def _fused_aux_fc_fake(aux_hidden, weight, bias):
    first = aux_hidden[0]
    torch._check(
        weight.dim() == 2 and weight.size(1) == len(aux_hidden) * first.size(-1),
        lambda: (
            f"eagle3.fused_aux_fc: got {len(aux_hidden)} aux hidden states of width "
            f"{first.size(-1)} but weight has shape {tuple(weight.shape)}"
        ),
    )
    return first.new_empty((*first.shape[:-1], weight.size(0)))


def _fused_aux_fc_setup_context(ctx, inputs, output):
    aux_hidden, weight, bias = inputs
    ctx.save_for_backward(*aux_hidden, weight)
    ctx.num_aux = len(aux_hidden)
    ctx.has_bias = bias is not None


def _fused_aux_fc_backward(ctx, grad):
    *aux_hidden, weight = ctx.saved_tensors
    hidden = aux_hidden[0].size(-1)
    grad2d = grad.reshape(-1, grad.size(-1))
    grad_aux, grad_w = [], []
    for s, x in enumerate(aux_hidden):
        w_s = weight[:, s * hidden:(s + 1) * hidden]
        grad_aux.append((grad2d @ w_s).view_as(x) if ctx.needs_input_grad[0] else None)
        grad_w.append(grad2d.t() @ x.reshape(-1, hidden))
    grad_weight = torch.cat(grad_w, dim=1) if ctx.needs_input_grad[1] else None
    grad_bias = grad2d.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
    return grad_aux, grad_weight, grad_bias


# Training the draft differentiates through the fc; the gradients are plain GEMMs per segment.
torch.library.register_autograd(
    "eagle3::fused_aux_fc", _fused_aux_fc_backward, setup_context=_fused_aux_fc_setup_context)
