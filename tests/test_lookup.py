"""Hybrid drafting: the n-gram lookup, the node budget split, grafting a chain onto a draft tree
(checked against a tree rebuilt from parent links), and generation with lookup on: token-
identical to the target's greedy decoding in fp32, lossless when sampling."""

import pytest
import torch

from eagle3_ext import reference
from eagle3_ext.decoding import tree
from eagle3_ext.api import SpeculativeGenerator, TreeConfig
from eagle3_ext.bench.baseline import hf_generate
from eagle3_ext.decoding.lookup import NgramLookup, draft_nodes_to_keep
from sampling_stats import chi_square, chi_square_bound, exact_joint, make_small_vocab_pair, sample_joint
from test_tree_ops import random_draft_steps, tree_inputs
from tiny_models import loaded_trained_pair


def lookup(tokens, max_ngram=3, max_tokens=6):
    lk = NgramLookup(max_ngram, max_tokens)
    lk.tokens.extend(tokens)
    return lk


# --- the n-gram lookup ---------------------------------------------------------------------------

def test_lookup_copies_what_followed_the_latest_longest_match():
    # suffix [7, 8] occurs at 1 (followed by 9, 4) and at 5 (followed by 1, 2): the latest wins
    assert lookup([5, 7, 8, 9, 4, 7, 8, 1, 2, 3, 7, 8]).propose() == [1, 2, 3, 7, 8, 1]
    # a longer suffix match beats a later shorter one: [3, 7, 8] only at 8..10
    assert lookup([3, 7, 8, 6, 0, 7, 8, 5, 3, 7, 8], max_tokens=3).propose() == [6, 0, 7]
    assert lookup([1, 2, 3, 4]).propose() == []                     # nothing repeats
    assert lookup([4]).propose() == []


def test_lookup_continues_a_loop_past_the_end():
    # period 2: the copy runs into its own output instead of stopping after two tokens
    assert lookup([9, 1, 2, 1, 2], max_tokens=5).propose() == [1, 2, 1, 2, 1]


def test_lookup_index_grows_with_the_tokens():
    lk = lookup([1, 2, 3])
    assert lk.propose() == []
    lk.tokens.extend([1, 2])
    assert lk.propose() == [3, 1, 2, 3, 1, 2]
    lk.tokens.extend([9, 9])
    assert lk.propose() == [9, 9, 9, 9, 9, 9]                       # the new tokens were indexed
    assert lk.propose() == [9, 9, 9, 9, 9, 9]                       # and a repeated call is the same


def test_lookup_rate_learns_from_outcomes():
    lk = lookup([1, 2])
    assert lk.rate == 0.5 and lk.scores(3) == [0.5, 0.25, 0.125]
    assert lk.record([4, 5, 6], [4, 5, 7]) == 2                      # two accepted, then cut
    assert lk.record([4, 5], [4, 5, 9]) == 2                         # all accepted
    assert (lk.accepted, lk.rejected) == (4, 1)
    assert lk.rate == pytest.approx(5 / 7)


def test_budget_goes_to_the_likeliest_nodes():
    drafted = [[0.9, 0.6, 0.3, 0.1], [0.9, 0.8, 0.7, 0.6]]
    chains = [[0.8, 0.64, 0.51, 0.4], [0.5, 0.25]]
    # request 0: 0.9 (d), 0.8 (c), 0.64 (c), 0.6 (d), 0.51 (c) -> 2 drafted of 5
    # request 1: the draft's four, then the chain's 0.5
    assert draft_nodes_to_keep(drafted, chains, 5) == [2, 4]
    assert draft_nodes_to_keep(drafted, [[], []], 3) == [3, 3]
    assert draft_nodes_to_keep([[0.1]], [[0.9, 0.8, 0.7]], 3) == [0]


# --- grafting ------------------------------------------------------------------------------------

def expected_tree(parents, tokens, seq_len):
    """Mask, positions and retrive lists of a tree given by parent links (root 0, children in
    ascending index order), computed independently of the op and of graft_chains."""
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    positions, nxt, sib = [], [-1] * n, [-1] * n
    for i in range(n):
        node, depth = i, 0
        mask[i, 0] = True
        while node != 0:
            mask[i, node] = True
            node, depth = parents[node], depth + 1
        positions.append(seq_len + depth)
    for p in range(n):
        kids = [j for j in range(1, n) if parents[j] == p]
        if kids:
            nxt[p] = kids[0]
            for a, b in zip(kids, kids[1:]):
                sib[a] = b
    return mask, positions, nxt, sib


