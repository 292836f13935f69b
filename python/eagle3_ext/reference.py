"""Pure-PyTorch definitions of what every eagle3 op computes.

These are the ground truth that the tests compare the C++ and CUDA kernels against and the
baselines that the benchmarks time. They favour clarity over speed.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F


def fused_aux_fc(
    aux_hidden: Sequence[torch.Tensor], weight: torch.Tensor, bias: Optional[torch.Tensor]
) -> torch.Tensor:
    """cat(aux_hidden, -1) @ weight.T (+ bias), computed in fp32, returned in the input dtype."""
    x = torch.cat(list(aux_hidden), dim=-1)
    out = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    return out.to(aux_hidden[0].dtype)


def cat_linear(
    aux_hidden: Sequence[torch.Tensor], weight: torch.Tensor, bias: Optional[torch.Tensor]
) -> torch.Tensor:
    """The unfused baseline an engine would otherwise run: torch.cat + F.linear in the input dtype."""
    return F.linear(torch.cat(list(aux_hidden), dim=-1), weight, bias)


def dense_tree_mask(cache_lens: torch.Tensor, tree_mask: torch.Tensor, kv_len: int) -> torch.Tensor:
    """The dense mask equivalent to (cache_lens, tree_mask): bool ``[B, 1, N, kv_len]``.

    Entry ``[b, 0, i, s]`` is True when tree token i of request b may attend cache position s:
    a prefix position ``s < cache_lens[b]``, or the tree position ``s = cache_lens[b] + j`` of a
    tree token j with ``tree_mask[b, i, j]``. This is the 4D mask SDPA (and Hugging Face's sdpa
    attention) takes for a tree verify forward.
    """
    B, N, _ = tree_mask.shape
    pos = torch.arange(kv_len, device=tree_mask.device).view(1, 1, kv_len)
    lens = cache_lens.to(device=tree_mask.device, dtype=torch.long).view(B, 1, 1)
    j = pos - lens  # tree index of each position, [B, 1, kv_len]
    in_tree = (j >= 0) & (j < N)
    seen = torch.gather(tree_mask, 2, j.clamp(0, max(N - 1, 0)).expand(B, N, kv_len))
    return ((pos < lens) | (seen & in_tree)).unsqueeze(1)


def tree_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    tree_mask: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """eagle3.tree_attention: SDPA in fp32 with the dense tree mask, in q's dtype.

    q ``[B, N, Hq, D]``; k_cache, v_cache ``[B, S_max, Hkv, D]``; cache_lens ``[B]``;
    tree_mask bool ``[B, N, N]``. Returns ``[B, N, Hq, D]``.
    """
    Hq, Hkv = q.size(2), k_cache.size(2)
    qf = q.float().transpose(1, 2)  # [B, Hq, N, D]
    k = k_cache.float().transpose(1, 2).repeat_interleave(Hq // Hkv, dim=1)  # [B, Hq, S, D]
    v = v_cache.float().transpose(1, 2).repeat_interleave(Hq // Hkv, dim=1)
    mask = dense_tree_mask(cache_lens, tree_mask, k_cache.size(1))
    out = F.scaled_dot_product_attention(qf, k, v, attn_mask=mask, scale=scale)
    return out.transpose(1, 2).to(q.dtype)


def gather_pages(pages: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """A paged cache ``[P, page_size, Hkv, D]`` as a contiguous ``[B, max_blocks * page_size, Hkv, D]``."""
    table = block_table.long().clamp(0, pages.size(0) - 1)  # unused entries may hold anything
    return pages[table].flatten(1, 2)


def tree_attention_paged(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    block_table: torch.Tensor,
    cache_lens: torch.Tensor,
    tree_mask: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """eagle3.tree_attention_paged: the pages gathered into a contiguous cache, then tree_attention."""
    return tree_attention(
        q, gather_pages(k_pages, block_table), gather_pages(v_pages, block_table), cache_lens, tree_mask, scale
    )


def sdpa_dense_mask(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """The unfused baseline: SDPA in the input dtype with a dense mask, Hugging Face layout.

    q ``[B, Hq, N, D]``; k, v ``[B, Hkv, S, D]`` (GQA through ``enable_gqa``); mask bool
    ``[B, 1, N, S]`` (from dense_tree_mask). Returns ``[B, Hq, N, D]``.
    """
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
