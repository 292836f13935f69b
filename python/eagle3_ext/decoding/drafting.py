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
from typing import Callable, List, Optional, Tuple

import torch

from ..api.config import SamplingConfig, TreeConfig, filtered_probs
from ..draft import Eagle3DraftModel
from ..draft.cache import DraftKVCache
from ..linear import float32_gemms
from .tree import DraftStep, DraftTree, build_draft_tree, expand_frontier


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


class DraftSampler:
    """Draws each draft token from the draft's distribution, filtered as the target's is, and
    keeps those distributions by depth: the ``q`` of the draft-probability verifier.

    The round's randomness is drawn up front (``noise``: one uniform per depth, request and
    draft-vocabulary entry), and a token is the argmax of q / -log(u), an exact draw from q
    (the exponential race); so the draft loop takes no generator and compiles into one graph."""

    def __init__(self, draft: Eagle3DraftModel, sampling: SamplingConfig, rng: torch.Generator,
                 batch_size: int, depth: int):
        self.draft, self.sampling = draft, sampling
        vocab = draft.config.draft_vocab_size
        self.noise = torch.rand(depth, batch_size, vocab, generator=rng, device=rng.device)
        self.rows: List[torch.Tensor] = []   # per depth, [B, Vd]

    def __call__(self, logits: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(q of the drawn token, its target id), one draw per row: [B, 1] for logits [B, Vd],
        [B, 1, 1] for [B, 1, Vd] (the shapes ``_topk`` returns with k = 1)."""
        q = filtered_probs(logits, self.sampling)
        # u in [0, 1): -log(u) in (0, inf], so a token with q > 0 scores q / E > 0 and one with q = 0 never wins.
        race = q / -torch.log(self.noise[len(self.rows)].view(q.shape))
        ids = race.argmax(-1, keepdim=True)
        self.rows.append(q.reshape(q.shape[0], -1))
        return q.gather(-1, ids), self.draft.draft_to_target(ids)

    def draft_probs(self, depths: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """[B, N, V]: row j is the distribution node j's child was drawn from (node depths
        [B, N]; a leaf's row is never read), over the target vocabulary."""
        by_depth = torch.stack(self.rows, dim=1)                           # [B, depth, Vd]
        index = depths.clamp(max=len(self.rows) - 1).long()
        rows = torch.gather(by_depth, 1, index[..., None].expand(*index.shape, by_depth.shape[-1]))
        out = rows.new_zeros(*index.shape, vocab_size)
        target_ids = torch.arange(rows.shape[-1], device=rows.device) + self.draft.d2t
        return out.index_copy_(-1, target_ids, rows)


def extend(draft: Eagle3DraftModel, cache: DraftKVCache, inputs: DraftInputs):
    """Commits the pairs; returns (logits [B, Vd], hidden [B, H]) of each request's root pair."""
    b, n = inputs.tokens.shape
    last = (inputs.counts - 1).clamp(min=0)
    out = draft(inputs.tokens, inputs.features, inputs.positions, cache=cache, output_index=last)
    cache.keep(torch.arange(n, device=inputs.tokens.device).expand(b, n), inputs.counts)
    return out.logits[:, 0], out.hidden[:, 0]


def extend_eager(draft: Eagle3DraftModel, cache: DraftKVCache, inputs: DraftInputs):
    """``extend`` outside a graph; many pairs (the prompt's) multiply in float32 where the draft's
    half precision has no native GEMM (linear.py)."""
    with float32_gemms(draft.fc.weight.device, draft.fc.weight.dtype, inputs.tokens.numel()):
        return extend(draft, cache, inputs)


def draft_steps(draft: Eagle3DraftModel, cache: DraftKVCache, root_logits: torch.Tensor,
                root_hidden: torch.Tensor, seq_lens: torch.Tensor, tree: TreeConfig,
                sampler: Optional[Callable] = None) -> List[DraftStep]:
    """Runs depth - 1 tree steps after ``extend``; returns every step's candidates.

    seq_lens [B]: committed lengths (the root's position). The tree tokens stay uncommitted in
    ``cache``; the caller rolls them back after verifying. ``sampler`` (a DraftSampler, for a
    sampled chain) draws the tokens instead of taking the draft's top-k.
    """
    b = root_logits.shape[0]
    k = tree.topk
    device = root_logits.device
    pick = sampler if sampler is not None else (lambda logits: _topk(draft, logits, k))
    probs, tokens = pick(root_logits)                                   # [B, k]
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
        probs, tokens = pick(out.logits)                                # [B, k, k]
        frontier_tokens, scores, source, step = expand_frontier(depth, probs, tokens, scores)
        steps.append(step)
        gather = source[..., None]
        parent_hidden = torch.gather(out.hidden, 1, gather.expand(b, k, out.hidden.shape[-1]))
        ancestors = torch.gather(mask, 1, gather.expand(b, k, tree_len + k))
    return steps


def extend_and_steps(draft: Eagle3DraftModel, cache: DraftKVCache, inputs: DraftInputs, seq_lens: torch.Tensor,
                     tree: TreeConfig, sampler: Optional[Callable] = None) -> List[DraftStep]:
    """A round's whole draft side: ``extend`` (commit the pairs), then ``draft_steps`` from each
    request's root pair."""
    root_logits, root_hidden = extend(draft, cache, inputs)
    return draft_steps(draft, cache, root_logits, root_hidden, seq_lens, tree, sampler)


def build_tree(roots: torch.Tensor, seq_lens: torch.Tensor, steps: List[DraftStep], num_nodes: int) -> DraftTree:
    """Keeps the best num_nodes - 1 candidates under the roots [B] (eagle3 op)."""
    return build_draft_tree(roots, seq_lens, steps, num_nodes, tree_mask_mode=1)


def candidate_scores(steps: List[DraftStep], count: int) -> List[List[float]]:
    """Per request, the ``count`` best candidates' scores (cumulative draft probabilities),
    descending: the ranking build_tree keeps."""
    scores = torch.cat([s.scores.flatten(1) for s in steps], dim=1)
    return torch.topk(scores.float(), min(count, scores.shape[1]), dim=-1).values.tolist()
