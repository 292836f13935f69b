"""compile=True on the draft side: ``extend`` with its pairs padded to one size and the whole
draft-step loop as one graph. Both are checked against the eager functions they compile (the
reference semantics: same candidates, same cache), the sampled chain's exponential-race draw
against the draft's distribution, and the graphs against recompilation."""

import pytest
import torch

from eagle3_ext.compiled.draft import CompiledDraft, draft_capacity, pad_pairs, pairs_sizes
from eagle3_ext.compiled.verify import CAPACITY_MULTIPLE
from eagle3_ext.api.config import SamplingConfig, TreeConfig
from eagle3_ext.decoding.drafting import (DraftInputs, DraftSampler, draft_cache_capacity, draft_steps, extend,
                                        extend_and_steps)
from conftest import FAST_COMPILE
from sampling_stats import chi_square_bound
from tiny_models import DRAFT_VOCAB, H, VOCAB, make_draft


def _inputs(b, n, counts, seed=0):
    g = torch.Generator().manual_seed(seed)
    return DraftInputs(torch.randn(b, n, H, generator=g), torch.randint(0, VOCAB, (b, n), generator=g),
                       (torch.arange(n) + 40).expand(b, n).clone(), torch.tensor(counts))


def _primed_cache(draft, b, capacity, seed=1):
    """A cache holding a committed prompt of 40 pairs per request."""
    cache = draft.new_cache(b, capacity)
    prompt = _inputs(b, 40, [40] * b, seed)
    prompt.positions = torch.arange(40).expand(b, 40).clone()
    extend(draft, cache, prompt)
    return cache


def test_sizes_and_padding():
    assert pairs_sizes(TreeConfig.chain(5)) == [6]
    assert pairs_sizes(TreeConfig(3, 2, 8, lookup_tokens=10)) == [4, 11]   # a lookup chain can be accepted whole
    tree = TreeConfig(4, 2, 10)
    assert draft_capacity(tree, 100, 50) % CAPACITY_MULTIPLE == 0
    assert draft_capacity(tree, 100, 50) >= draft_cache_capacity(tree, 100, 50)
    x = _inputs(2, 3, [3, 1])
    padded = pad_pairs(x, 5)
    assert padded.tokens.shape == (2, 5) and torch.equal(padded.tokens[:, :3], x.tokens)
    assert torch.equal(padded.tokens[:, 3:], x.tokens[:, 2:].expand(2, 2))
    assert torch.equal(padded.counts, x.counts)
    assert pad_pairs(x, 3) is x


def test_output_index_keeps_one_row_per_request():
    draft = make_draft(seed=3)
    x = _inputs(2, 4, [4, 2])
    with torch.no_grad():
        full = draft(x.tokens, x.features, x.positions)
        one = draft(x.tokens, x.features, x.positions, output_index=torch.tensor([3, 1]))
    assert one.logits.shape == (2, 1, DRAFT_VOCAB)
    torch.testing.assert_close(one.logits[:, 0], full.logits[[0, 1], [3, 1]])
    torch.testing.assert_close(one.hidden[:, 0], full.hidden[[0, 1], [3, 1]])


@pytest.mark.parametrize("tree", [TreeConfig.chain(5), TreeConfig(4, 2, 8), TreeConfig.chain(4, sampled=True)],
                         ids=["chain", "topk2", "sampled"])
def test_compiled_round_equals_eager_extend_then_steps(tree):
    """One graph for a round's draft side: padding pairs are written past the real ones but neither
    seen by them nor committed; the candidates and the committed cache are eager extend's and
    draft_steps'. The prompt's pairs (more than a padded size) extend eagerly, then run the step
    loop's graph."""
    draft = make_draft(seed=4)
    b = 2
    seq_lens = torch.tensor([43, 42])
    compiled = CompiledDraft("cpu", FAST_COMPILE)

    def run(pairs, fn):
        cache = _primed_cache(draft, b, 128)
        sampler = DraftSampler(draft, SamplingConfig(temperature=0.9), torch.Generator().manual_seed(2), b,
                               tree.depth) if tree.sampled else None
        steps = fn(draft, cache, pairs, seq_lens, tree, sampler)
        return steps, sampler, cache

    with torch.no_grad():
        for pairs in (_inputs(b, 3, [3, 2]), _inputs(b, 12, [12, 9])):
            want, want_sampler, want_cache = run(pairs, extend_and_steps)
            got, got_sampler, got_cache = run(pairs, compiled.round)
            assert len(got) == len(want) == tree.depth
            for g, w in zip(got, want):
                assert torch.equal(g.tokens, w.tokens) and torch.equal(g.parents, w.parents)
                torch.testing.assert_close(g.scores, w.scores, rtol=1e-5, atol=1e-6)
            if tree.sampled:
                torch.testing.assert_close(torch.stack(got_sampler.rows), torch.stack(want_sampler.rows))
            assert torch.equal(got_cache.prefix_lens, want_cache.prefix_lens)
            assert got_cache.tree_len == want_cache.tree_len == (tree.depth - 1) * tree.topk
            for layer in range(len(want_cache.keys)):
                for row, length in enumerate((want_cache.prefix_lens + want_cache.tree_len).tolist()):
                    for buf in ("keys", "values"):
                        torch.testing.assert_close(getattr(got_cache, buf)[layer][row, :length],
                                                   getattr(want_cache, buf)[layer][row, :length], rtol=1e-5, atol=1e-5)
    compiled_once = compiled.compile_s
    with torch.no_grad():
        run(_inputs(b, 3, [1, 3], seed=5), compiled.round)
    assert compiled.compile_s == compiled_once   # the same padded size: nothing compiled again


