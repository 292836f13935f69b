"""eagle3.tree_attention as a Hugging Face attention implementation.

    import eagle3_ext.hf_attention as hf_attention
    hf_attention.register()                       # once; idempotent
    model.set_attn_implementation(hf_attention.ATTENTION_NAME)
    out = model(input_ids=tree_ids,              # [B, N] draft-tree tokens
                position_ids=positions,          # [B, N] = prefix_len + depth
                cache=cache,                     # holds the committed prefix of every request
                tree_mask=tree_mask,             # bool [B, N, N], ancestors and self
                cache_lens=cache_lens)           # int [B], the prefix length of each request

Every decoder layer then computes its attention with eagle3.tree_attention, reading the
layer's K/V cache ``[B, Hkv, S, D]`` in place through a transposed view (the tree tokens' K/V
have just been written at positions ``cache_lens[b] ..``), with the layer's sliding window,
logit soft-cap and attention sinks. Without the two tree keywords the implementation is
Hugging Face's SDPA attention with whatever mask the model built (a causal one, or a 4D mask
passed as ``attention_mask``), or the model's own eager attention for layers SDPA cannot run (a
soft-cap, sinks), so prefill and plain decoding run unchanged.

The name is registered in both ``transformers.AttentionInterface`` and
``transformers.masking_utils.AttentionMaskInterface`` (with the SDPA mask builder): without
the second, Hugging Face hands a custom implementation ``attention_mask=None`` and the SDPA
fallback would silently attend to everything.
"""

from __future__ import annotations

import sys
from typing import Optional, Tuple

import torch

from .ops import tree_attention

ATTENTION_NAME = "eagle3_tree"


def tree_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    scaling: Optional[float] = None,
    dropout: float = 0.0,
    **kwargs,
) -> Tuple[torch.Tensor, None]:
    """The attention function Hugging Face calls in every layer.

    Args:
        query: ``[B, Hq, N, Dqk]`` (RoPE applied).
        key, value: ``[B, Hkv, S, Dqk]`` and ``[B, Hkv, S, Dv]``, the layer's cache including the
            N new tokens (Dv may differ from Dqk: MLA).
        attention_mask: the model's mask, used only without the tree keywords.
        scaling: softmax scale (``Dqk ** -0.5`` when None).
        kwargs: ``tree_mask`` (bool ``[B, N, N]``) and ``cache_lens`` (int ``[B]``) select the
            tree path. The layer's own ``sliding_window`` (Mistral, Qwen2, Gemma 2/3, Cohere 2,
            EXAONE 4, GPT-OSS), ``softcap`` (Gemma 2) and ``s_aux`` sinks (GPT-OSS), which the
            models pass to every attention implementation, become the op's window, soft-cap
            and sinks. Request b's tree tokens are read at cache slots ``cache_lens[b] + j``,
            or ``tree_start[b] + j`` with the ``tree_start`` keyword (requests of different
            lengths: Hugging Face's cache appends every request's tree at the same slot).

    Returns:
        ``(out [B, N, Hq, Dv], None)``.
    """
    tree_mask = kwargs.get("tree_mask")
    cache_lens = kwargs.get("cache_lens")
    if tree_mask is None and cache_lens is None:
        return _fallback(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    if tree_mask is None or cache_lens is None:
        raise ValueError(
            f"{ATTENTION_NAME} attention: pass both tree_mask and cache_lens for a tree forward "
            f"(got tree_mask={'set' if tree_mask is not None else 'None'}, "
            f"cache_lens={'set' if cache_lens is not None else 'None'})"
        )
    if dropout and module.training:
        raise ValueError(f"{ATTENTION_NAME} attention: dropout is not supported (got {dropout})")
    scale = float(scaling) if scaling is not None else query.size(-1) ** -0.5
    window = kwargs.get("sliding_window") or 0
    softcap = kwargs.get("softcap") or 0.0
    out = tree_attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), cache_lens, tree_mask,
                         scale, int(window), float(softcap), kwargs.get("s_aux"), kwargs.get("tree_start"))
    return out, None


def _fallback(module, query, key, value, attention_mask, scaling, dropout, **kwargs):
    """Without the tree keywords (prefill, plain decoding): Hugging Face's SDPA attention, or the
    model's own eager attention where SDPA cannot express the layer (a soft-cap or sinks)."""
    if kwargs.get("softcap") is None and kwargs.get("s_aux") is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:
        raise NotImplementedError(f"{ATTENTION_NAME} attention: {type(module).__name__} uses a soft-cap or sinks and "
                                  "its module has no eager_attention_forward to run them")
    if attention_mask is None:  # the SDPA mask builder skipped a plain causal mask
        q_len, kv_len = query.size(2), key.size(2)
        q_idx = torch.arange(kv_len - q_len, kv_len, device=query.device)[:, None]
        kv_idx = torch.arange(kv_len, device=query.device)[None, :]
        attention_mask = kv_idx <= q_idx
        if kwargs.get("sliding_window"):
            attention_mask = attention_mask & (kv_idx > q_idx - kwargs["sliding_window"])
        attention_mask = attention_mask[None, None]
    if attention_mask.dtype == torch.bool:  # eager adds the mask to the scores
        attention_mask = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device).masked_fill(
            ~attention_mask, torch.finfo(query.dtype).min)
    return eager(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


def register(name: str = ATTENTION_NAME) -> str:
    """Registers the implementation under `name` (attention and mask interfaces); returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, tree_attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
