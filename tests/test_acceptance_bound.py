"""The acceptance bound (decoding/acceptance_bound.py): against brute-force enumeration of the
target's samples, against the target-only verifier by Monte Carlo (which attains it), its
accumulation in a sampled generation, and the sampled rows of ``eagle3 bench``."""

import itertools
import json

import pytest
import torch

from conftest import DEVICES
from eagle3_ext.decoding.acceptance_bound import acceptance_bound, tree_parents
from eagle3_ext.decoding.tree import DraftTree, DraftStep, build_draft_tree, graft_chains, verify_sampling

# A hand-built tree of 8 nodes, depth 3, over a vocabulary of 5:
#   0 -> 1 (tok 2), 2 (tok 0), 3 (tok 4);  1 -> 4 (tok 1), 5 (tok 3);  4 -> 6 (tok 2);  2 -> 7 (tok 2)
HAND_PARENTS = [-1, 0, 0, 0, 1, 1, 4, 2]
HAND_TOKENS = [3, 2, 0, 4, 1, 3, 2, 2]
VOCAB = 5


def hand_tree(bs: int = 1, device: str = "cpu") -> DraftTree:
    """The tree of HAND_PARENTS / HAND_TOKENS, repeated over ``bs`` requests, with the retrieve
    lists the tree builder would give it (children in index order)."""
    n = len(HAND_PARENTS)
    first, sibling = [-1] * n, [-1] * n
    for v in range(n - 1, 0, -1):  # from the last node back, so each first child ends up first
        p = HAND_PARENTS[v]
        sibling[v], first[p] = first[p], v
    rows = lambda x: torch.tensor(x, device=device).expand(bs, n).contiguous()  # noqa: E731
    depth = [0] * n
    for v in range(1, n):
        depth[v] = depth[HAND_PARENTS[v]] + 1
    index = torch.arange(bs * n, device=device).view(bs, n)
    return DraftTree(rows(HAND_TOKENS), torch.ones(bs * n * n, dtype=torch.bool, device=device),
                     (10 + torch.tensor(depth, device=device)).repeat(bs), index, rows(first), rows(sibling),
                     topk=3, depth=max(depth), tree_mask_mode=1)


def children_of(tree: DraftTree, b: int):
    """{node: [children]} of request b, walked along the retrieve lists (one request, in Python)."""
    first, sibling = tree.retrive_next_token[b].tolist(), tree.retrive_next_sibling[b].tolist()
    out = {}
    for v in range(len(first)):
        kids, c = [], first[v]
        while c != -1:
            kids.append(c)
            c = sibling[c]
        out[v] = kids
    return out


def brute_force(tree: DraftTree, probs: torch.Tensor, b: int = 0):
    """(expected accepted length, per depth) of request b by enumerating every sequence of
    ``depth`` target samples: while the samples follow the tree each is drawn from the current
    node's distribution, after the first miss from a uniform one; a node is accepted when the
    samples reach it."""
    kids = children_of(tree, b)
    tokens = tree.draft_tokens[b].tolist()
    p = probs[b].double()
    vocab, depth = p.shape[1], tree.depth
    per_depth = [0.0] * depth
    for seq in itertools.product(range(vocab), repeat=depth):
        prob, node, matched = 1.0, 0, 0
        for t in seq:
            if node is None:
                prob /= vocab
                continue
            prob *= float(p[node, t])
            node = next((c for c in kids[node] if tokens[c] == t), None)
            if node is not None:
                matched += 1
        for d in range(matched):
            per_depth[d] += prob
    return 1.0 + sum(per_depth), per_depth


