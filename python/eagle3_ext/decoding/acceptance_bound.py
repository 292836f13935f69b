"""The acceptance bound of a sampling round: how many tokens exact lossless verification of a
draft tree can keep, in expectation, given the target's distribution at every node.

A lossless verifier emits tokens distributed as the target's samples, and it can only keep a
draft token that equals the token emitted at that position. So with a tree whose tokens are
fixed before verification (the draft's top-k, as the generator drafts them), a node v is
accepted at most when the target's sample path starts with v's path, which happens with
probability

    P(v) = prod over the edges (u -> w) from the root to v of p_u(token_w)

where p_u is the target's (filtered) distribution at node u. The expected accepted length is
then at most 1 (the bonus token) + sum of P(v) over the non-root nodes, and per depth d the
sum of P(v) over the nodes at depth d. Siblings are assumed to hold distinct tokens (the tree
builder and the lookup graft guarantee it).

The target-only recursive rejection verifier (``tree.verify_sampling``, sgl-kernel's
``tree_speculative_sampling_target_only``) with thresholds 1.0 attains this bound: at each node
it accepts child i when one coin falls in the i-th slice of the children's cumulative target
probability, i.e. it samples the target and checks membership. Its mean acceptance length
over many rounds is the bound's mean (tests/test_acceptance_bound.py checks it by Monte
Carlo), so the ratio acceptance / bound measures the noise of a run, and the bound itself
what the tree can give: a better verifier needs a different tree (sampled draft tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .tree import DraftTree


@dataclass
class AcceptanceBound:
    """expected: float32 ``[bs]``, tokens per round (accepted drafts + the bonus token);
    per_depth: float32 ``[bs, depth]``, expected accepted draft tokens at depth d + 1;
    path_probs: float32 ``[bs, N]``, P(v) of every node (1 at the root, 0 at nodes no
    ``retrive_*`` list reaches)."""

    expected: torch.Tensor
    per_depth: torch.Tensor
    path_probs: torch.Tensor


def tree_parents(tree: DraftTree) -> torch.Tensor:
    """int64 ``[bs, N]``: each node's parent (local index), -1 for the root and for nodes that
    no ``retrive_next_token`` / ``retrive_next_sibling`` link reaches (graft padding).

    A first child's parent is the node whose ``retrive_next_token`` names it; a later sibling
    inherits its left sibling's parent, resolved along the sibling chains by pointer jumping
    (log2 N tensor steps, no per-node loop)."""
    first, sibling = tree.retrive_next_token.long(), tree.retrive_next_sibling.long()
    bs, n = first.shape
    nodes = torch.arange(n, device=first.device).expand(bs, n)
    owner = torch.full((bs, n + 1), -1, dtype=torch.long, device=first.device)  # column n: the -1 links
    left = owner.clone()
    owner.scatter_(1, torch.where(first >= 0, first, n), nodes)
    left.scatter_(1, torch.where(sibling >= 0, sibling, n), nodes)
    owner, left = owner[:, :n], left[:, :n]
    parent = owner
    hop = torch.where((owner < 0) & (left >= 0), left, nodes)  # first children and the root point to themselves
    for _ in range(_doubling_steps(n)):
        parent = torch.where(parent < 0, parent.gather(1, hop), parent)
        hop = hop.gather(1, hop)
    return parent


def acceptance_bound(tree: DraftTree, target_probs: torch.Tensor) -> AcceptanceBound:
    """The expected acceptance length of exact lossless verification of ``tree``.

    Args:
        tree: the round's DraftTree (``draft_tokens`` ``[bs, N]``, the ``retrive_*`` lists).
        target_probs: float ``[bs, N, V]``, the target's filtered distribution at every node, as
            passed to ``tree.verify_sampling``.

    Returns:
        AcceptanceBound; ``expected`` = 1 + ``per_depth.sum(-1)``.
    """
    bs, n = tree.draft_tokens.shape
    if target_probs.dim() != 3 or tuple(target_probs.shape[:2]) != (bs, n):
        raise ValueError(f"acceptance_bound: target_probs must be [bs, N, V] = [{bs}, {n}, V] for a tree of {bs} "
                         f"requests x {n} nodes, got {list(target_probs.shape)}")
    if not target_probs.is_floating_point():
        raise TypeError(f"acceptance_bound: target_probs must be floating point, got {target_probs.dtype}")
    vocab = target_probs.shape[2]
    parent = tree_parents(tree)
    nodes = torch.arange(n, device=parent.device).expand(bs, n)
    tokens = tree.draft_tokens.long().to(parent.device)
    # The edge into each node: p_parent(token), gathered from the flattened [bs, N * V] rows.
    flat = target_probs.float().reshape(bs, n * vocab)
    edge = flat.gather(1, parent.clamp(min=0) * vocab + tokens)
    is_root = nodes == 0
    edge = torch.where(is_root, 1.0, torch.where(parent >= 0, edge, 0.0))
    depth = (parent >= 0).long()
    # Prefix products (and depths) along the root paths by pointer jumping: the root and
    # unreached nodes point to themselves with the identity (1) or an absorbing 0.
    hop = torch.where(parent >= 0, parent, nodes)
    path = edge
    for _ in range(_doubling_steps(n)):
        path = path * path.gather(1, hop)
        depth = depth + depth.gather(1, hop)
        hop = hop.gather(1, hop)
    per_depth = torch.zeros(bs, tree.depth + 1, dtype=torch.float32, device=path.device)
    per_depth.scatter_add_(1, depth, torch.where(is_root, 0.0, path))
    per_depth = per_depth[:, 1:]
    return AcceptanceBound(expected=1.0 + per_depth.sum(-1), per_depth=per_depth, path_probs=path)


def _doubling_steps(n: int) -> int:
    """Pointer-jumping steps that resolve any chain of up to n nodes."""
    return max(1, math.ceil(math.log2(max(n, 2))))
