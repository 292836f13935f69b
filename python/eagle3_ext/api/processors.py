"""Logits processors applied to the target's distribution at every tree node, so that greedy and
sampling verification stay exact for the processed distribution.

Hugging Face calls a processor with ``(input_ids [n, L], scores [n, V])`` for the next token
after ``input_ids``. At a tree node that history is the request's prompt, its tokens emitted
so far and the node's root-to-node path: nodes of one request at one depth share a length and
are processed together. ``min_new_tokens`` bans the EOS tokens at every node whose next token
would be one of the first ``min_new_tokens`` new tokens, as Hugging Face's
MinNewTokensLengthLogitsProcessor does.
"""

from __future__ import annotations

from typing import List, Sequence

import torch


def _ban(scores: torch.Tensor, ids: Sequence[int]) -> torch.Tensor:
    scores = scores.clone()
    scores[..., list(ids)] = float("-inf")
    return scores


def process_next(logits: torch.Tensor, histories: List[List[int]], processors, min_new_tokens: int,
                 new_counts: Sequence[int], eos: Sequence[int]) -> torch.Tensor:
    """Processed fp32 logits [B, V] for the token after each history (the prefill's last
    position); ``new_counts[b]`` new tokens precede it."""
    scores = logits.float()
    if processors:
        for b, history in enumerate(histories):
            ids = torch.tensor([history], dtype=torch.long, device=logits.device)
            scores[b:b + 1] = processors(ids, scores[b:b + 1])
    if min_new_tokens and eos:
        banned = torch.tensor([n < min_new_tokens for n in new_counts], device=logits.device)
        if bool(banned.any()):
            scores[banned] = _ban(scores[banned], eos)
    return scores


def process_tree(logits: torch.Tensor, tree_tokens: torch.Tensor, tree_mask: torch.Tensor,
                 depths: torch.Tensor, histories: List[List[int]], processors, min_new_tokens: int,
                 new_counts: Sequence[int], eos: Sequence[int]) -> torch.Tensor:
    """Processed fp32 logits [B, N, V] of a verify forward. tree_tokens [B, N]; tree_mask
    [B, N, N] (ancestors and self); depths [B, N]; histories[b]: prompt + emitted tokens of
    request b (its last one is the root, node 0)."""
    scores = logits.float()
    b_count, n = tree_tokens.shape
    if processors:
        tokens = tree_tokens.tolist()
        masks = tree_mask.tolist()
        depth_rows = depths.tolist()
        for b in range(b_count):
            by_depth = {}
            for i in range(n):
                by_depth.setdefault(depth_rows[b][i], []).append(i)
            for d, nodes in by_depth.items():
                rows = []
                for i in nodes:  # the path below the root, ordered by depth
                    path = sorted((depth_rows[b][j], j) for j in range(n) if masks[b][i][j] and j != 0)
                    rows.append(histories[b] + [tokens[b][j] for _, j in path])
                ids = torch.tensor(rows, dtype=torch.long, device=logits.device)
                index = torch.tensor(nodes, device=logits.device)
                scores[b, index] = processors(ids, scores[b, index])
    if min_new_tokens and eos:
        # Node at depth d predicts new token number new_counts[b] + d + 1.
        counts = torch.tensor(list(new_counts), device=logits.device)[:, None] + depths
        banned = counts < min_new_tokens
        if bool(banned.any()):
            scores[banned] = _ban(scores[banned], eos)
    return scores
