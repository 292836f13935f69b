"""The draft vocabulary: the most frequent target tokens, as EAGLE-3's d2t / t2d buffers."""

from __future__ import annotations

from typing import Sequence, Tuple

import torch

from ..errors import BadInputError


def trained_token_counts(examples: Sequence, vocab: int) -> torch.Tensor:
    """[vocab] int64: how often each target id is trained on (the loss-masked tokens of
    ``examples``, each with ``input_ids`` and a bool ``loss_mask``)."""
    counts = torch.zeros(vocab, dtype=torch.int64)
    for e in examples:
        counts += torch.bincount(e.input_ids[e.loss_mask], minlength=vocab)
    return counts


def most_frequent(counts: torch.Tensor, n: int) -> torch.Tensor:
    """Positions of the ``n`` largest ``counts``, the lower position first among equals, returned
    in ascending order (the draft vocabulary's order)."""
    order = torch.sort(counts.to(torch.int64), descending=True, stable=True).indices
    return torch.sort(order[:n]).values


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
    chosen = most_frequent(token_counts, draft_vocab_size)
    d2t = chosen - torch.arange(draft_vocab_size)
    t2d = torch.zeros(target_vocab, dtype=torch.bool)
    t2d[chosen] = True
    return d2t, t2d


def shrink_draft_vocab(draft, token_counts: torch.Tensor, draft_vocab_size: int):
    """Cuts a trained draft's vocabulary down to its ``draft_vocab_size`` most frequent tokens.

    ``token_counts`` [target vocab]: how often each target id occurs where the draft is trained
    (the assistant tokens of its training split, as ``eagle3 train`` counts them). The draft's
    own tokens are ranked by it (ties broken by the lower id), the lm_head keeps their rows, and
    d2t / t2d are rebuilt. Each kept token's logit is unchanged, so greedy drafting only loses the
    dropped tokens; the head a draft step reads shrinks in proportion. Counts that ``eagle3
    train`` would rank the same way give the vocabulary it would have chosen at this size.
    Returns the draft, changed in place.
    """
    current = draft.config.draft_vocab_size
    if not 0 < draft_vocab_size <= current:
        raise BadInputError(f"draft_vocab_size must be in [1, {current}] (the draft's vocabulary now), "
                            f"got {draft_vocab_size}")
    if token_counts.dim() != 1 or token_counts.numel() != draft.t2d.numel():
        raise BadInputError(f"token_counts must be a vector of the target vocabulary's {draft.t2d.numel()} "
                            f"counts, got shape {tuple(token_counts.shape)}")
    ids = torch.arange(current, device=draft.d2t.device) + draft.d2t            # the draft's target ids
    keep = most_frequent(token_counts.to(ids.device)[ids], draft_vocab_size)
    kept_ids = ids[keep]                                           # ascending: draft rows stay in id order
    head = draft.lm_head
    new_head = torch.nn.Linear(head.in_features, draft_vocab_size, bias=False,
                               device=head.weight.device, dtype=head.weight.dtype)
    with torch.no_grad():
        new_head.weight.copy_(head.weight[keep])
    draft.lm_head = new_head.requires_grad_(head.weight.requires_grad)
    draft.d2t = kept_ids - torch.arange(draft_vocab_size, device=ids.device)
    t2d = torch.zeros_like(draft.t2d)
    t2d[kept_ids] = True
    draft.t2d = t2d
    draft.config.draft_vocab_size = draft_vocab_size
    draft.check_vocab_mapping()
    return draft
