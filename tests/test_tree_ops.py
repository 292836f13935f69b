"""Tests of build_tree_kernel_efficient, verify_tree_greedy and
tree_speculative_sampling_target_only: hand-worked trees, random trees against the
reference, edge cases (chains, N = 1, all rejected, all accepted), opcheck, every error
path, and a statistical losslessness test for sampling with a negative control."""

import math
import os
import re
import subprocess
import sys
import threading

import pytest
import torch

from conftest import DEVICES, op_error
from eagle3_ext import _C, ops, reference
from eagle3_ext.decoding import tree
from eagle3_ext.ops import (
    build_tree_kernel_efficient,
    tree_speculative_sampling_target_only,
    verify_tree_greedy,
)

MODES = [pytest.param(m, id=f"mode{m}") for m in (0, 1, 2)]

# --- helpers --------------------------------------------------------------------------------


def build_outputs(seq_lens, n, mode, device, mask_fill=True):
    """Outputs as sglang allocates them: mask ones (modes 0/1) or zeros (mode 2), lists -1."""
    bs = len(seq_lens)
    if mode == 0:
        mask = torch.full((sum(seq_lens) * n + bs * n * n,), mask_fill, dtype=torch.bool)
    elif mode == 1:
        mask = torch.full((bs * n * n,), mask_fill, dtype=torch.bool)
    else:
        mask = torch.zeros(bs * n, dtype=torch.uint8 if n <= 8 else (torch.int16 if n <= 16 else torch.int32))
    positions = torch.empty(bs * n, dtype=torch.long)
    lists = [torch.full((bs, n), -1, dtype=torch.long) for _ in range(3)]
    return [t.to(device) for t in (mask, positions, *lists)]


def run_build(fn, parent_list, selected, seq_lens, topk, depth, n, mode, device, mask_fill=True):
    outs = build_outputs(seq_lens, n, mode, device, mask_fill)
    fn(parent_list.to(device), selected.to(device), torch.tensor(seq_lens, device=device), *outs,
       topk, depth, n, mode)
    return [t.cpu() for t in outs]


def mask_rows(mask, seq_lens, n, mode):
    """The [N, N] draft-column block of every request, as a bool tensor [bs, N, N]."""
    rows = []
    if mode == 2:
        nbytes = 1 if n <= 8 else (2 if n <= 16 else 4)
        raw = mask.view(torch.uint8).reshape(-1, nbytes).long()
        bits = sum(raw[:, k] << (8 * k) for k in range(nbytes))
        cols = torch.arange(n)
        return ((bits.unsqueeze(1) >> cols) & 1).bool().reshape(len(seq_lens), n, n)
    start = 0
    for s in seq_lens:
        prefix = s if mode == 0 else 0
        block = mask[start : start + n * (prefix + n)].reshape(n, prefix + n)
        rows.append(block[:, prefix:])
        start += n * (prefix + n)
    return torch.stack(rows)


def random_draft_steps(bs, topk, depth, seed, vocab=50):
    """EAGLE-2 draft steps from random draft distributions (tree.expand_frontier)."""
    g = torch.Generator().manual_seed(seed)
    steps, scores = [], None
    for step in range(depth):
        rows = bs if step == 0 else bs * topk
        probs = torch.softmax(torch.randn(rows, vocab, generator=g) * 2, -1)
        p, t = torch.topk(probs, topk, dim=-1)
        _, scores, _, info = tree.expand_frontier(step, p, t, scores)
        steps.append(info)
    return steps


def tree_inputs(steps, n):
    """parent_list and selected_index as build_draft_tree computes them."""
    scores = torch.cat([s.scores.flatten(1) for s in steps], dim=1)
    selected = torch.sort(torch.topk(scores, n - 1, dim=-1).indices).values
    bs = scores.shape[0]
    if len(steps) > 1:
        parent_list = torch.cat([s.parents for s in steps[:-1]], dim=1).long()
    else:
        parent_list = torch.empty(bs, 0, dtype=torch.long)
    return parent_list, selected


def verify_outputs(bs, n, steps, device):
    return (
        torch.full((bs * n,), -1, dtype=torch.int32, device=device),
        torch.full((bs, steps), -1, dtype=torch.int32, device=device),
        torch.zeros(bs, dtype=torch.int32, device=device),
    )


