"""The draft vocabulary: the most frequent target tokens, as EAGLE-3's d2t / t2d buffers."""

from __future__ import annotations

from typing import Tuple

import torch

from ..errors import BadInputError


def build_vocab_mapping(token_counts: torch.Tensor, draft_vocab_size: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """d2t [draft_vocab_size] int64 and t2d [target_vocab] bool from per-token counts.

    The draft vocabulary is the ``draft_vocab_size`` most frequent target ids (ties and unseen
    ids broken by the lower id), in ascending target-id order, so that draft id i means
    target id i + d2t[i].
    """
    target_vocab = token_counts.numel()
    if draft_vocab_size <= 0:
        raise BadInputError(f"draft_vocab_size must be positive, got {draft_vocab_size}")
    if draft_vocab_size > target_vocab:
        raise BadInputError(f"draft_vocab_size {draft_vocab_size} is larger than the target vocabulary "
                            f"({target_vocab} tokens)")
    # Stable descending sort by count keeps lower ids first among equals.
    order = torch.sort(token_counts.to(torch.int64), descending=True, stable=True).indices
    chosen = torch.sort(order[:draft_vocab_size]).values
    d2t = chosen - torch.arange(draft_vocab_size)
    t2d = torch.zeros(target_vocab, dtype=torch.bool)
    t2d[chosen] = True
    return d2t, t2d
