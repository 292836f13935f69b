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
have just been written at positions ``cache_lens[b] ..``). Without the two tree keywords the
implementation is Hugging Face's SDPA attention with whatever mask the model built (a causal
one, or a 4D mask passed as ``attention_mask``), so prefill and plain decoding run unchanged.

The name is registered in both ``transformers.AttentionInterface`` and
``transformers.masking_utils.AttentionMaskInterface`` (with the SDPA mask builder): without
the second, Hugging Face hands a custom implementation ``attention_mask=None`` and the SDPA
fallback would silently attend to everything.
"""

from __future__ import annotations

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
        query: ``[B, Hq, N, D]`` (RoPE applied).
        key, value: ``[B, Hkv, S, D]``, the layer's cache including the N new tokens.
        attention_mask: the model's mask, used only by the SDPA fallback.
        scaling: softmax scale (``D ** -0.5`` when None).
        kwargs: ``tree_mask`` (bool ``[B, N, N]``) and ``cache_lens`` (int ``[B]``) select the
            tree path; everything else goes to the SDPA fallback. A sliding-window layer
            (``sliding_window`` set by Mistral / Qwen2) is accepted while the cache fits the
            window, and refused beyond it.

    Returns:
        ``(out [B, N, Hq, D], None)``.
    """
    tree_mask = kwargs.get("tree_mask")
    cache_lens = kwargs.get("cache_lens")
    if tree_mask is None and cache_lens is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if tree_mask is None or cache_lens is None:
        raise ValueError(
            f"{ATTENTION_NAME} attention: pass both tree_mask and cache_lens for a tree forward "
            f"(got tree_mask={'set' if tree_mask is not None else 'None'}, "
            f"cache_lens={'set' if cache_lens is not None else 'None'})"
        )
    window = kwargs.get("sliding_window")
    if window is not None and key.size(2) > window:
        raise NotImplementedError(
            f"{ATTENTION_NAME} attention: layer {getattr(module, 'layer_idx', '?')} uses a sliding window of "
            f"{window} positions but the cache holds {key.size(2)}; tree_attention attends the whole prefix"
        )
    if dropout and module.training:
        raise ValueError(f"{ATTENTION_NAME} attention: dropout is not supported (got {dropout})")
    scale = float(scaling) if scaling is not None else query.size(-1) ** -0.5
    out = tree_attention(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), cache_lens, tree_mask, scale
    )
    return out, None


def register(name: str = ATTENTION_NAME) -> str:
    """Registers the implementation under `name` (attention and mask interfaces); returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, tree_attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
