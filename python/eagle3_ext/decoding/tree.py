"""Draft trees for EAGLE-2 dynamic drafting, and their verification, on top of the tree ops.

The data flow of one speculative round:

1. ``expand_frontier`` once per draft step: turns the draft's top-k at every frontier node
   into the next frontier (the global top-k by cumulative probability) and records a
   ``DraftStep`` (scores, tokens, parents) for the tree.
2. ``build_draft_tree``: keeps the best ``num_draft_tokens - 1`` candidates of all steps
   (plus the root) and builds the tree with ``eagle3.build_tree_kernel_efficient``:
   a ``DraftTree`` with tokens, attention mask, positions and retrieve lists.
   With hybrid drafting, ``graft_chains`` then hangs each request's prompt-lookup chain
   under the deepest tree node that already matches it.
3. The target runs over ``DraftTree.draft_tokens`` with ``tree_mask`` and ``positions``.
4. ``verify_greedy``, ``verify_sampling`` or (for children drawn from the draft's
   distribution) ``verify_sampling_draft_probs`` walks the tree against the target's output
   and returns a ``VerifyResult``: the accepted tokens of every request (bonus token included).

The candidate numbering follows sgl-kernel's: step 0 has ``topk`` candidates (0..topk-1),
every later step ``topk * topk`` (the children of each frontier node), and a candidate's
parent frontier slot is ``candidate // topk``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch

from .. import ops


@dataclass
class DraftStep:
    """What one draft step adds to the tree (sgl-kernel's per-step tree_info).

    scores: ``[bs, 1, topk]`` (step 0) or ``[bs, topk, topk]``: cumulative probabilities of
        the step's candidates (frontier node x child), flattened in that order.
    tokens: ``[bs, topk]`` (step 0) or ``[bs, topk * topk]``: their token ids.
    parents: ``[bs, topk + 1]`` (step 0: -1, then 0..topk-1) or ``[bs, topk]``: the candidate
        index of each node of the new frontier, the parent slots of the next step.
    """

    scores: torch.Tensor
    tokens: torch.Tensor
    parents: torch.Tensor


@dataclass
class DraftTree:
    """One verification tree per request; N = number of draft tokens, root included.

    draft_tokens: int64 ``[bs, N]``, column 0 the root (last verified token).
    tree_mask: see ``eagle3_ext.ops.build_tree_kernel_efficient`` for the three layouts.
    positions: int64 ``[bs * N]``, prefix length + depth.
    retrive_index, retrive_next_token, retrive_next_sibling: int64 ``[bs, N]``.
    """

    draft_tokens: torch.Tensor
    tree_mask: torch.Tensor
    positions: torch.Tensor
    retrive_index: torch.Tensor
    retrive_next_token: torch.Tensor
    retrive_next_sibling: torch.Tensor
    topk: int
    depth: int
    tree_mask_mode: int

    @property
    def batch_size(self) -> int:
        return self.draft_tokens.shape[0]

    @property
    def num_draft_tokens(self) -> int:
        return self.draft_tokens.shape[1]


@dataclass
class VerifyResult:
    """accepted_tokens[b]: the tokens request b emits this round (accepted drafts + bonus).

    accept_index: int32 ``[bs, depth + 1]``, global node indices (root first, -1 padded).
    accept_length: int32 ``[bs]``, accepted draft tokens (without the bonus).
    predicts: int32 ``[bs * N]``, the token emitted after each accepted node.
    """

    accepted_tokens: List[List[int]]
    accept_index: torch.Tensor
    accept_length: torch.Tensor
    predicts: torch.Tensor


def expand_frontier(
    step: int, topk_probs: torch.Tensor, topk_tokens: torch.Tensor,
    frontier_scores: Optional[torch.Tensor],
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, DraftStep]:
    """One EAGLE-2 expansion step.

    Args:
        step: 0 for the first draft step (from the root), then 1, 2, ...
        topk_probs, topk_tokens: the draft's top-k at each frontier node: ``[bs, topk]`` at
            step 0, ``[bs * topk, topk]`` (or ``[bs, topk, topk]``) afterwards.
        frontier_scores: ``[bs, topk]`` cumulative probabilities of the frontier (None at 0).

    Returns:
        (next_tokens ``[bs, topk]``: the new frontier's tokens, feed them to the draft;
        next_scores ``[bs, topk]``; source ``[bs, topk]``: the frontier slot (0..topk-1) each
        new frontier node came from, to gather the draft's hidden states; the DraftStep).
    """
    topk = topk_probs.shape[-1]
    bs = topk_probs.numel() // (topk if step == 0 else topk * topk)
    if step == 0:
        parents = torch.arange(-1, topk, device=topk_probs.device).expand(bs, topk + 1)
        source = torch.zeros(bs, topk, dtype=torch.long, device=topk_probs.device)
        return topk_tokens, topk_probs, source, DraftStep(topk_probs.unsqueeze(1), topk_tokens, parents)
    expanded = frontier_scores.unsqueeze(2) * topk_probs.reshape(bs, topk, topk)
    next_scores, chosen = torch.topk(expanded.flatten(1), topk, dim=-1)
    tokens = topk_tokens.reshape(bs, topk * topk)
    next_tokens = torch.gather(tokens, 1, chosen)
    parents = chosen + (topk * topk * (step - 1) + topk)
    return next_tokens, next_scores, chosen // topk, DraftStep(expanded, tokens, parents)


def build_draft_tree(
    verified_tokens: torch.Tensor, seq_lens: torch.Tensor, steps: Sequence[DraftStep],
    num_draft_tokens: int, tree_mask_mode: int = 1,
) -> DraftTree:
    """Keep the best ``num_draft_tokens - 1`` candidates of all steps and build the tree.

    Args:
        verified_tokens: int64 ``[bs]``, the last verified token (the root) of each request.
        seq_lens: int64 ``[bs]``, verified prefix lengths (the root sits at seq_len).
        steps: the DraftStep of every draft step, in order; depth = len(steps).
        num_draft_tokens: N, root included; at most 1 + the number of candidates.
        tree_mask_mode: 0 full mask, 1 draft columns only, 2 bit-packed (N <= 32).
    """
    depth = len(steps)
    topk = steps[0].tokens.shape[1]
    bs = verified_tokens.shape[0]
    n = num_draft_tokens
    device = verified_tokens.device
    scores = torch.cat([s.scores.flatten(1) for s in steps], dim=1)
    tokens = torch.cat([s.tokens for s in steps], dim=1)
    if n - 1 > scores.shape[1]:
        raise ValueError(f"num_draft_tokens - 1 = {n - 1} exceeds the {scores.shape[1]} drafted candidates")
    selected = torch.sort(torch.topk(scores, n - 1, dim=-1).indices).values
    draft = torch.cat([verified_tokens.long().unsqueeze(1), torch.gather(tokens, 1, selected)], dim=1)
    if depth > 1:
        parent_list = torch.cat([s.parents for s in steps[:-1]], dim=1).long()
    else:
        parent_list = torch.empty(bs, 0, dtype=torch.long, device=device)

    seq_lens = seq_lens.to(device=device, dtype=torch.long)
    if tree_mask_mode == 0:
        tree_mask = torch.ones(int(seq_lens.sum()) * n + bs * n * n, dtype=torch.bool, device=device)
    elif tree_mask_mode == 1:
        tree_mask = torch.ones(bs * n * n, dtype=torch.bool, device=device)
    else:
        dtype = torch.uint8 if n <= 8 else (torch.int16 if n <= 16 else torch.int32)
        tree_mask = torch.zeros(bs * n, dtype=dtype, device=device)
    positions = torch.empty(bs * n, dtype=torch.long, device=device)
    retrive = [torch.full((bs, n), -1, dtype=torch.long, device=device) for _ in range(3)]
    ops.build_tree_kernel_efficient(
        parent_list, selected.long(), seq_lens, tree_mask, positions, *retrive,
        topk, depth, n, tree_mask_mode,
    )
    return DraftTree(draft, tree_mask, positions, *retrive, topk=topk, depth=depth,
                     tree_mask_mode=tree_mask_mode)


def graft_chains(tree: DraftTree, chains: Sequence[Sequence[int]], budgets: Sequence[int]) -> Tuple[DraftTree,
                                                                                                     List[List[int]]]:
    """The tree with a token chain per request grafted on (hybrid drafting: a prompt-lookup
    continuation of the root).

    ``chains[b]`` continues request b's root. The part of it the tree already holds (a path of
    matching tokens from the root) is shared; at most ``budgets[b]`` further tokens are added as
    new nodes under the deepest shared node. Requests that add fewer nodes than the longest
    addition get padding nodes that attend only to the root and themselves and that no
    ``retrive_*`` list reaches, so they are never accepted. Needs tree_mask_mode 1.

    Returns (the new tree, per request the chain as placed: shared part plus added nodes).
    """
    if tree.tree_mask_mode != 1:
        raise ValueError(f"graft_chains needs tree_mask_mode 1, got {tree.tree_mask_mode}")
    bs, n = tree.batch_size, tree.num_draft_tokens
    tokens = tree.draft_tokens.tolist()
    first_child = tree.retrive_next_token.tolist()
    sibling = tree.retrive_next_sibling.tolist()
    attach, added, placed = [], [], []
    for b in range(bs):
        chain, node, shared = list(chains[b]), 0, 0
        while shared < len(chain):  # follow the chain down the tree while its tokens are there
            child = first_child[b][node]
            while child != -1 and tokens[b][child] != chain[shared]:
                child = sibling[b][child]
            if child == -1:
                break
            node, shared = child, shared + 1
        attach.append(node)
        added.append(chain[shared:shared + max(0, budgets[b])])
        placed.append(chain[:shared + len(added[-1])])
    extra = max(len(a) for a in added)
    if extra == 0:
        return tree, placed
    m = n + extra
    device = tree.draft_tokens.device
    old_mask = tree.tree_mask.view(bs, n, n)
    old_pos = tree.positions.view(bs, n)
    mask = torch.zeros(bs, m, m, dtype=torch.bool, device=device)
    mask[:, :n, :n] = old_mask
    mask[:, n:, 0] = True
    idx = torch.arange(n, m, device=device)
    mask[:, idx, idx] = True                                   # every added node sees itself
    positions = torch.cat([old_pos, (old_pos[:, :1] + 1).expand(bs, extra)], dim=1)  # cat: a new tensor
    new_tokens = torch.cat([tree.draft_tokens, tree.draft_tokens[:, :1].expand(bs, extra)], dim=1)
    next_token = torch.full((bs, m), -1, dtype=torch.long)
    next_sibling = torch.full((bs, m), -1, dtype=torch.long)
    next_token[:, :n] = torch.tensor(first_child)
    next_sibling[:, :n] = torch.tensor(sibling)
    depth = tree.depth
    for b in range(bs):
        k = len(added[b])
        if k == 0:
            continue
        a = attach[b]
        rows = torch.arange(n, n + k, device=device)
        mask[b, rows, :n] = old_mask[b, a]                     # the attach node's ancestors and itself
        mask[b, n:n + k, n:n + k] = torch.ones(k, k, dtype=torch.bool, device=device).tril()
        positions[b, n:n + k] = old_pos[b, a] + 1 + torch.arange(k, device=device)
        new_tokens[b, n:n + k] = torch.tensor(added[b], device=device)
        if first_child[b][a] == -1:                            # the chain's first node: a's last child
            next_token[b, a] = n
        else:
            last = first_child[b][a]
            while sibling[b][last] != -1:
                last = sibling[b][last]
            next_sibling[b, last] = n
        next_token[b, n:n + k - 1] = torch.arange(n + 1, n + k)
        depth = max(depth, int(old_pos[b, a] - old_pos[b, 0]) + k)
    index = torch.arange(bs * m, device=device).view(bs, m)
    return DraftTree(new_tokens, mask.flatten(), positions.flatten(), index, next_token.to(device),
                     next_sibling.to(device), topk=tree.topk, depth=depth, tree_mask_mode=1), placed


def _outputs(tree: DraftTree) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    bs, n, device = tree.batch_size, tree.num_draft_tokens, tree.draft_tokens.device
    predicts = torch.full((bs * n,), -1, dtype=torch.int32, device=device)
    accept_index = torch.full((bs, tree.depth + 1), -1, dtype=torch.int32, device=device)
    accept_length = torch.zeros(bs, dtype=torch.int32, device=device)
    return predicts, accept_index, accept_length


def _result(predicts, accept_index, accept_length) -> VerifyResult:
    index = accept_index.cpu().tolist()
    pred = predicts.cpu().tolist()
    accepted = [[pred[g] for g in row if g >= 0] for row in index]
    return VerifyResult(accepted, accept_index, accept_length, predicts)


def verify_greedy(tree: DraftTree, target_predict: torch.Tensor) -> VerifyResult:
    """Greedy verification. target_predict: int64 ``[bs, N]``, the target's argmax per node."""
    predicts, accept_index, accept_length = _outputs(tree)
    ops.verify_tree_greedy(
        predicts, accept_index, accept_length, tree.draft_tokens, tree.retrive_index,
        tree.retrive_next_token, tree.retrive_next_sibling, target_predict.long(),
    )
    return _result(predicts, accept_index, accept_length)


def verify_sampling(
    tree: DraftTree, target_probs: torch.Tensor, generator: Optional[torch.Generator] = None,
    threshold_single: float = 1.0, threshold_acc: float = 1.0, deterministic: bool = True,
) -> VerifyResult:
    """Lossless verification by rejection sampling (thresholds 1.0 keep it exact).

    target_probs: float32 ``[bs, N, V]``, the target's (temperature-scaled) distribution at
    every node. Coins are drawn from ``generator`` on the tensors' device.
    """
    bs, n, device = tree.batch_size, tree.num_draft_tokens, target_probs.device
    predicts, accept_index, accept_length = _outputs(tree)
    coins = torch.rand(bs, n, generator=generator, device=device)
    final_coins = torch.rand(bs, generator=generator, device=device)
    draft_probs = torch.zeros_like(target_probs, dtype=torch.float32)
    ops.tree_speculative_sampling_target_only(
        predicts, accept_index, accept_length, tree.draft_tokens, tree.retrive_index,
        tree.retrive_next_token, tree.retrive_next_sibling, coins, final_coins,
        target_probs.float().contiguous(), draft_probs, threshold_single, threshold_acc, deterministic,
    )
    return _result(predicts, accept_index, accept_length)


def verify_sampling_draft_probs(
    tree: DraftTree, target_probs: torch.Tensor, draft_probs: torch.Tensor,
    generator: Optional[torch.Generator] = None, deterministic: bool = True,
) -> VerifyResult:
    """Lossless verification with the draft's probabilities (recursive rejection sampling with
    p/q acceptance and residuals, ``eagle3.tree_speculative_sampling_draft_probs``).

    The children of node i must have been drawn i.i.d. (with replacement) from
    ``draft_probs[:, i]``; the emitted tokens then follow the target exactly, whatever the draft.
    target_probs, draft_probs: ``[bs, N, V]``, the target's (temperature-scaled) distribution
    and the draft's proposal distribution at every node. Coins are drawn from ``generator``
    on the tensors' device.
    """
    bs, n, device = tree.batch_size, tree.num_draft_tokens, target_probs.device
    predicts, accept_index, accept_length = _outputs(tree)
    coins = torch.rand(bs, n, generator=generator, device=device)
    final_coins = torch.rand(bs, generator=generator, device=device)
    ops.tree_speculative_sampling_draft_probs(
        predicts, accept_index, accept_length, tree.draft_tokens, tree.retrive_index,
        tree.retrive_next_token, tree.retrive_next_sibling, coins, final_coins,
        target_probs.float().contiguous(), draft_probs.float().contiguous(), deterministic,
    )
    return _result(predicts, accept_index, accept_length)