# --- the hand-built tree: bs = 2, topk = 4, depth = 4, N = 8 --------------------------------
#
# Candidates: step 0 are 0..3 (children of the root), step s >= 1 are 4 + 16 (s - 1) + ...;
# candidate c hangs under frontier slot c // 4 and parent_list[b, slot] names the candidate
# that slot holds.
#
# request 0 (seq_len 10)                 request 1 (seq_len 5)
#   0 root                                 0 root
#   +- 1 (cand 0)                          +- 1 (cand 0)
#   |  +- 3 (cand 4) - 6 (cand 20) - 7     +- 2 (cand 1)
#   |  |                   (cand 36)       |  +- 4 (cand 8) - 7 (cand 24)
#   |  +- 4 (cand 5)                       |  +- 5 (cand 9)
#   +- 2 (cand 1)                          +- 3 (cand 2)
#      +- 5 (cand 8)                          +- 6 (cand 12)
HAND = dict(
    parent_list=torch.tensor([[-1, 0, 1, 2, 3, 4, 8, 9, 10, 20, 21, 22, 23],
                              [-1, 0, 1, 2, 3, 9, 8, 12, 13, 20, 21, 22, 23]]),
    selected=torch.tensor([[0, 1, 4, 5, 8, 20, 36], [0, 1, 2, 8, 9, 12, 24]]),
    seq_lens=[10, 5],
    positions=[10, 11, 11, 12, 12, 12, 13, 14, 5, 6, 6, 6, 7, 7, 7, 8],
    next_token=[[1, 3, 5, 6, -1, -1, 7, -1], [1, -1, 4, 6, 7, -1, -1, -1]],
    next_sibling=[[-1, 2, -1, 4, -1, -1, -1, -1], [-1, 2, 3, -1, 5, -1, -1, -1]],
    # visible draft columns (root = 0) of each node: itself and its ancestors
    visible=[[{0}, {0, 1}, {0, 2}, {0, 1, 3}, {0, 1, 4}, {0, 2, 5}, {0, 1, 3, 6}, {0, 1, 3, 6, 7}],
             [{0}, {0, 1}, {0, 2}, {0, 3}, {0, 2, 4}, {0, 2, 5}, {0, 3, 6}, {0, 2, 4, 7}]],
    packed=[1, 3, 5, 11, 19, 37, 75, 203, 1, 3, 5, 9, 21, 37, 73, 149],
)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", MODES)
def test_build_hand_tree(device, mode):
    h = HAND
    mask, positions, index, next_token, next_sibling = run_build(
        build_tree_kernel_efficient, h["parent_list"], h["selected"], h["seq_lens"], 4, 4, 8, mode,
        device)
    assert positions.tolist() == h["positions"]
    assert index.tolist() == [list(range(8)), list(range(8, 16))]
    assert next_token.tolist() == h["next_token"]
    assert next_sibling.tolist() == h["next_sibling"]
    expected = torch.tensor([[[j in vis for j in range(8)] for vis in req] for req in h["visible"]])
    assert torch.equal(mask_rows(mask, h["seq_lens"], 8, mode), expected)
    if mode == 2:
        assert mask.tolist() == h["packed"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fill", [True, False], ids=["prefix-true", "prefix-false"])
def test_build_full_mask_leaves_prefix_columns(device, fill):
    h = HAND
    mask = run_build(build_tree_kernel_efficient, h["parent_list"], h["selected"], h["seq_lens"],
                     4, 4, 8, 0, device, mask_fill=fill)[0]
    first = mask[: 8 * 18].reshape(8, 18)
    second = mask[8 * 18:].reshape(8, 13)
    assert (first[:, :10] == fill).all() and (second[:, :5] == fill).all()
    assert first[:, 10].all() and second[:, 5].all()  # root column


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "bs, topk, depth, n",
    [(1, 4, 4, 8), (3, 4, 5, 16), (5, 8, 6, 32), (2, 8, 8, 64), (4, 1, 6, 7), (3, 2, 1, 3), (2, 3, 3, 1)],
    ids=["bs1-N8", "bs3-N16", "bs5-N32", "bs2-N64", "chain-topk1", "depth1", "N1"],
)
def test_build_random_trees_match_reference(device, mode, bs, topk, depth, n):
    if mode == 2 and n > 32:
        pytest.skip("tree_mask_mode 2 packs at most 32 nodes")
    steps = random_draft_steps(bs, topk, depth, seed=bs * 100 + n)
    parent_list, selected = tree_inputs(steps, n)
    seq_lens = [7 * b + 3 for b in range(bs)]
    got = run_build(build_tree_kernel_efficient, parent_list, selected, seq_lens, topk, depth, n, mode, device)
    want = run_build(reference.build_tree_kernel_efficient, parent_list, selected, seq_lens, topk, depth, n,
                     mode, "cpu")
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_build_accepts_2d_positions():
    # sgl-kernel indexes positions flat, and some engines pass them as [bs, N].
    args = build_args(positions=torch.empty(2, 8, dtype=torch.long))
    build_tree_kernel_efficient(**args)
    assert args["positions"].flatten().tolist() == HAND["positions"]


def test_build_chain_hand():
    # topk = 1: every candidate extends the previous one, the tree is a chain.
    steps = random_draft_steps(2, 1, 5, seed=3)
    parent_list, selected = tree_inputs(steps, 6)
    mask, positions, _, next_token, next_sibling = run_build(
        build_tree_kernel_efficient, parent_list, selected, [4, 0], 1, 5, 6, 1, "cpu")
    assert positions.tolist() == [4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5]
    assert next_token.tolist() == [[1, 2, 3, 4, 5, -1]] * 2
    assert (next_sibling == -1).all()
    assert torch.equal(mask_rows(mask, [4, 0], 6, 1), torch.ones(6, 6, dtype=torch.bool).tril().expand(2, 6, 6))


def test_build_tree_api():
    steps = random_draft_steps(2, 4, 4, seed=5)
    verified = torch.tensor([11, 12])
    t = tree.build_draft_tree(verified, torch.tensor([10, 5]), steps, 8, tree_mask_mode=2)
    assert t.draft_tokens.shape == (2, 8) and t.draft_tokens[:, 0].tolist() == [11, 12]
    assert t.tree_mask.dtype == torch.uint8 and t.positions.shape == (16,)
    parent_list, selected = tree_inputs(steps, 8)
    want = run_build(reference.build_tree_kernel_efficient, parent_list, selected, [10, 5], 4, 4, 8, 2, "cpu")
    for g, w in zip([t.tree_mask, t.positions, t.retrive_index, t.retrive_next_token, t.retrive_next_sibling], want):
        assert torch.equal(g, w)


# --- verify_tree_greedy -------------------------------------------------------------------


def hand_tree_lists(device):
    h = HAND
    index = torch.arange(16).reshape(2, 8)
    return [t.to(device) for t in (index, torch.tensor(h["next_token"]), torch.tensor(h["next_sibling"]))]


