"""The target side of a round: prefill, the verify forward over a draft tree, and keeping
exactly the accepted path in the target's KV cache.

All requests share one Hugging Face DynamicCache of length S. Request b's committed tokens
are the cache slots where ``valid[b]`` is True (``seq_lens[b]`` of them, in order); slots that
are not valid are left padding or the rejected tail of a request that accepted fewer tokens
than the others in some round. While no slot is invalid (always at batch 1), the verify
forward runs eagle3.tree_attention through the "eagle3_tree" attention implementation;
otherwise it passes a 4D additive mask that the SDPA path applies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch

from ..tree import DraftTree
from .capture import AuxHiddenCapture


@dataclass
class TargetOutput:
    logits: torch.Tensor            # [B, n, V]
    aux_hidden: List[torch.Tensor]  # k x [B, n, H_target]


class TargetRunner:
    def __init__(self, model, capture: AuxHiddenCapture, use_tree_attention: bool):
        from transformers import DynamicCache

        self.model = model
        self.capture = capture
        self.use_tree_attention = use_tree_attention
        self.cache = DynamicCache(config=model.config)
        self.valid = None       # [B, S] bool
        self.seq_lens = None    # [B] int64: committed tokens per request

    def _forward(self, **kwargs) -> TargetOutput:
        with torch.no_grad(), self.capture:
            out = self.model(cache=self.cache, use_cache=True, **kwargs)
            aux = self.capture.take()
        return TargetOutput(out.logits, aux)

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> TargetOutput:
        """input_ids [B, L] left-padded, attention_mask [B, L] (1 = token)."""
        mask = attention_mask.bool()
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        out = self._forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions)
        self.valid = mask
        self.seq_lens = mask.sum(-1)
        return out

    def verify(self, tree: DraftTree) -> TargetOutput:
        """The target over the tree's N tokens per request, each seeing its committed prefix and
        its ancestors; the tree's keys and values stay in the cache until ``commit``."""
        b, n = tree.draft_tokens.shape
        tree_mask = tree.tree_mask.view(b, n, n)
        positions = tree.positions.view(b, n)
        if self.use_tree_attention and bool(self.valid.all()):
            s = self.valid.shape[1]
            cache_lens = torch.full((b,), s, dtype=torch.int64, device=tree_mask.device)
            return self._forward(input_ids=tree.draft_tokens, position_ids=positions, tree_mask=tree_mask,
                                 cache_lens=cache_lens)
        visible = torch.cat([self.valid[:, None, :].expand(b, n, self.valid.shape[1]), tree_mask], dim=-1)
        dtype = self.model.get_input_embeddings().weight.dtype
        additive = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
        additive.masked_fill_(~visible, torch.finfo(dtype).min)
        return self._forward(input_ids=tree.draft_tokens, position_ids=positions, attention_mask=additive[:, None])

    def select_rows(self, keep: torch.Tensor) -> None:
        """Keeps only the requests at indices ``keep`` (finished ones leave the batch)."""
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, keep)
            layer.values = layer.values.index_select(0, keep)
        self.valid = self.valid.index_select(0, keep)
        self.seq_lens = self.seq_lens.index_select(0, keep)

    def commit(self, accept_local: torch.Tensor, counts: torch.Tensor) -> None:
        """Keeps, per request, the tree nodes ``accept_local[b, :counts[b]]`` (root first) and drops
        the rest of the tree. Keys and values are moved, never recomputed."""
        b, m_max = accept_local.shape
        m = int(counts.max())
        s = self.valid.shape[1]
        device = accept_local.device
        src = (s + accept_local[:, :m].clamp(min=0)).long()            # [B, m]
        for layer in self.cache.layers:
            for name in ("keys", "values"):
                buf = getattr(layer, name)                               # [B, Hkv, S + N, D]
                index = src[:, None, :, None].expand(b, buf.shape[1], m, buf.shape[3])
                moved = torch.gather(buf, 2, index)
                buf[:, :, s:s + m] = moved
        surplus = self.cache.get_seq_length() - (s + m)
        if surplus > 0:
            self.cache.crop(-surplus)
        kept = torch.arange(m, device=device)[None, :] < counts[:, None]
        self.valid = torch.cat([self.valid, kept], dim=1)
        self.seq_lens = self.seq_lens + counts
