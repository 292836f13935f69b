"""The target side of a round: prefill, the verify forward over a draft tree, and keeping
exactly the accepted path in the target's KV cache.

All requests share one Hugging Face DynamicCache (with a compiled verify, a StaticCache of
fixed capacity) whose layers all keep the full history (a sliding-window layer's cache would
drop the positions a rejected round has to fall back to; the window is applied by the
attention instead). Layout: request b's committed tokens sit at
cache slots ``[0, seq_lens[b])``, in order, slot = position; slots after them are stale. The
prefill is left-padded, as Hugging Face's own batched generate runs it, and is then
left-aligned once. A verify forward appends the N tree tokens of every request at the end of
the cache (slots ``S .. S + N - 1``, S = the cache length):

- ``attention="tree"``: each layer runs eagle3.tree_attention (with the layer's window,
  soft-cap and sinks) on prefix lengths ``seq_lens``; when requests differ in length the op is
  told where the tree sits (``tree_start`` = S).
- ``attention="sdpa"``: the model's own attention with a 4D additive mask per layer type
  (prefix slots below ``seq_lens[b]``, ancestors in the tree, the sliding window on positions).

``commit`` moves the accepted tokens to ``seq_lens[b] ..`` and crops the cache to the longest
request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Union

import torch

from ..capture import AuxHiddenCapture
from ..draft.cache import compact_rows
from ..tree import DraftTree
from .compiled_verify import CompiledVerify
from .half_gemm import float32_gemms

SLIDING, FULL = "sliding_attention", "full_attention"


@dataclass
class TargetOutput:
    logits: torch.Tensor            # [B, n, V]
    aux_hidden: List[torch.Tensor]  # k x [B, n, H_target]


def layer_windows(config) -> Dict[str, Optional[int]]:
    """The sliding window of each attention layer type, as the model's own masks apply it:
    models with ``layer_types`` window their "sliding_attention" layers by
    ``config.sliding_window``; the others (Mistral, Phi-3) window every layer when it is set."""
    window = getattr(config, "sliding_window", None) or None
    if getattr(config, "layer_types", None):
        return {FULL: None, SLIDING: window}
    return {FULL: window}


class TargetRunner:
    """``compiled`` (with ``capacity``, ``node_buckets``): the verify forward runs as ``compiled``'s
    graph over a static cache of ``capacity`` slots, every tree padded to the smallest bucket
    that holds it so that the graph has few shapes (engine/compiled_verify.py); the layout is
    the same."""

    def __init__(self, model, capture: AuxHiddenCapture, use_tree_attention: bool,
                 compiled: Optional[CompiledVerify] = None, capacity: int = 0, node_buckets: Sequence[int] = ()):
        from transformers import DynamicCache

        self.model = model
        self.capture = capture
        self.use_tree_attention = use_tree_attention
        self.compiled = compiled
        self.node_buckets = sorted(node_buckets)
        # full layers only, whatever the config says (see above)
        self.cache = compiled.new_cache(capacity) if compiled is not None else DynamicCache()
        self.seq_lens: Optional[torch.Tensor] = None   # [B] int64: committed tokens per request
        self.windows = layer_windows(model.config)
        self._tree_start: Optional[torch.Tensor] = None  # [B] the slot of the last verify's tree

    def _forward(self, cache=None, **kwargs) -> TargetOutput:
        with torch.no_grad(), self.capture:
            out = self.model(cache=self.cache if cache is None else cache, use_cache=True, **kwargs)
            aux = self.capture.take()
        return TargetOutput(out.logits, aux)

    def _length(self) -> int:
        """Slots in use (a static cache counts them in a tensor)."""
        return int(self.cache.get_seq_length())

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> TargetOutput:
        """input_ids [B, L] left-padded, attention_mask [B, L] (1 = token). Returns the outputs
        in that left-padded layout (logits of the last position only, [B, 1, V]); the cache is
        then left-aligned."""
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        # Only the last position's logits pick the first token: the rest would be a [B, L, V]
        # tensor, the largest allocation of a long prompt.
        weight = self.model.get_input_embeddings().weight
        # A compiled verify's static cache is filled from an eager prefill's own cache: the model's
        # masks and attention then see the prompt exactly as on the eager path (a static cache's
        # keys span its whole capacity, which an attention without a mask would misplace).
        from transformers import DynamicCache

        cache = DynamicCache() if self.compiled is not None else self.cache
        with float32_gemms(weight.device, weight.dtype, input_ids.numel()):
            out = self._forward(cache=cache, input_ids=input_ids, attention_mask=attention_mask,
                                position_ids=positions, logits_to_keep=1)
        if self.compiled is not None:
            self.compiled.fill(self.cache, cache)
        self.seq_lens = attention_mask.long().sum(-1)
        pads = input_ids.shape[1] - self.seq_lens
        if bool((pads > 0).any()):
            # Slot j of request b takes its padded slot pads[b] + j (clamped: stale beyond its length).
            src = (pads[:, None] + torch.arange(input_ids.shape[1], device=pads.device)).clamp(
                max=input_ids.shape[1] - 1)
            length = input_ids.shape[1]
            for layer in self.cache.layers:
                for name in ("keys", "values"):
                    buf = getattr(layer, name)[:, :, :length]  # in place: a static cache keeps its buffers
                    index = src[:, None, :, None].expand(buf.shape[0], buf.shape[1], src.shape[1], buf.shape[3])
                    buf.copy_(torch.gather(buf, 2, index))
        return out

    @property
    def ragged(self) -> bool:
        return bool((self.seq_lens != self.seq_lens.max()).any())

    def verify(self, tree: DraftTree) -> TargetOutput:
        """The target over the tree's N tokens per request, each seeing its committed prefix and
        its ancestors; the tree's keys and values stay in the cache until ``commit``."""
        b, n = tree.draft_tokens.shape
        tree_mask = tree.tree_mask.view(b, n, n)
        positions = tree.positions.view(b, n)
        s = self._length()
        self._tree_start = torch.full_like(self.seq_lens, s)  # where the cache appends the tree
        if self.compiled is not None:
            return self._compiled_verify(tree.draft_tokens, positions, tree_mask)
        if self.use_tree_attention:
            extra = {"tree_start": self._tree_start} if self.ragged else {}
            return self._forward(input_ids=tree.draft_tokens, position_ids=positions, tree_mask=tree_mask,
                                 cache_lens=self.seq_lens, **extra)
        return self._forward(input_ids=tree.draft_tokens, position_ids=positions,
                             attention_mask=self._sdpa_masks(tree_mask, positions, s))

    def _compiled_verify(self, tokens: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor) -> TargetOutput:
        """The tree padded to its node bucket (hybrid drafting makes trees of varying size): a
        padding node sees only itself and nobody sees it; its outputs are cut off and its cache
        slots, past the real tree, are dropped by ``commit``."""
        b, n = tokens.shape
        size = next(s for s in self.node_buckets if s >= n)
        pad = size - n
        if pad > 0:
            tokens = torch.cat([tokens, tokens.new_zeros(b, pad)], dim=1)
            positions = torch.cat([positions, positions[:, :1].expand(b, pad)], dim=1)
            mask = torch.zeros(b, size, size, dtype=torch.bool, device=tree_mask.device)
            mask[:, :n, :n] = tree_mask
            mask[:, n:, n:] = torch.eye(pad, dtype=torch.bool, device=tree_mask.device)
            tree_mask = mask
        with torch.no_grad():
            logits, aux = self.compiled(self.capture, self.cache, tokens, positions, tree_mask, self.seq_lens,
                                        self._tree_start)
        return TargetOutput(logits[:, :n], [a[:, :n] for a in aux])

    def _sdpa_masks(self, tree_mask: torch.Tensor, positions: torch.Tensor, s: int) -> Union[torch.Tensor, dict]:
        """Additive masks [B, 1, N, S + N] for the model's own attention, per layer type."""
        b, n, _ = tree_mask.shape
        device = tree_mask.device
        slot = torch.arange(s, device=device)
        prefix = (slot[None, :] < self.seq_lens[:, None])[:, None, :].expand(b, n, s)       # slot = position
        key_pos = torch.cat([slot[None, :].expand(b, s), positions], dim=1)                # [B, S + N]
        visible = torch.cat([prefix, tree_mask], dim=-1)                                   # [B, N, S + N]
        dtype = self.model.get_input_embeddings().weight.dtype

        def additive(window: Optional[int]) -> torch.Tensor:
            seen = visible if window is None else visible & (key_pos[:, None, :] > positions[:, :, None] - window)
            return torch.zeros(seen.shape, dtype=dtype, device=device).masked_fill(~seen, torch.finfo(dtype).min)[:, None]

        masks = {kind: additive(window) for kind, window in self.windows.items()}
        return masks if len(masks) > 1 else masks[FULL]

    def select_rows(self, keep: torch.Tensor) -> None:
        """Keeps only the requests at indices ``keep`` (finished ones leave the batch)."""
        # (a compiled verify's cache keeps its addresses: engine/buffer_pool.py)
        select = compact_rows if self.compiled is not None else (lambda t, rows: t.index_select(0, rows))
        for layer in self.cache.layers:
            layer.keys = select(layer.keys, keep)
            layer.values = select(layer.values, keep)
        self.seq_lens = self.seq_lens.index_select(0, keep)
        surplus = self._length() - int(self.seq_lens.max())
        if surplus > 0:
            self.cache.crop(-surplus)

    def commit(self, accept_local: torch.Tensor, counts: torch.Tensor) -> None:
        """Keeps, per request, the tree nodes ``accept_local[b, :counts[b]]`` (root first) and drops
        the rest of the tree. Keys and values are moved, never recomputed."""
        b = accept_local.shape[0]
        m = int(counts.max())
        device = accept_local.device
        src = self._tree_start[:, None] + accept_local[:, :m].clamp(min=0).long()     # [B, m]
        dst = self.seq_lens[:, None] + torch.arange(m, device=device)                  # [B, m]
        # A chain's accepted nodes (and a tree's first-child path) already sit where they are
        # committed: the leading columns in place for every request are not moved (16 gathers
        # and scatters of a few rows each are a measurable part of a round on CPU).
        start = int((src == dst).all(0).long().cumprod(0).sum())
        src, dst, m = src[:, start:], dst[:, start:], m - start
        for layer in self.cache.layers if m > 0 else ():
            for name in ("keys", "values"):
                buf = getattr(layer, name)                                             # [B, Hkv, S + N, D]
                shape = (b, buf.shape[1], m, buf.shape[3])
                moved = torch.gather(buf, 2, src[:, None, :, None].expand(shape))
                buf.scatter_(2, dst[:, None, :, None].expand(shape), moved)
        self.seq_lens = self.seq_lens + counts
        surplus = self._length() - int(self.seq_lens.max())
        if surplus > 0:
            self.cache.crop(-surplus)
