"""The target side of a round: prefill, the verify forward over a draft tree, and keeping
exactly the accepted path in the target's KV cache.

All requests share one Hugging Face DynamicCache (with a compiled verify, a StaticCache of
fixed capacity) whose layers all keep the full history (a sliding-window layer's cache would
drop the positions a rejected round has to fall back to; the window is applied by the
attention instead). Layout: request b's committed tokens sit at
cache slots ``[0, seq_lens[b])``, in order, slot = position; slots after them are stale. The
prefill is left-padded, as Hugging Face's own batched generate runs it, and is then
left-aligned once. A verify forward appends the N tree tokens of every request at the end of
the cache (slots ``S .. S + N - 1``, S = the cache length), run by one of the strategies of
``verify_forward.py`` (eager with the tree attention or SDPA masks, or compiled).

``commit`` moves the accepted tokens to ``seq_lens[b] ..`` and crops the cache to the longest
request.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..compiled.verify import CompiledVerify
from ..draft.cache import compact_rows
from ..linear import eager_linears, float32_gemms
from .capture import AuxHiddenCapture
from .tree import DraftTree
from .verify_forward import SdpaVerify, TargetOutput, TreeAttentionVerify, TreeInputs, VerifyForward


class TargetRunner:
    """``compiled`` (with ``capacity``): the verify forward runs as ``compiled``'s graph over a
    static cache of ``capacity`` slots (compiled/verify.py); the layout is the same."""

    def __init__(self, model, capture: AuxHiddenCapture, use_tree_attention: bool,
                 compiled: Optional[CompiledVerify] = None, capacity: int = 0):
        from transformers import DynamicCache

        self.model = model
        self.capture = capture
        self.compiled = compiled
        self.forward: VerifyForward = (compiled if compiled is not None else
                                       TreeAttentionVerify(model) if use_tree_attention else SdpaVerify(model))
        self._eager_linears = eager_linears(model) if compiled is None else None  # (linear.py)
        # full layers only, whatever the config says (see above)
        self.cache = compiled.new_cache(capacity) if compiled is not None else DynamicCache()
        self.seq_lens: Optional[torch.Tensor] = None   # [B] int64: committed tokens per request
        self._tree_start: Optional[torch.Tensor] = None  # [B] the slot of the last verify's tree

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
        with torch.no_grad(), self.capture, float32_gemms(weight.device, weight.dtype, input_ids.numel()):
            logits = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                                cache=cache, use_cache=True, logits_to_keep=1).logits
            out = TargetOutput(logits, self.capture.take())
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

    def verify(self, tree: DraftTree) -> TargetOutput:
        """The target over the tree's N tokens per request, each seeing its committed prefix and
        its ancestors; the tree's keys and values stay in the cache until ``commit``."""
        b, n = tree.draft_tokens.shape
        self._tree_start = torch.full_like(self.seq_lens, self._length())  # where the cache appends the tree
        inputs = TreeInputs(tree.draft_tokens, tree.positions.view(b, n), tree.tree_mask.view(b, n, n),
                            self.seq_lens, self._tree_start)
        if self.compiled is not None:
            return self.forward(self.capture, self.cache, inputs)
        with self._eager_linears:
            return self.forward(self.capture, self.cache, inputs)

    def select_rows(self, keep: torch.Tensor) -> None:
        """Keeps only the requests at indices ``keep`` (finished ones leave the batch)."""
        # (a compiled verify's cache keeps its addresses: compiled/buffer_pool.py)
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
