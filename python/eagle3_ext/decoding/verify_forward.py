"""The target's verify forward over a draft tree: one forward (``tree_forward``) and the ways to run
it behind one interface (``VerifyForward``: the capture hooks, the cache and the tree's inputs in;
the logits and the captured states out; the tree's keys and values stay in the cache until
``TargetRunner.commit``):

- ``TreeAttentionVerify``: eager, the model with the eagle3_tree attention (``attention="tree"``,
  the default); each layer runs eagle3.tree_attention (with the layer's window, soft-cap and
  sinks) on prefix lengths ``cache_lens``; when requests differ in length the op is also told
  where the tree sits (``tree_start``);
- ``SdpaVerify``: eager, the model's own attention with a 4D additive mask per layer type (prefix
  slots below ``cache_lens[b]``, ancestors in the tree, the sliding window on positions);
- ``compiled.verify.CompiledVerify``: ``tree_forward`` as a compiled graph over a static cache, or
  for a float32 target on CPU an AOTInductor package of it (``compiled/packages.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Union

import torch

from .capture import AuxHiddenCapture

SLIDING, FULL = "sliding_attention", "full_attention"


@dataclass
class TargetOutput:
    logits: torch.Tensor            # [B, n, V]
    aux_hidden: List[torch.Tensor]  # k x [B, n, H_target]


@dataclass
class TreeInputs:
    """A verify's inputs: request b's tree tokens sit at cache slots ``tree_start[b] ..``, after
    its ``cache_lens[b]`` committed ones (slot = position)."""

    tokens: torch.Tensor       # [B, n] the tree's tokens
    positions: torch.Tensor    # [B, n] their positions
    tree_mask: torch.Tensor    # [B, n, n] bool: node i sees node j (its ancestors and itself)
    cache_lens: torch.Tensor   # [B] committed tokens per request
    tree_start: torch.Tensor   # [B] the cache slot of each request's first tree token

    @property
    def ragged(self) -> bool:
        """Whether the requests differ in length (the tree then does not follow every prefix)."""
        return bool((self.cache_lens != self.cache_lens.max()).any())


def tree_forward(model, cache, tokens: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor,
                 cache_lens: torch.Tensor, tree_start: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The logits of ``model`` (with the eagle3_tree attention) over a tree appended to ``cache``;
    the one forward that every strategy but ``SdpaVerify`` runs, eagerly, compiled or exported.
    ``tree_start`` may be left out when every request's tree follows its prefix."""
    extra = {} if tree_start is None else {"tree_start": tree_start}
    out = model(input_ids=tokens, position_ids=positions, cache=cache, use_cache=True, tree_mask=tree_mask,
                cache_lens=cache_lens, **extra)
    return out.logits


class VerifyForward:
    """The interface: ``forward(capture, cache, tree)`` runs the target over ``tree``, appending
    its keys and values to ``cache``, and returns the logits and ``capture``'s aux states."""

    def __call__(self, capture: AuxHiddenCapture, cache, tree: TreeInputs) -> TargetOutput:
        raise NotImplementedError


class TreeAttentionVerify(VerifyForward):
    """Eager, with the eagle3_tree attention (module docstring)."""

    def __init__(self, model):
        self.model = model

    def __call__(self, capture: AuxHiddenCapture, cache, tree: TreeInputs) -> TargetOutput:
        with torch.no_grad(), capture:
            logits = tree_forward(self.model, cache, tree.tokens, tree.positions, tree.tree_mask, tree.cache_lens,
                                  tree.tree_start if tree.ragged else None)
            aux = capture.take()
        return TargetOutput(logits, aux)


def layer_windows(config) -> Dict[str, Optional[int]]:
    """The sliding window of each attention layer type, as the model's own masks apply it:
    models with ``layer_types`` window their "sliding_attention" layers by
    ``config.sliding_window``; the others (Mistral, Phi-3) window every layer when it is set."""
    window = getattr(config, "sliding_window", None) or None
    if getattr(config, "layer_types", None):
        return {FULL: None, SLIDING: window}
    return {FULL: window}


class SdpaVerify(VerifyForward):
    """Eager, the model's own attention with additive masks (module docstring)."""

    def __init__(self, model):
        self.model = model
        self.windows = layer_windows(model.config)

    def __call__(self, capture: AuxHiddenCapture, cache, tree: TreeInputs) -> TargetOutput:
        masks = self.masks(tree, cache.get_seq_length())  # (a DynamicCache's length: its shape, no sync)
        with torch.no_grad(), capture:
            out = self.model(input_ids=tree.tokens, position_ids=tree.positions, attention_mask=masks, cache=cache,
                             use_cache=True)
            aux = capture.take()
        return TargetOutput(out.logits, aux)

    def masks(self, tree: TreeInputs, s: int) -> Union[torch.Tensor, dict]:
        """Additive masks [B, 1, N, S + N] for the model's own attention, per layer type (``s``:
        the cache's slots before the tree)."""
        b, n, _ = tree.tree_mask.shape
        device = tree.tree_mask.device
        slot = torch.arange(s, device=device)
        prefix = (slot[None, :] < tree.cache_lens[:, None])[:, None, :].expand(b, n, s)    # slot = position
        key_pos = torch.cat([slot[None, :].expand(b, s), tree.positions], dim=1)            # [B, S + N]
        visible = torch.cat([prefix, tree.tree_mask], dim=-1)                               # [B, N, S + N]
        dtype = self.model.get_input_embeddings().weight.dtype

        def additive(window: Optional[int]) -> torch.Tensor:
            seen = visible if window is None else visible & (key_pos[:, None, :] > tree.positions[:, :, None] - window)
            return torch.zeros(seen.shape, dtype=dtype, device=device).masked_fill(~seen, torch.finfo(dtype).min)[:, None]

        masks = {kind: additive(window) for kind, window in self.windows.items()}
        return masks if len(masks) > 1 else masks[FULL]