@pytest.mark.parametrize("tree", [TreeConfig(4, 2, 8), TreeConfig.chain(4, sampled=True)], ids=["topk2", "sampled"])
def test_compiled_steps_equal_eager_steps_and_compile_once(tree):
    draft = make_draft(seed=5)
    b = 3
    root_logits = torch.randn(b, DRAFT_VOCAB, generator=torch.Generator().manual_seed(6))
    root_hidden = torch.randn(b, H, generator=torch.Generator().manual_seed(7))
    seq_lens = torch.full((b,), 40)
    sampling = SamplingConfig(temperature=0.9)
    compiled = CompiledDraft("cpu", FAST_COMPILE)

    def run(fn, seed):
        cache = _primed_cache(draft, b, 128)
        sampler = DraftSampler(draft, sampling, torch.Generator().manual_seed(seed), b, tree.depth) \
            if tree.sampled else None
        steps = fn(draft, cache, root_logits, root_hidden, seq_lens, tree, sampler)
        return steps, sampler, cache

    with torch.no_grad():
        for seed in (0, 1):
            want, want_sampler, want_cache = run(draft_steps, seed)
            got, got_sampler, got_cache = run(compiled.steps, seed)
            assert len(got) == len(want) == tree.depth
            for g, w in zip(got, want):
                assert torch.equal(g.tokens, w.tokens) and torch.equal(g.parents, w.parents)
                torch.testing.assert_close(g.scores, w.scores, rtol=1e-5, atol=1e-6)
            assert got_cache.tree_len == want_cache.tree_len == (tree.depth - 1) * tree.topk
            if tree.sampled:
                torch.testing.assert_close(torch.stack(got_sampler.rows), torch.stack(want_sampler.rows))
            if seed == 0:
                compiled_once = compiled.compile_s
    assert compiled_once > 0 and compiled.compile_s == compiled_once   # the second call compiled nothing


def test_exponential_race_draws_from_the_draft_distribution():
    """The sampled chain's draw (argmax of q / -log u over pre-drawn uniforms) follows q, with
    top-k filtering; a lossy control (argmax of q + u) fails the same test."""
    draft = make_draft(seed=8)
    trials, vocab = 20000, DRAFT_VOCAB
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(9)) * 1.5
    sampling = SamplingConfig(temperature=0.8, top_k=12)
    sampler = DraftSampler(draft, sampling, torch.Generator().manual_seed(10), trials, 1)
    q_token, target_ids = sampler(logits.expand(trials, vocab))
    q = sampler.rows[0][0]
    assert int((q > 0).sum()) == 12
    draft_ids = (target_ids[:, 0] - draft.d2t[0]) // 2                      # target id = 2 i here
    counts = torch.bincount(draft_ids, minlength=vocab).double()
    assert counts[q == 0].sum() == 0
    torch.testing.assert_close(q_token[:, 0], q[draft_ids])

    def statistic(observed):
        expected = q.double() * trials
        keep = expected > 0
        return float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum()), int(keep.sum()) - 1

    stat, dof = statistic(counts)
    assert stat < chi_square_bound(dof), f"chi-square {stat:.1f} with {dof} dof"
    biased = torch.bincount((q + sampler.noise[0]).argmax(-1), minlength=vocab).double()
    stat, dof = statistic(biased)
    assert stat > chi_square_bound(dof), f"biased draw passed: chi-square {stat:.1f} with {dof} dof"

def test_later_calls_run_the_graph_of_their_own_model_and_settings():
    """After a key's first call only the guards that tell graphs apart are evaluated: two drafts
    of one shape (their weights frozen into their graphs) and two temperatures, interleaved,
    must each still run their own graph."""
    tree = TreeConfig.chain(4, sampled=True)
    b = 2
    root_logits = torch.randn(b, DRAFT_VOCAB, generator=torch.Generator().manual_seed(6))
    root_hidden = torch.randn(b, H, generator=torch.Generator().manual_seed(7))
    seq_lens = torch.full((b,), 40)
    drafts = {"a": make_draft(seed=5), "b": make_draft(seed=8)}
    compiled = {name: CompiledDraft("cpu", FAST_COMPILE) for name in drafts}

    def run(name, fn, temperature):
        draft = drafts[name]
        cache = _primed_cache(draft, b, 128)
        sampler = DraftSampler(draft, SamplingConfig(temperature=temperature), torch.Generator().manual_seed(3), b,
                               tree.depth)
        steps = fn(draft, cache, root_logits, root_hidden, seq_lens, tree, sampler)
        return [s.tokens for s in steps], torch.stack(sampler.rows)

    with torch.no_grad():
        for name, temperature in [("a", 0.9), ("b", 0.9), ("a", 1.7), ("a", 0.9), ("b", 1.7), ("b", 0.9),
                                  ("a", 1.7)]:
            want_tokens, want_rows = run(name, draft_steps, temperature)
            got_tokens, got_rows = run(name, compiled[name].steps, temperature)
            assert all(torch.equal(g, w) for g, w in zip(got_tokens, want_tokens)), (name, temperature)
            torch.testing.assert_close(got_rows, want_rows, msg=f"draft {name}, temperature {temperature}")