# Node tokens of the hand tree; request 0 accepts the whole path 1-3-6-7, request 1 accepts
# node 2 (the root's second child) and rejects at depth 2 (neither child matches).
HAND_CANDIDATES = torch.tensor([[100, 11, 12, 13, 14, 15, 16, 17], [200, 21, 22, 23, 24, 25, 26, 27]])
HAND_TARGET = torch.tensor([[11, 13, 0, 16, 0, 0, 17, 99], [22, 0, 98, 0, 0, 0, 0, 0]])


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_hand_tree(device):
    predicts, accept_index, accept_num = verify_outputs(2, 8, 5, device)
    verify_tree_greedy(predicts, accept_index, accept_num, HAND_CANDIDATES.to(device), *hand_tree_lists(device),
                       HAND_TARGET.to(device))
    assert accept_index.tolist() == [[0, 1, 3, 6, 7], [8, 10, -1, -1, -1]]
    assert accept_num.tolist() == [4, 1]
    want = [-1] * 16
    want[0], want[1], want[3], want[6], want[7] = 11, 13, 16, 17, 99  # 99: bonus
    want[8], want[10] = 22, 98  # 98: bonus after the rejection at depth 2
    assert predicts.tolist() == want


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_depth_limit_and_all_rejected(device):
    # S = 3 stops request 0 after two accepted tokens; a root target matching no child
    # rejects everything in request 1.
    target = HAND_TARGET.clone()
    target[1, 0] = 5
    predicts, accept_index, accept_num = verify_outputs(2, 8, 3, device)
    verify_tree_greedy(predicts, accept_index, accept_num, HAND_CANDIDATES.to(device), *hand_tree_lists(device),
                       target.to(device))
    assert accept_index.tolist() == [[0, 1, 3], [8, -1, -1]]
    assert accept_num.tolist() == [2, 0]
    assert predicts[[0, 1, 3, 8]].tolist() == [11, 13, 16, 5]
    assert (predicts[[2, 4, 5, 6, 7, 9, 10]] == -1).all()


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_n1(device):
    cand = torch.tensor([[7], [8]], device=device)
    lists = [torch.tensor([[0], [1]], device=device)] + [torch.full((2, 1), -1, device=device)] * 2
    predicts, accept_index, accept_num = verify_outputs(2, 1, 1, device)
    verify_tree_greedy(predicts, accept_index, accept_num, cand, *lists, torch.tensor([[3], [4]], device=device))
    assert predicts.tolist() == [3, 4] and accept_index.tolist() == [[0], [1]] and accept_num.tolist() == [0, 0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("topk, depth, n", [(4, 5, 16), (1, 6, 7), (8, 6, 48)], ids=["tree", "chain", "wide"])
def test_greedy_random_trees_match_reference(device, topk, depth, n):
    bs, vocab = 64, 4  # a small vocabulary so that many drafts match
    steps = random_draft_steps(bs, topk, depth, seed=n, vocab=max(vocab, topk))
    parent_list, selected = tree_inputs(steps, n)
    _, _, index, next_token, next_sibling = run_build(
        reference.build_tree_kernel_efficient, parent_list, selected, [0] * bs, topk, depth, n, 1, "cpu")
    g = torch.Generator().manual_seed(n)
    cand = torch.randint(0, vocab, (bs, n), generator=g)
    target = torch.randint(0, vocab, (bs, n), generator=g)
    results = []
    for fn, dev in ((verify_tree_greedy, device), (reference.verify_tree_greedy, "cpu")):
        outs = verify_outputs(bs, n, depth + 1, dev)
        fn(*outs, *(t.to(dev) for t in (cand, index, next_token, next_sibling, target)))
        results.append([t.cpu() for t in outs])
    for g_, w in zip(*results):
        assert torch.equal(g_, w)
    assert results[0][2].max() >= 2  # the walk went deep somewhere


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_all_accepted_chain(device):
    n = 6
    cand = torch.arange(n).unsqueeze(0)
    target = (torch.arange(n) + 1).unsqueeze(0)  # the target always predicts the next node
    next_token = torch.tensor([[1, 2, 3, 4, 5, -1]])
    lists = [torch.arange(n).unsqueeze(0), next_token, torch.full((1, n), -1)]
    predicts, accept_index, accept_num = verify_outputs(1, n, n, device)
    verify_tree_greedy(predicts, accept_index, accept_num, cand.to(device), *(t.to(device) for t in lists),
                       target.to(device))
    assert accept_num.tolist() == [5] and accept_index.tolist() == [[0, 1, 2, 3, 4, 5]]
    assert predicts.tolist() == [1, 2, 3, 4, 5, 6]


def test_greedy_api():
    steps = random_draft_steps(2, 4, 4, seed=5)
    t = tree.build_draft_tree(torch.tensor([1, 2]), torch.tensor([3, 3]), steps, 8)
    # the target agrees with the draft along node 0 -> first child -> its first child
    target = torch.full((2, 8), -5, dtype=torch.long)  # -5 matches no draft token
    for b in range(2):
        first = int(t.retrive_next_token[b, 0])
        target[b, 0] = t.draft_tokens[b, first]
    result = tree.verify_greedy(t, target)
    assert [len(x) for x in result.accepted_tokens] == [2, 2]
    assert result.accepted_tokens[0][0] == int(t.draft_tokens[0, int(t.retrive_next_token[0, 0])])


# --- tree_speculative_sampling_target_only ------------------------------------------------
#
# A small hand tree, N = 4, V = 4:  root -> 1 (token 1) -> 3 (token 3);  root -> 2 (token 2).
SMALL_NEXT_TOKEN = [1, 3, -1, -1]
SMALL_NEXT_SIBLING = [-1, 2, -1, -1]
SMALL_TOKENS = [0, 1, 2, 3]
SMALL_PROBS = [[0.1, 0.2, 0.3, 0.4],      # root
               [0.25, 0.25, 0.25, 0.25],  # node 1
               [0.5, 0.0, 0.25, 0.25],    # node 2
               [0.0, 0.0, 1.0, 0.0]]      # node 3


def small_tree_batch(bs, device):
    lists = [torch.arange(bs * 4).reshape(bs, 4), torch.tensor([SMALL_NEXT_TOKEN] * bs),
             torch.tensor([SMALL_NEXT_SIBLING] * bs)]
    return torch.tensor([SMALL_TOKENS] * bs).to(device), [t.to(device) for t in lists]


def run_sampling(fn, cand, lists, coins, final, probs, steps, device, t_single=1.0, t_acc=1.0):
    bs, n = cand.shape
    outs = verify_outputs(bs, n, steps, device)
    draft = torch.zeros_like(probs, device=device)
    fn(*outs, cand.to(device), *(t.to(device) for t in lists), coins.to(device), final.to(device),
       probs.to(device), draft, t_single, t_acc, True)
    return [t.cpu() for t in outs] + [draft.cpu()]


@pytest.mark.parametrize("device", DEVICES)
def test_sampling_hand_tree(device):
    # coins at the root / node 1 and the final coin, worked out by hand:
    # r0: 0.25 rejects node 1 (0.25 > 0.2), accepts node 2 (<= 0.2 + 0.3); node 2 is a leaf:
    #     final from node 2's full row, u = 0.6 -> cdf 0.5, 0.5, 0.75 -> token 2.
    # r1: 0.1 accepts node 1; 0.9 rejects node 3 (> 0.25): residual at node 1 is
    #     [.25, .25, .25, 0] (total .75), u = 0.5 * .75 -> token 1.
    # r2: 0.99 rejects both children: residual [0.1, 0, 0, 0.4], u = 0.25 -> token 3.
    # r3: 0.1 accepts node 1, 0.1 accepts node 3: S - 1 = 2 accepted, final from node 3's full
    #     row -> token 2.
    bs = 4
    cand, lists = small_tree_batch(bs, device)
    coins = torch.tensor([[0.25, 0.5, 0.5, 0.5], [0.1, 0.9, 0.5, 0.5], [0.99, 0.5, 0.5, 0.5], [0.1, 0.1, 0.5, 0.5]])
    final = torch.tensor([0.6, 0.5, 0.5, 0.5])
    probs = torch.tensor([SMALL_PROBS] * bs)
    predicts, accept_index, accept_num, draft = run_sampling(
        tree_speculative_sampling_target_only, cand, lists, coins, final, probs, 3, device)
    assert accept_num.tolist() == [1, 1, 0, 2]
    assert accept_index.tolist() == [[0, 2, -1], [4, 5, -1], [8, -1, -1], [12, 13, 15]]
    p = predicts.reshape(bs, 4).tolist()
    assert p == [[2, -1, 2, -1], [1, 1, -1, -1], [3, -1, -1, -1], [1, 3, -1, 2]]
    # rejected children's target mass, at their parent's row
    assert torch.equal(draft[0, 0], torch.tensor([0, 0.2, 0, 0]))
    assert torch.equal(draft[1, 1], torch.tensor([0, 0, 0, 0.25]))
    assert torch.equal(draft[2, 0], torch.tensor([0, 0.2, 0.3, 0]))
    assert draft[3].abs().sum() == 0


@pytest.mark.parametrize("device", DEVICES)
def test_sampling_thresholds(device):
    # threshold_single 0.15: node 1 (0.2), then node 3 (0.25) are accepted whatever the coin;
    # threshold_acc 0.5: coin 0.99 <= (0.2 + 0.3) / 0.5 accepts node 2.
    cand, lists = small_tree_batch(1, device)
    coins = torch.tensor([[0.99, 0.99, 0.5, 0.5]])
    probs = torch.tensor([SMALL_PROBS])
    out = run_sampling(tree_speculative_sampling_target_only, cand, lists, coins, torch.tensor([0.0]), probs, 3,
                       device, t_single=0.15)
    assert out[1].tolist() == [[0, 1, 3]]
    out = run_sampling(tree_speculative_sampling_target_only, cand, lists, coins, torch.tensor([0.0]), probs, 3,
                       device, t_acc=0.5)
    assert out[1].tolist() == [[0, 2, -1]]


def random_sampling_case(bs, topk, depth, n, vocab, seed):
    steps = random_draft_steps(bs, topk, depth, seed=seed, vocab=max(vocab, topk))
    parent_list, selected = tree_inputs(steps, n)
    _, _, index, next_token, next_sibling = run_build(
        reference.build_tree_kernel_efficient, parent_list, selected, [0] * bs, topk, depth, n, 1, "cpu")
    g = torch.Generator().manual_seed(seed)
    # draft tokens: distinct siblings, as a top-k gives them
    cand = torch.stack([torch.randperm(vocab, generator=g)[:n] for _ in range(bs)])
    probs = torch.softmax(torch.randn(bs, n, vocab, generator=g) * 3, -1)
    coins = torch.rand(bs, n, generator=g)
    final = torch.rand(bs, generator=g)
    return cand, [index, next_token, next_sibling], coins, final, probs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("thresholds", [(1.0, 1.0), (0.6, 0.8), (0.0, 0.0)], ids=["exact", "relaxed", "zero"])
@pytest.mark.parametrize(
    "bs, topk, depth, n, vocab",
    [(16, 4, 4, 8, 64), (8, 1, 5, 6, 33), (8, 8, 5, 24, 1000), (4, 2, 3, 1, 17), (4, 4, 4, 8, 32001),
     (2, 4, 4, 8, 128256)],
    ids=["tree", "chain", "wide", "N1", "vocab32001", "vocab128256"],
)
def test_sampling_random_trees_match_reference(device, thresholds, bs, topk, depth, n, vocab):
    case = random_sampling_case(bs, topk, depth, n, vocab, seed=bs + n + vocab)
    got = run_sampling(tree_speculative_sampling_target_only, *case, depth + 1, device, *thresholds)
    want = run_sampling(reference.tree_speculative_sampling_target_only, *case, depth + 1, "cpu", *thresholds)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CPU kernel is always deterministic: the flag "
                                                         "only changes the CUDA reduction order")
