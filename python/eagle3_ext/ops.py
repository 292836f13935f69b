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


def tree_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    tree_mask: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Attention of N draft-tree tokens against their KV prefix and their tree ancestors.

    Query i of request b attends cache positions ``[0, cache_lens[b])`` (the committed prefix)
    and the tree positions ``cache_lens[b] + j`` with ``tree_mask[b, i, j]``. Softmax in fp32.

    Args:
        q: ``[B, N, Hq, D]`` queries of the tree tokens (float32, float16 or bfloat16).
        k_cache, v_cache: ``[B, S_max, Hkv, D]``, q's dtype, with the tree tokens' K/V already
            written at ``cache_lens[b] .. cache_lens[b] + N - 1``. Strided views are read in
            place (e.g. Hugging Face's ``[B, Hkv, S, D]`` cache ``.transpose(1, 2)``); unit
            stride along D. ``Hq % Hkv == 0`` (grouped-query attention).
        cache_lens: int32 or int64 ``[B]``, prefix length per request.
        tree_mask: bool ``[B, N, N]``, ancestors and self; the diagonal must be set (a padding
            row sets only its diagonal).
        scale: softmax scale, usually ``D ** -0.5``.

    Returns:
        ``[B, N, Hq, D]`` in q's dtype.

    Raises:
        RuntimeError: naming the argument and the numbers for wrong shapes, dtypes, devices,
        a mask row without its diagonal, or ``cache_lens[b] + N > S_max``.
    """
    return torch.ops.eagle3.tree_attention(q, k_cache, v_cache, cache_lens, tree_mask, scale)


def tree_attention_paged(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    block_table: torch.Tensor,
    cache_lens: torch.Tensor,
    tree_mask: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """tree_attention over a paged KV cache.

    Args:
        k_pages, v_pages: ``[P, page_size, Hkv, D]`` physical pages.
        block_table: int32 ``[B, max_blocks]``; cache position s of request b is row
            ``s % page_size`` of page ``block_table[b, s // page_size]``. It must cover
            ``cache_lens[b] + N`` positions.
        q, cache_lens, tree_mask, scale: as in :func:`tree_attention`.

    Returns:
        ``[B, N, Hq, D]`` in q's dtype.
    """
    return torch.ops.eagle3.tree_attention_paged(q, k_pages, v_pages, block_table, cache_lens, tree_mask, scale)


def _tree_attention_fake_checks(op, q, k, tree_mask):
    torch._check(q.dim() == 4 and k.dim() == 4, lambda: f"eagle3.{op}: q and the cache must be 4-D")
    torch._check(
        k.size(2) > 0 and q.size(2) % k.size(2) == 0,
        lambda: f"eagle3.{op}: q has {q.size(2)} heads, not a multiple of {k.size(2)} kv heads",
    )
    torch._check(
        tuple(tree_mask.shape) == (q.size(0), q.size(1), q.size(1)),
        lambda: f"eagle3.{op}: tree_mask must have shape [B, N, N], got {tuple(tree_mask.shape)}",
    )


@torch.library.register_fake("eagle3::tree_attention")
def _tree_attention_fake(q, k_cache, v_cache, cache_lens, tree_mask, scale):
    _tree_attention_fake_checks("tree_attention", q, k_cache, tree_mask)
    return q.new_empty(q.shape)


@torch.library.register_fake("eagle3::tree_attention_paged")
def _tree_attention_paged_fake(q, k_pages, v_pages, block_table, cache_lens, tree_mask, scale):
    _tree_attention_fake_checks("tree_attention_paged", q, k_pages, tree_mask)
    return q.new_empty(q.shape)
