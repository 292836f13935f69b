"""Draft a tree: EAGLE-2 dynamic expansion with the EAGLE-3 draft head.

Round structure (per request b, ``seq_len[b]`` tokens committed in both KV caches, the root
being the last emitted token, not yet seen by the target):

1. ``extend``: the draft reads the pairs (target feature at position j, token j + 1) that the
   last verification produced and commits them (its committed length then equals the
   target's); the last pair, (feature of the last committed position, root), gives the logits
   of the depth-1 candidates and the feature for the next step.
2. Each further step feeds the current frontier (top-k nodes by cumulative probability, with
   the draft's hidden state of their parent) back into the draft, each node seeing its
   ancestors through a tree mask; ``expand_frontier`` records the candidates.
3. ``build_tree`` keeps the best ``num_draft_tokens - 1`` candidates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch

from ..draft import Eagle3DraftModel
from ..draft.cache import DraftKVCache
from ..tree import DraftStep, DraftTree, build_draft_tree, expand_frontier
from .config import TreeConfig


@dataclass
class DraftInputs:
    """The pairs a round's extend step commits, padded to the longest request.

    features [B, n, H_draft] (already through fc), tokens [B, n] (target ids), positions
    [B, n], counts [B] (real pairs per request; the last real one is the root pair).
    """

    features: torch.Tensor
    tokens: torch.Tensor
    positions: torch.Tensor
    counts: torch.Tensor


def draft_cache_capacity(tree: TreeConfig, longest_prompt: int, most_new: int) -> int:
    """Positions the draft's cache is allocated with: committed pairs (which may overshoot the
    limit by one round's accepted tokens, lookup chain included) plus the depth * topk
    uncommitted ones a round's draft steps add."""
    return longest_prompt + most_new + 2 * (tree.depth + 1 + tree.lookup_tokens) + tree.depth * tree.topk + 8


def _topk(draft: Eagle3DraftModel, logits: torch.Tensor, k: int):
    probs = logits.float().softmax(-1)
    p, ids = torch.topk(probs, k, dim=-1)
    return p, draft.draft_to_target(ids)


def extend(draft: Eagle3DraftModel, cache: DraftKVCache, inputs: DraftInputs):
    """Commits the pairs; returns (logits [B, Vd], hidden [B, H]) of each request's root pair."""
    out = draft(inputs.tokens, inputs.features, inputs.positions, cache=cache)
    b = inputs.tokens.shape[0]
    n = inputs.tokens.shape[1]
    cache.keep(torch.arange(n, device=inputs.tokens.device).expand(b, n), inputs.counts)
    last = (inputs.counts - 1).clamp(min=0)
    rows = torch.arange(b, device=last.device)
    return out.logits[rows, last], out.hidden[rows, last]


def draft_steps(draft: Eagle3DraftModel, cache: DraftKVCache, root_logits: torch.Tensor,
                root_hidden: torch.Tensor, seq_lens: torch.Tensor, tree: TreeConfig) -> List[DraftStep]:
    """Runs depth - 1 tree steps after ``extend``; returns every step's candidates.

    seq_lens [B]: committed lengths (the root's position). The tree tokens stay uncommitted in
    ``cache``; the caller rolls them back after verifying.
    """
    b = root_logits.shape[0]
    k = tree.topk
    device = root_logits.device
    probs, tokens = _topk(draft, root_logits, k)                       # [B, k]
    frontier_tokens, scores, _, step = expand_frontier(0, probs, tokens, None)
    steps: List[DraftStep] = [step]
    parent_hidden = root_hidden[:, None, :].expand(b, k, root_hidden.shape[-1])
    ancestors = torch.zeros(b, k, 0, dtype=torch.bool, device=device)  # over uncommitted tokens
    for depth in range(1, tree.depth):
        tree_len = cache.tree_len
        eye = torch.eye(k, dtype=torch.bool, device=device).expand(b, k, k)
        mask = torch.cat([ancestors, eye], dim=-1)                      # [B, k, tree_len + k]
        positions = (seq_lens + depth - 1)[:, None].expand(b, k)
        out = draft(frontier_tokens, parent_hidden, positions, cache=cache, tree_mask=mask)
        probs, tokens = _topk(draft, out.logits, k)                     # [B, k, k]
        frontier_tokens, scores, source, step = expand_frontier(depth, probs, tokens, scores)
        steps.append(step)
        gather = source[..., None]
        parent_hidden = torch.gather(out.hidden, 1, gather.expand(b, k, out.hidden.shape[-1]))
        ancestors = torch.gather(mask, 1, gather.expand(b, k, tree_len + k))
    return steps


def build_tree(roots: torch.Tensor, seq_lens: torch.Tensor, steps: List[DraftStep], num_nodes: int) -> DraftTree:
    """Keeps the best num_nodes - 1 candidates under the roots [B] (eagle3 op)."""
    return build_draft_tree(roots, seq_lens, steps, num_nodes, tree_mask_mode=1)


def candidate_scores(steps: List[DraftStep], count: int) -> List[List[float]]:
    """Per request, the ``count`` best candidates' scores (cumulative draft probabilities),
    descending: the ranking build_tree keeps."""
    scores = torch.cat([s.scores.flatten(1) for s in steps], dim=1)
    return torch.topk(scores.float(), min(count, scores.shape[1]), dim=-1).values.tolist()