@pytest.mark.parametrize("seed", range(6))
def test_graft_matches_a_tree_rebuilt_from_parent_links(seed):
    bs, topk, depth, n, seq_lens = 3, 3, 4, 10, [7, 3, 12]
    steps = random_draft_steps(bs, topk, depth, seed)
    roots = torch.tensor([11, 12, 13])
    base = tree.build_draft_tree(roots, torch.tensor(seq_lens), steps, n)
    parent_list, selected = tree_inputs(steps, n)
    g = torch.Generator().manual_seed(seed)
    tokens = base.draft_tokens.tolist()
    chains, budgets, parents_all = [], [], []
    for b in range(bs):
        parents = reference._tree_parents(parent_list[b].tolist(), selected[b].tolist(), topk, n)
        parents_all.append(parents)
        # a chain that follows a random existing path for a while, then leaves the tree
        path, node = [], 0
        for _ in range(int(torch.randint(0, depth + 1, (1,), generator=g))):
            kids = [j for j in range(1, n) if parents[j] == node]
            if not kids:
                break
            node = kids[int(torch.randint(len(kids), (1,), generator=g))]
            path.append(tokens[b][node])
        chains.append(path + [100 + b, 200 + b, 300 + b][: b + 1])
        budgets.append([3, 0, 2][b])
    grafted, placed = tree.graft_chains(base, chains, budgets)
    m = grafted.num_draft_tokens
    assert m == n + max(min(len(c) - (len(c) - (b + 1)), budgets[b]) for b, c in enumerate(chains))
    for b in range(bs):
        shared = len(chains[b]) - (b + 1)
        added = chains[b][shared:shared + budgets[b]]
        assert placed[b] == chains[b][:shared + len(added)]
        # the expected tree: old parents, then the added chain under the end of the shared path
        parents = list(parents_all[b])
        node = 0
        for t in chains[b][:shared]:
            node = next(j for j in range(1, n) if parents[j] == node and tokens[b][j] == t)
        for i in range(len(added)):
            parents.append(node if i == 0 else n + i - 1)
        mask, positions, nxt, sib = expected_tree(parents, tokens[b] + added, seq_lens[b])
        k = len(parents)
        got_mask = grafted.tree_mask.view(bs, m, m)[b]
        assert torch.equal(got_mask[:k, :k], mask)
        assert grafted.positions.view(bs, m)[b, :k].tolist() == positions
        assert grafted.retrive_next_token[b, :k].tolist() == nxt
        assert grafted.retrive_next_sibling[b, :k].tolist() == sib
        assert grafted.draft_tokens[b, :k].tolist() == tokens[b] + added
        # padding nodes: only the root and themselves, unreachable
        for pad in range(k, m):
            assert got_mask[pad].nonzero().flatten().tolist() == [0, pad]
            assert pad not in grafted.retrive_next_token[b].tolist() + grafted.retrive_next_sibling[b].tolist()
    assert grafted.retrive_index.tolist() == torch.arange(bs * m).view(bs, m).tolist()


def test_greedy_verify_walks_into_a_grafted_chain():
    steps = random_draft_steps(1, 2, 2, 0)
    base = tree.build_draft_tree(torch.tensor([5]), torch.tensor([4]), steps, 4)
    grafted, _ = tree.graft_chains(base, [[101, 102, 103]], [3])
    m = grafted.num_draft_tokens
    # the target's argmax: 101 at the root, 102 after it, 103 after that, 7 (the bonus) last
    predict = torch.zeros(1, m, dtype=torch.long)
    predict[0, 0], predict[0, m - 3], predict[0, m - 2], predict[0, m - 1] = 101, 102, 103, 7
    result = tree.verify_greedy(grafted, predict)
    assert result.accepted_tokens == [[101, 102, 103, 7]]
    assert grafted.depth == 3 and result.accept_index.shape == (1, 4)


# --- generation ----------------------------------------------------------------------------------

REPETITIVE = ["def f ( x ) : return x \n def f ( x ) : return", "a b c d a b c d a b",
              "class value key item index count value key item"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return loaded_trained_pair(str(tmp_path_factory.mktemp("lookup")), layers=4)


@pytest.mark.parametrize("cfg", [TreeConfig(3, 2, 8, lookup_tokens=6), TreeConfig.chain(3, lookup_tokens=8)],
                         ids=lambda c: c.name)
@pytest.mark.parametrize("attention", ["tree", "sdpa"])
def test_greedy_with_lookup_is_token_identical(pair, cfg, attention):
    target, tok, draft = pair
    gen = SpeculativeGenerator(target, draft, cfg, tokenizer=tok, attention=attention)
    expected = hf_generate(target, tok, REPETITIVE, 40, stop_at_eos=False)[0]
    out = gen.generate(REPETITIVE, max_new_tokens=40, eos_token_id=[], return_dict_in_generate=True)
    assert out.new_tokens == expected
    assert out.stats.lookup_proposed > 0 and out.stats.lookup_accepted > 0  # the chains were used
    for prompt, want in zip(REPETITIVE, expected):
        assert gen.generate(prompt, max_new_tokens=40, eos_token_id=[],
                            return_dict_in_generate=True).new_tokens == [want]


@pytest.mark.slow
def test_sampling_with_lookup_matches_target_distribution():
    target, draft = make_small_vocab_pair()
    prompt, length, temperature, trials = [1, 5, 2, 1, 5], 3, 0.8, 10000
    probs = exact_joint(target, prompt, length, temperature)
    cfg = TreeConfig(depth=3, topk=2, num_draft_tokens=8, lookup_tokens=4)
    counts = sample_joint(target, draft, prompt, length, temperature, trials, tree=cfg)
    stat, dof = chi_square(counts, probs, trials)
    assert stat < chi_square_bound(dof), f"chi-square {stat:.1f} with {dof} dof"