@pytest.mark.parametrize("vocab", [1000, 32001], ids=["vec4", "scalar"])
def test_sampling_deterministic_flag(vocab):
    # deterministic=True gives the same tokens run after run; the fast mode may differ from it
    # only in the last bits of a sum, so on these inputs it gives the same tokens too, and
    # both are the reference's.
    device = "cuda"
    case = random_sampling_case(16, 4, 4, 8, vocab, seed=vocab)
    cand, lists, coins, final, probs = case
    runs = []
    for deterministic in (True, True, False):
        outs = verify_outputs(16, 8, 5, device)
        draft = torch.zeros_like(probs, device=device)
        tree_speculative_sampling_target_only(*outs, cand.to(device), *(t.to(device) for t in lists), coins.to(device),
                                              final.to(device), probs.to(device), draft, 1.0, 1.0, deterministic)
        runs.append([t.cpu() for t in outs])
    for a, b in zip(runs[0], runs[1]):
        assert torch.equal(a, b)
    for a, b in zip(runs[0], runs[2]):
        assert torch.equal(a, b)
    want = run_sampling(reference.tree_speculative_sampling_target_only, *case, 5, "cpu")
    for a, b in zip(runs[0], want):
        assert torch.equal(a, b)


@pytest.mark.parametrize("thresholds", [(1.0, 1.0), (0.6, 0.8)], ids=["exact", "relaxed"])
def test_batched_baselines_match_reference(thresholds):
    # The tensor-op baselines the benchmark times compute exactly what the loops compute.
    cand, lists, coins, final, probs = random_sampling_case(32, 4, 5, 12, 40, seed=4)
    got = run_sampling(reference.tree_speculative_sampling_batched, cand, lists, coins, final, probs, 6, "cpu",
                       *thresholds)
    want = run_sampling(reference.tree_speculative_sampling_target_only, cand, lists, coins, final, probs, 6,
                        "cpu", *thresholds)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    target = torch.randint(0, 6, (32, 12), generator=torch.Generator().manual_seed(0))
    cand = cand % 6
    results = []
    for fn in (reference.verify_tree_greedy_batched, reference.verify_tree_greedy):
        outs = verify_outputs(32, 12, 6, "cpu")
        fn(*outs, cand, *lists, target)
        results.append(outs)
    for g, w in zip(*results):
        assert torch.equal(g, w)
    assert results[0][2].max() >= 2