def random_probs(bs: int, n: int, vocab: int, seed: int, peak: float = 2.0, device: str = "cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(bs, n, vocab, generator=g) * peak).softmax(-1).to(device)


def test_parents_of_the_hand_tree():
    assert tree_parents(hand_tree(2)).tolist() == [HAND_PARENTS, HAND_PARENTS]


@pytest.mark.parametrize("seed", [0, 1, 2], ids=lambda s: f"seed{s}")
def test_bound_matches_brute_force_on_the_hand_tree(seed):
    tree = hand_tree(2)
    probs = random_probs(2, tree.num_draft_tokens, VOCAB, seed)
    bound = acceptance_bound(tree, probs)
    assert bound.per_depth.shape == (2, 3)
    for b in range(2):
        expected, per_depth = brute_force(tree, probs, b)
        assert float(bound.expected[b]) == pytest.approx(expected, abs=1e-5)
        assert bound.per_depth[b].tolist() == pytest.approx(per_depth, abs=1e-5)
    # A node's path probability is the product of its edges: node 6 = p0(2) p1(1) p4(2).
    p = probs[0]
    assert float(bound.path_probs[0, 6]) == pytest.approx(float(p[0, 2] * p[1, 1] * p[4, 2]), rel=1e-5)


def _built_tree(bs: int, depth: int, topk: int, nodes: int, vocab: int, seed: int) -> DraftTree:
    """A tree from the tree builder over random draft scores (distinct tokens per frontier node)."""
    g = torch.Generator().manual_seed(seed)
    steps, frontier = [], None
    for step in range(depth):
        rows = bs if step == 0 else bs * topk
        scores = torch.rand(rows, topk, generator=g).sort(-1, descending=True).values
        tokens = torch.stack([torch.randperm(vocab, generator=g)[:topk] for _ in range(rows)])
        if step == 0:
            frontier = scores
            parents = torch.arange(-1, topk).expand(bs, topk + 1)
            steps.append(DraftStep(scores.unsqueeze(1), tokens, parents))
            continue
        expanded = frontier.unsqueeze(2) * scores.view(bs, topk, topk)
        frontier, chosen = torch.topk(expanded.flatten(1), topk, dim=-1)
        steps.append(DraftStep(expanded, tokens.view(bs, topk * topk), chosen + (topk * topk * (step - 1) + topk)))
    return build_draft_tree(torch.zeros(bs, dtype=torch.long), torch.full((bs,), 7), steps, nodes)


@pytest.mark.parametrize("shape", [(3, 2, 6), (3, 1, 4), (2, 3, 7)], ids=["tree3x2n6", "chain3", "tree2x3n7"])
def test_bound_matches_brute_force_on_built_trees(shape):
    depth, topk, nodes = shape
    tree = _built_tree(2, depth, topk, nodes, vocab=4, seed=depth * 10 + topk)
    probs = random_probs(2, nodes, 4, seed=5)
    bound = acceptance_bound(tree, probs)
    for b in range(2):
        expected, per_depth = brute_force(tree, probs, b)
        assert float(bound.expected[b]) == pytest.approx(expected, abs=1e-5)
        assert bound.per_depth[b].tolist() == pytest.approx(per_depth, abs=1e-5)


def test_graft_padding_nodes_count_for_nothing():
    """Hybrid drafting: request 0 gets a lookup chain of 2 new nodes, request 1 padding nodes
    that no retrieve list reaches."""
    tree = _built_tree(2, 2, 2, 5, vocab=4, seed=3)
    held = {int(tree.draft_tokens[0, c]) for c in children_of(tree, 0)[0]}
    chain = [min(set(range(4)) - held), 2]  # a token none of the root's children holds
    grafted, _ = graft_chains(tree, [chain, []], [2, 2])
    assert grafted.num_draft_tokens == 7
    probs = random_probs(2, 7, 4, seed=9)
    bound = acceptance_bound(grafted, probs)
    parents = tree_parents(grafted)
    assert parents[1, 5:].tolist() == [-1, -1] and bound.path_probs[1, 5:].tolist() == [0.0, 0.0]
    for b in range(2):
        expected, per_depth = brute_force(grafted, probs, b)
        assert float(bound.expected[b]) == pytest.approx(expected, abs=1e-5)


def test_bad_probs_are_named():
    tree = hand_tree(1)
    with pytest.raises(ValueError, match=r"acceptance_bound: target_probs must be \[bs, N, V\] = \[1, 8, V\]"):
        acceptance_bound(tree, torch.rand(1, 7, VOCAB))
    with pytest.raises(TypeError, match="acceptance_bound: target_probs must be floating point"):
        acceptance_bound(tree, torch.ones(1, 8, VOCAB, dtype=torch.long))


# --- Monte Carlo: the target-only verifier attains the bound -------------------------------------
# 40,000 rounds of one tree and one set of distributions; the mean accepted length must lie
# within 4.5 standard errors of the bound (a false alarm once in ~150,000 runs). The controls:
# a lossy verifier (threshold_acc 0.5 doubles every acceptance probability) lands far above it,
# and a wrong bound (edge probabilities summed without the product along the path) far from
# the measured mean.
TRIALS = 40_000
SIGMAS = 4.5


def _monte_carlo(device: str, **verify_kwargs):
    tree = hand_tree(TRIALS, device)
    logits = torch.randn(tree.num_draft_tokens, VOCAB, generator=torch.Generator().manual_seed(11))
    for v in range(1, tree.num_draft_tokens):  # a target that mostly agrees with the tree, as a trained draft's
        logits[HAND_PARENTS[v], HAND_TOKENS[v]] += 2.0
    probs = logits.softmax(-1).to(device).expand(TRIALS, -1, -1)
    g = torch.Generator(device=device).manual_seed(1234)
    result = verify_sampling(tree, probs.contiguous(), generator=g, **verify_kwargs)
    accepted = result.accept_length.double().cpu()
    return tree, probs, accepted


@pytest.mark.parametrize("device", DEVICES)
def test_target_only_verifier_attains_the_bound(device):
    tree, probs, accepted = _monte_carlo(device)
    bound = acceptance_bound(hand_tree(1, device), probs[:1].contiguous())
    se = float(accepted.std()) / TRIALS ** 0.5
    mean = 1.0 + float(accepted.mean())
    assert abs(mean - float(bound.expected[0])) < SIGMAS * se, (mean, float(bound.expected[0]), se)
    for d in range(tree.depth):  # the fraction of rounds reaching depth d + 1
        reached = (accepted > d).double()
        se_d = max(float(reached.std()), 1e-3) / TRIALS ** 0.5
        assert abs(float(reached.mean()) - float(bound.per_depth[0, d])) < SIGMAS * se_d, d
    # Negative control 1: the path product matters (summing edge probabilities is wrong).
    edges = bound.path_probs.new_tensor([float(probs[0, p, t]) for p, t in zip(HAND_PARENTS[1:], HAND_TOKENS[1:])])
    assert abs(mean - (1.0 + float(edges.sum()))) > 10 * SIGMAS * se


@pytest.mark.parametrize("device", DEVICES)
def test_a_lossy_verifier_beats_the_bound(device):
    """Negative control 2: the bound holds for lossless verification only; the test above would
    fail for a verifier that accepts more than the target's samples allow."""
    tree, probs, accepted = _monte_carlo(device, threshold_acc=0.5)
    bound = acceptance_bound(hand_tree(1, device), probs[:1].contiguous())
    se = float(accepted.std()) / TRIALS ** 0.5
    assert 1.0 + float(accepted.mean()) > float(bound.expected[0]) + 10 * SIGMAS * se


# --- accumulated during a sampled generation -------------------------------------------------------

@pytest.fixture(scope="module")
def small_vocab_pair():
    from sampling_stats import make_small_vocab_pair
    return make_small_vocab_pair()


def _sampled_stats(pair, verifier=None, monkeypatch=None, **kwargs):
    from eagle3_ext.api import SpeculativeGenerator, TreeConfig

    if verifier is not None:
        from eagle3_ext.decoding import batch as batch_module
        monkeypatch.setattr(batch_module, "verify_sampling", verifier)
    gen = SpeculativeGenerator(*pair, TreeConfig(depth=3, topk=2, num_draft_tokens=6, lookup_tokens=0),
                               attention="sdpa")
    out = gen.generate([[1, 5, 2]] * 200, max_new_tokens=16, eos_token_id=[], seed=0, return_dict_in_generate=True,
                       **kwargs)
    return out.stats


def test_sampled_generation_accumulates_the_bound(small_vocab_pair, monkeypatch):
    import functools

    from eagle3_ext.decoding import tree as tree_module

    s = _sampled_stats(small_vocab_pair, do_sample=True, temperature=1.0, top_k=0)
    assert s.bound_rounds == s.request_rounds > 0 and len(s.depth_bound) == 3 and s.bound_time_s > 0
    assert 1.0 < s.acceptance_bound < 4.0 and len(s.depth_acceptance_bound) == 3
    assert s.depth_acceptance_bound == sorted(s.depth_acceptance_bound, reverse=True)  # a path needs its prefix
    # The bound is each round's conditional expectation of the accepted length A, so the mean
    # of A - bound is 0. Its per-round variance is at most E[(A - 1)^2] <= depth * E[A - 1]
    # (A - 1 <= depth), hence a standard error of at most sqrt(3 (bound - 1) / rounds); 4.5 of
    # them is the allowance.
    allowance = SIGMAS * (3 * (s.acceptance_bound - 1) / s.request_rounds) ** 0.5
    assert abs(s.acceptance_length - s.acceptance_bound) < allowance, (s.acceptance_length, s.acceptance_bound)
    assert s.bound_ratio == pytest.approx(s.acceptance_length / s.acceptance_bound)
    d = s.as_dict()
    assert d["acceptance_bound"] == s.acceptance_bound and d["bound_ratio"] == s.bound_ratio
    assert s.other_time_s < s.total_time_s - s.bound_time_s + 1e-9  # the bound's time is its own part
    # Negative control: a lossy verifier (threshold_acc 0.3) keeps more than the bound allows.
    lossy = _sampled_stats(small_vocab_pair, functools.partial(tree_module.verify_sampling, threshold_acc=0.3),
                           monkeypatch, do_sample=True, temperature=1.0, top_k=0)
    assert lossy.acceptance_length > lossy.acceptance_bound + allowance


def test_greedy_generation_measures_no_bound(small_vocab_pair):
    s = _sampled_stats(small_vocab_pair, do_sample=False)
    assert s.bound_rounds == 0 and s.depth_bound == [] and s.bound_time_s == 0.0
    assert s.acceptance_bound is None and s.bound_ratio is None and s.depth_acceptance_bound == []


def test_combined_stats_keep_the_bound():
    from eagle3_ext.api.stats import GenerationStats

    a = GenerationStats(request_rounds=2, accepted_drafts=3, depth_accepted=[2, 1], bound_rounds=2,
                        depth_bound=[1.5, 0.5])
    b = GenerationStats(request_rounds=2, accepted_drafts=5, depth_accepted=[2, 2, 1], bound_rounds=2,
                        depth_bound=[1.8, 1.2, 1.0])
    both = GenerationStats.combine([a, b])
    assert both.depth_accepted == [4, 3, 1] and both.depth_bound == pytest.approx([3.3, 1.7, 1.0])
    assert both.acceptance_bound == pytest.approx(1 + 6.0 / 4) and both.acceptance_length == pytest.approx(3.0)
    assert both.depth_acceptance_bound == pytest.approx([3.3 / 4, 1.7 / 4, 1.0 / 4])


# --- eagle3 bench --temperature ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    from tiny_models import make_trained_pair

    d = tmp_path_factory.mktemp("bench_sampled")
    make_trained_pair(str(d), layers=4, steps=30)
    (d / "prompts.jsonl").write_text("\n".join(json.dumps({"prompt": p}) for p in
                                               ["def print return", "class value key"]) + "\n")
    return d


def test_bench_reports_the_bound_per_temperature(tiny_pair, capsys):
    from eagle3_ext.cli import main as cli_main

    out = tiny_pair / "out"
    rc = cli_main(["bench", "--target", str(tiny_pair / "target"), "--draft", str(tiny_pair / "draft"), "--prompts",
                   str(tiny_pair / "prompts.jsonl"), "--max-new-tokens", "12", "--batch-sizes", "1",
                   "--tree", "3,1,4", "3,2,6", "3,1,4,sampled", "--temperature", "0", "0.7", "--top-p", "0.95",
                   "--top-k", "20",
                   "--no-compiled-baseline", "--no-llama-cpp", "--out", str(out), "--json"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    greedy, sampled = report["runs"]
    assert greedy["temperature"] == 0.0 and all(r["identical"] for r in greedy["results"])  # greedy as before
    assert "acceptance_bound" not in greedy["results"][-1]
    assert "chain3-sampled" not in [r["method"] for r in greedy["results"]]  # a sampling configuration only
    assert (sampled["batch_size"], sampled["temperature"], sampled["top_p"], sampled["top_k"]) == (1, 0.7, 0.95, 20)
    methods = [r["method"] for r in sampled["results"]]
    assert methods == ["hf_generate", "chain3", "tree3x2n6", "chain3-sampled"]  # no greedy-only peers
    for r in sampled["results"][1:]:
        assert r["identical"] is None and "divergences" not in r  # sampling is not token-identical
        assert r["tokens_per_s"] > 0 and r["speedup"] > 0
        assert 1.0 <= r["acceptance_length"] <= 4.0 and 1.0 <= r["acceptance_bound"] <= 4.0
        assert r["bound_ratio"] == pytest.approx(r["acceptance_length"] / r["acceptance_bound"])
        assert len(r["depth_acceptance"]) == len(r["depth_acceptance_bound"]) == 3
        cost = r["round_cost"]
        assert cost["bound"] > 0 and cost["r"] > 0
        parts = sum(cost[k] for k in ("draft", "tree", "verify", "accept", "bound", "compact", "other"))
        assert parts == pytest.approx(cost["r"])
    md = (out / "bench.md").read_text()
    assert "**batch 1, sampling at temperature 0.7, top-p 0.95, top-k 20**" in md
    assert md.count("| chain3 |") == 2 and "speedup vs HF sampling" in md and " + bound " in md


def test_bench_sampling_options_are_checked():
    from eagle3_ext.bench.suite import BenchConfig

    def check(**kwargs):
        BenchConfig(prompts=["def f():"], batch_sizes=[1], **kwargs).validate()

    check(temperatures=[0.0, 0.7, 1.0], top_p=0.9, top_k=5)
    with pytest.raises(ValueError, match=r"temperatures\[1\] must be a number >= 0, got -1"):
        check(temperatures=[0.7, -1])
    with pytest.raises(TypeError, match="temperatures must be a non-empty list of numbers >= 0"):
        check(temperatures=0.7)
    with pytest.raises(ValueError, match=r"temperatures must be distinct \(one run each\), got \[0.7, 0.7\]"):
        check(temperatures=[0.7, 0.7])
    with pytest.raises(ValueError, match=r"top_p must be a number in \(0, 1\], got 0"):
        check(temperatures=[0.7], top_p=0)
    with pytest.raises(ValueError, match="top_k must be a non-negative integer, got -1"):
        check(temperatures=[0.7], top_k=-1)
    with pytest.raises(ValueError, match=r"top_p=0.9 / top_k=0 filter the sampled runs, but temperatures \[0.0\]"):
        check(top_p=0.9)


def test_generate_reports_the_bound_when_sampling(tiny_pair, capsys):
    from eagle3_ext.cli import main as cli_main

    pair = ["generate", "--target", str(tiny_pair / "target"), "--draft", str(tiny_pair / "draft"), "--prompt",
            "def print return", "--max-new-tokens", "16", "--depth", "3", "--json"]
    assert cli_main(pair + ["--temperature", "0.8"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert 1.0 <= report["acceptance_bound"] <= 4.0 and len(report["depth_acceptance_bound"]) >= 3
    assert cli_main(pair) == 0  # greedy: no bound
    report = json.loads(capsys.readouterr().out)
    assert report["acceptance_bound"] is None and report["depth_acceptance_bound"] == []