def test_sampling_api():
    steps = random_draft_steps(3, 4, 4, seed=9)
    t = tree.build_draft_tree(torch.tensor([1, 2, 3]), torch.tensor([3, 3, 3]), steps, 8)
    probs = torch.softmax(torch.randn(3, 8, 50, generator=torch.Generator().manual_seed(0)), -1)
    result = tree.verify_sampling(t, probs, generator=torch.Generator().manual_seed(1))
    for b in range(3):
        # The accepted drafts follow a root-to-node path of the tree (each a child of the one
        # before), and the last token is a vocabulary id.
        node, *drafts, last = [0] + result.accepted_tokens[b]
        for token in drafts:
            child = int(t.retrive_next_token[b, node])
            while child >= 0 and int(t.draft_tokens[b, child]) != token:
                child = int(t.retrive_next_sibling[b, child])
            assert child >= 0, f"request {b}: token {token} is no child of node {node}"
            node = child
        assert 0 <= last < 50


# --- losslessness -------------------------------------------------------------------------
#
# One fixed tree and target, 200k independent requests in one call. Each request emits a
# sequence (accepted drafts + the final token); under the target's own sampling its
# probability is the product of the target's probabilities along it. The chi-square
# statistic over all sequences (rare ones pooled to keep expected counts >= 20) must stay
# below the critical value at p = 1e-4 (Wilson-Hilferty approximation); a deliberately
# biased sampler (threshold_acc = 0.9) must exceed it.

LOSSLESS_TRIALS = 200_000
LOSSLESS_VOCAB = 6
# root -> 1 (token 2), 2 (token 4), 3 (token 0); 1 -> 4 (token 2), 5 (token 5); 4 -> 6 (token 1)
LOSSLESS_TOKENS = [9, 2, 4, 0, 2, 5, 1]
LOSSLESS_CHILDREN = {0: [1, 2, 3], 1: [4, 5], 4: [6]}
LOSSLESS_STEPS = 4  # up to 3 accepted tokens


def lossless_case():
    n = len(LOSSLESS_TOKENS)
    next_token, next_sibling = [-1] * n, [-1] * n
    for parent, kids in LOSSLESS_CHILDREN.items():
        next_token[parent] = kids[0]
        for a, c in zip(kids, kids[1:]):
            next_sibling[a] = c
    probs = torch.softmax(torch.randn(n, LOSSLESS_VOCAB, generator=torch.Generator().manual_seed(0)), -1)
    return next_token, next_sibling, probs


def expected_sequences(next_token, next_sibling, probs):
    """Probability of every emitted sequence under the target's own sampling."""
    out = {}

    def walk(node, prefix, p, accepted):
        for x in range(LOSSLESS_VOCAB):
            seq, px = prefix + (x,), p * float(probs[node, x])
            kids = LOSSLESS_CHILDREN.get(node, [])
            child = next((c for c in kids if LOSSLESS_TOKENS[c] == x), None)
            if child is None or accepted + 1 == LOSSLESS_STEPS:
                out[seq] = out.get(seq, 0.0) + px
            else:
                walk(child, seq, px, accepted + 1)

    walk(0, (), 1.0, 0)
    return out


def emitted_counts(t_acc, seed):
    next_token, next_sibling, probs = lossless_case()
    bs, n = LOSSLESS_TRIALS, len(LOSSLESS_TOKENS)
    cand = torch.tensor(LOSSLESS_TOKENS).expand(bs, n).contiguous()
    lists = [torch.arange(bs * n).reshape(bs, n), torch.tensor(next_token).expand(bs, n).contiguous(),
             torch.tensor(next_sibling).expand(bs, n).contiguous()]
    g = torch.Generator().manual_seed(seed)
    predicts, accept_index, _, _ = run_sampling(
        tree_speculative_sampling_target_only, cand, lists, torch.rand(bs, n, generator=g),
        torch.rand(bs, generator=g), probs.expand(bs, n, LOSSLESS_VOCAB).contiguous(), LOSSLESS_STEPS, "cpu",
        1.0, t_acc)
    emitted = torch.where(accept_index >= 0, predicts[accept_index.clamp_min(0).long()], -1)
    counts = {}
    for row, c in zip(*torch.unique(emitted, dim=0, return_counts=True)):
        seq = tuple(int(x) for x in row if x >= 0)
        counts[seq] = counts.get(seq, 0) + int(c)
    return counts, expected_sequences(next_token, next_sibling, probs)


def chi_square(counts, expected, trials, min_expected=20.0):
    stat, df, pooled_obs, pooled_exp = 0.0, 0, 0, 0.0
    assert set(counts) <= set(expected), "emitted a sequence the target can never produce"
    for seq, p in expected.items():
        e, o = p * trials, counts.get(seq, 0)
        if e < min_expected:
            pooled_obs, pooled_exp = pooled_obs + o, pooled_exp + e
            continue
        stat += (o - e) ** 2 / e
        df += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        df += 1
    df -= 1
    z = 3.719  # p = 1e-4, one-sided
    critical = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return stat, critical


def test_sampling_is_lossless():
    counts, expected = emitted_counts(t_acc=1.0, seed=1)
    assert abs(sum(expected.values()) - 1) < 1e-6  # float32 target rows
    stat, critical = chi_square(counts, expected, LOSSLESS_TRIALS)
    assert stat < critical, f"chi-square {stat:.1f} >= {critical:.1f}: emitted sequences do not follow the target"
    # the bound has teeth: a sampler that over-accepts drafts (threshold_acc 0.9) is caught
    biased_counts, _ = emitted_counts(t_acc=0.9, seed=1)
    biased_stat, _ = chi_square(biased_counts, expected, LOSSLESS_TRIALS)
    assert biased_stat > critical, f"negative control not rejected: {biased_stat:.1f} <= {critical:.1f}"


# --- opcheck ------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", MODES)
def test_opcheck_build(device, mode):
    h = HAND
    outs = build_outputs(h["seq_lens"], 8, mode, device)
    args = (h["parent_list"].to(device), h["selected"].to(device), torch.tensor(h["seq_lens"], device=device),
            *outs, 4, 4, 8, mode)
    torch.library.opcheck(torch.ops.eagle3.build_tree_kernel_efficient.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_verify(device):
    outs = verify_outputs(2, 8, 5, device)
    args = (*outs, HAND_CANDIDATES.to(device), *hand_tree_lists(device), HAND_TARGET.to(device))
    torch.library.opcheck(torch.ops.eagle3.verify_tree_greedy.default, args)
    case = random_sampling_case(4, 4, 4, 8, 40, seed=0)
    cand, lists, coins, final, probs = case
    outs = verify_outputs(4, 8, 5, device)
    args = (*outs, cand.to(device), *(t.to(device) for t in lists), coins.to(device), final.to(device),
            probs.to(device), torch.zeros_like(probs, device=device), 1.0, 1.0, True)
    torch.library.opcheck(torch.ops.eagle3.tree_speculative_sampling_target_only.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    def verify(candidates, index, next_token, next_sibling, target):
        predicts, accept_index, accept_num = verify_outputs(2, 8, 5, candidates.device)
        verify_tree_greedy(predicts, accept_index, accept_num, candidates, index, next_token, next_sibling, target)
        return predicts + 0, accept_index, accept_num * 2

    args = (HAND_CANDIDATES.to(device), *hand_tree_lists(device), HAND_TARGET.to(device))
    compiled = torch.compile(verify, fullgraph=True)
    for got, want in zip(compiled(*args), verify(*args)):
        assert torch.equal(got, want)


# --- errors -------------------------------------------------------------------------------


def build_args(**changes):
    h = HAND
    mask, positions, index, next_token, next_sibling = build_outputs(h["seq_lens"], 8, 1, "cpu")
    args = dict(parent_list=h["parent_list"].clone(), selected_index=h["selected"].clone(),
                verified_seq_len=torch.tensor(h["seq_lens"]), tree_mask=mask, positions=positions,
                retrive_index=index, retrive_next_token=next_token, retrive_next_sibling=next_sibling,
                topk=4, depth=4, draft_token_num=8, tree_mask_mode=1)
    args.update(changes)
    return args


def invalid_parent():
    sel = HAND["selected"].clone()
    sel[0, 5] = 24  # slot 6 -> parent_list[0, 6] = 8, which request 0 selected: still valid
    sel[0, 6] = 40  # slot 10 -> parent_list[0, 10] = 21, not selected by request 0
    return sel


@pytest.mark.parametrize(
    "changes, pattern",
    [
        (dict(selected_index=HAND["selected"].int()), r"selected_index must be int64 \(torch.int64\), got Int"),
        (dict(parent_list=HAND["parent_list"].int()), r"parent_list must be int64"),
        (dict(verified_seq_len=torch.tensor([10, 5], dtype=torch.int32)), r"verified_seq_len must be int64"),
        (dict(selected_index=HAND["selected"][:, :6]), r"selected_index must have shape \[2, 7\] .*got \[2, 6\]"),
        (dict(parent_list=HAND["parent_list"][:, :12]),
         r"parent_list must have shape \[2, 13\] \(\[bs, topk \* \(depth - 1\) \+ 1\] for topk 4, depth 4\)"),
        (dict(positions=torch.empty(15, dtype=torch.long)), r"positions must have bs \* draft_token_num = 16 elem"),
        (dict(retrive_next_token=torch.full((2, 7), -1)), r"retrive_next_token must have shape \[2, 8\]"),
        (dict(retrive_index=torch.full((2, 8), -1, dtype=torch.int32)), r"retrive_index must be int64"),
        (dict(tree_mask=torch.ones(127, dtype=torch.bool)), r"tree_mask \(tree_mask_mode 1\) must have 128"),
        (dict(tree_mask=torch.ones(128, dtype=torch.uint8)), r"tree_mask must be bool"),
        (dict(tree_mask_mode=0), r"tree_mask \(tree_mask_mode 0\) must have 248 = sum\(verified_seq_len\) \* N"),
        (dict(tree_mask_mode=2, tree_mask=torch.zeros(16, dtype=torch.int32)),
         r"tree_mask \(tree_mask_mode 2\) must hold 16 packed rows of 1 byte\(s\) .*got 16 x 4 bytes"),
        (dict(tree_mask_mode=3), r"tree_mask_mode must be 0 .*, got 3"),
        (dict(topk=0), r"topk must be >= 1, got 0"),
        (dict(selected_index=invalid_parent()),
         r"invalid tree: request 0, node 7: its parent is draft candidate 21 .* not among the selected nodes"),
        (dict(selected_index=torch.tensor([[0, 1, 4, 5, 8, 20, 36], [0, 1, 2, 8, 9, 12, 99]])),
         r"invalid tree: request 1, node 7: selected_index\[1, 6\] = 99 points to a parent slot"),
        (dict(verified_seq_len=torch.tensor([10, -1])), r"verified_seq_len\[1\] = -1 is negative"),
    ],
    ids=["selected-int32", "parents-int32", "seqlen-int32", "selected-shape", "parents-shape", "positions-size",
         "next-token-shape", "retrive-index-int32", "mask1-size", "mask1-dtype", "mask0-size", "mask2-size",
         "bad-mode", "topk-0", "parent-not-selected", "slot-out-of-range", "negative-seq-len"],
)
def test_build_bad_inputs(changes, pattern):
    with pytest.raises(op_error(pattern), match=r"eagle3\.build_tree_kernel_efficient: " + pattern):
        build_tree_kernel_efficient(**build_args(**changes))


def test_build_mode2_too_many_nodes():
    steps = random_draft_steps(1, 8, 6, seed=0)
    parent_list, selected = tree_inputs(steps, 40)
    outs = build_outputs([3], 40, 1, "cpu")
    outs[0] = torch.zeros(40 * 8, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"tree_mask_mode 2 packs a row into at most 32 bits, but draft_token_num is 40"):
        build_tree_kernel_efficient(parent_list, selected, torch.tensor([3]), *outs, 8, 6, 40, 2)


def greedy_args(**changes):
    predicts, accept_index, accept_num = verify_outputs(2, 8, 5, "cpu")
    index, next_token, next_sibling = hand_tree_lists("cpu")
    args = dict(predicts=predicts, accept_index=accept_index, accept_token_num=accept_num,
                candidates=HAND_CANDIDATES.clone(), retrive_index=index, retrive_next_token=next_token,
                retrive_next_sibling=next_sibling, target_predict=HAND_TARGET.clone())
    args.update(changes)
    return args


def with_value(t, pos, value):
    t = t.clone()
    t[pos] = value
    return t


def bad_retrive_index():
    return with_value(torch.arange(16).reshape(2, 8), (0, 1), 16)


@pytest.mark.parametrize(
    "changes, pattern",
    [
        (dict(predicts=torch.full((16,), -1)), r"predicts must be int32 \(torch.int32\), got Long"),
        (dict(candidates=HAND_CANDIDATES.int()), r"candidates must be int64"),
        (dict(target_predict=HAND_TARGET.int()), r"target_predict must be int64"),
        (dict(predicts=torch.full((15,), -1, dtype=torch.int32)), r"predicts must have shape \[16\] \(\[bs \* N\]\)"),
        (dict(accept_token_num=torch.zeros(3, dtype=torch.int32)), r"accept_token_num must have shape \[2\]"),
        (dict(accept_index=torch.full((3, 5), -1, dtype=torch.int32)), r"accept_index must have shape \[2, max_depth"),
        (dict(retrive_next_sibling=torch.full((2, 9), -1)), r"retrive_next_sibling must have shape \[2, 8\]"),
        (dict(target_predict=HAND_TARGET[:, :7]), r"target_predict must have shape \[2, 8\]"),
        (dict(retrive_next_token=with_value(torch.tensor(HAND["next_token"]), (1, 0), 8)),
         r"invalid tree: request 1, node 0: retrive_next_token = 8 is not in \[-1, N\)"),
        (dict(retrive_index=bad_retrive_index()),
         r"invalid tree: request 0, node 1: retrive_index = 16 is not in \[0, bs \* N\)"),
        (dict(retrive_next_sibling=with_value(torch.tensor(HAND["next_sibling"]), (1, 3), 1),
              target_predict=with_value(HAND_TARGET, (1, 0), 5)),  # nothing matches: all siblings
         r"invalid tree: request 1, node 0: the sibling list of its children does not end"),
    ],
    ids=["predicts-int64", "candidates-int32", "target-int32", "predicts-size", "accept-num-size",
         "accept-index-shape", "sibling-shape", "target-shape", "next-token-range", "retrive-index-range",
         "sibling-cycle"],
)
def test_greedy_bad_inputs(changes, pattern):
    with pytest.raises(op_error(pattern), match=r"eagle3\.verify_tree_greedy: " + pattern):
        verify_tree_greedy(**greedy_args(**changes))


def sampling_args(**changes):
    cand, lists = small_tree_batch(2, "cpu")
    predicts, accept_index, accept_num = verify_outputs(2, 4, 3, "cpu")
    probs = torch.tensor([SMALL_PROBS] * 2)
    args = dict(predicts=predicts, accept_index=accept_index, accept_token_num=accept_num, candidates=cand,
                retrive_index=lists[0], retrive_next_token=lists[1], retrive_next_sibling=lists[2],
                uniform_samples=torch.full((2, 4), 0.5), uniform_samples_for_final_sampling=torch.full((2,), 0.5),
                target_probs=probs, draft_probs=torch.zeros_like(probs), threshold_single=1.0, threshold_acc=1.0,
                deterministic=True)
    args.update(changes)
    return args


@pytest.mark.parametrize(
    "changes, pattern",
    [
        (dict(threshold_single=1.5), r"threshold_single must be in \[0, 1\], got 1.5"),
        (dict(threshold_acc=-0.1), r"threshold_acc must be in \[0, 1\], got -0.1"),
        (dict(target_probs=torch.tensor([SMALL_PROBS] * 2).double()), r"target_probs must be float32"),
        (dict(uniform_samples=torch.full((2, 4), 0.5).half()), r"uniform_samples must be float32"),
        (dict(draft_probs=torch.zeros(2, 4, 5)), r"draft_probs must have shape \[2, 4, 4\]"),
        (dict(target_probs=torch.zeros(2, 3, 4)), r"target_probs must have shape \[2, 4, 4\] \(\[bs, N, V\]\)"),
        (dict(uniform_samples_for_final_sampling=torch.zeros(3)),
         r"uniform_samples_for_final_sampling must have shape \[2\]"),
        (dict(retrive_index=torch.arange(8, dtype=torch.int32).reshape(2, 4)), r"retrive_index must be int64"),
        (dict(accept_token_num=torch.zeros(2, dtype=torch.long)), r"accept_token_num must be int32"),
        (dict(candidates=torch.tensor([[0, 1, 2, 3], [0, 1, 7, 3]]),
              uniform_samples=torch.full((2, 4), 0.99)),
         r"request 1, node 2: candidates = 7 is not a token id in \[0, vocab_size\)"),
    ],
    ids=["t-single", "t-acc", "probs-fp64", "coins-fp16", "draft-shape", "target-shape", "final-coins",
         "index-int32", "accept-num-int64", "candidate-range"],
)
def test_sampling_bad_inputs(changes, pattern):
    with pytest.raises(op_error(pattern), match=r"eagle3\.tree_speculative_sampling_target_only: " + pattern):
        tree_speculative_sampling_target_only(**sampling_args(**changes))


def _cuda(args):
    return {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in args.items()}


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_device_mismatch_and_cuda_tree_errors():
    args = greedy_args()
    args["candidates"] = args["candidates"].cuda()
    with pytest.raises(ValueError, match=r"predicts is on cpu but candidates is on cuda:0"):
        verify_tree_greedy(**args)
    # What only the kernel sees (an invalid tree, a mode-0 mask of the wrong size) is read
    # back and raised only with validation (a sync per call).
    with pytest.raises(ValueError, match=r"invalid tree: request 0, node 7: its parent is draft candidate 21"):
        build_tree_kernel_efficient(**_cuda(build_args(selected_index=invalid_parent())), validate=True)
    with ops.cuda_validation():
        with pytest.raises(ValueError, match=r"tree_mask \(tree_mask_mode 0\) must have 248 = sum"):
            build_tree_kernel_efficient(**_cuda(build_args(tree_mask_mode=0)))
    with pytest.raises(ValueError, match=r"invalid tree: request 0, node 1: retrive_index = 16 is not in"):
        verify_tree_greedy(**_cuda(greedy_args(retrive_index=bad_retrive_index())), validate=True)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_tree_errors_not_read_back_by_default():
    # Without validation nothing waits for the device: the invalid request is left partly
    # written, the kernels stay in bounds (the synchronize below would raise otherwise).
    build_tree_kernel_efficient(**_cuda(build_args(selected_index=invalid_parent())))
    build_tree_kernel_efficient(**_cuda(build_args(tree_mask_mode=0)), validate=False)
    with ops.cuda_validation(False):
        verify_tree_greedy(**_cuda(greedy_args(retrive_index=bad_retrive_index())))
    torch.cuda.synchronize()


def test_cuda_validation_is_this_threads_and_restored():
    """validate= and cuda_validation() set this thread's setting for a call or a block and restore
    the one before (nested too); another thread keeps its own. A CPU call raises either way."""
    assert _C.cuda_validation() is False  # the default (EAGLE3_CUDA_VALIDATE unset)
    seen = []
    with ops.cuda_validation():
        assert _C.cuda_validation() is True
        with ops.cuda_validation(False):
            assert _C.cuda_validation() is False
        assert _C.cuda_validation() is True
        worker = threading.Thread(target=lambda: seen.append(_C.cuda_validation()))
        worker.start()
        worker.join()
        with pytest.raises(ValueError, match=r"invalid tree: request 0, node 7"):
            build_tree_kernel_efficient(**build_args(selected_index=invalid_parent()), validate=False)
        assert _C.cuda_validation() is True   # restored after an error too
    assert _C.cuda_validation() is False and seen == [False]
    with pytest.raises(ValueError, match=r"invalid tree: request 0, node 1: retrive_index = 16 is not in"):
        verify_tree_greedy(**greedy_args(retrive_index=bad_retrive_index()), validate=True)
    assert _C.cuda_validation() is False


@pytest.mark.parametrize("env, expected", [("1", "True"), ("0", "False"),
                                           ("yes", "EAGLE3_CUDA_VALIDATE .* must be 0 or 1, got 'yes'")])
def test_eagle3_cuda_validate_is_the_default_only(env, expected):
    """EAGLE3_CUDA_VALIDATE sets the default (read once; another value than 0 or 1 raises, naming
    it); validate= and cuda_validation() override it."""
    code = ("from eagle3_ext import _C, ops\n"
            "try:\n    print(_C.cuda_validation())\nexcept ValueError as e:\n    print(e)\n"
            "with ops.cuda_validation(False):\n    print(_C.cuda_validation())")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "EAGLE3_CUDA_VALIDATE": env},
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert re.fullmatch(expected, out[0]), out
    assert out[1] == "False"
