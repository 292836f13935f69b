"""compile=True: the verify forward as one compiled graph over a static cache. Token-identical
to the target's greedy decoding with hybrid drafting (trees of varying size, padded to a few
sizes) and with requests leaving a batch; the shapes compile once and not again."""

import copy

import pytest
import torch

from eagle3_ext import Eagle3DraftModel
from eagle3_ext.engine import SpeculativeGenerator, TreeConfig
from eagle3_ext.engine.baseline import hf_generate
from eagle3_ext.engine.compiled_verify import CAPACITY_MULTIPLE, inductor_settings, node_buckets, static_capacity
from tiny_models import make_trained_pair

PROMPTS = ["def value key item value key item value key", "class index count index count",
           "for while if else for while if"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("compiled")
    target, tok = make_trained_pair(str(d), layers=4, steps=20)
    draft = Eagle3DraftModel.from_pretrained(str(d / "draft"), target_config=target.config)
    return target, tok, draft


def test_buckets_and_capacity():
    assert node_buckets(16, 0) == [16]                 # without lookup every tree is full
    assert node_buckets(16, 10) == [6, 11, 16]         # a round without a lookup match has 6 nodes
    assert node_buckets(4, 10) == [1, 3, 4]
    assert static_capacity(100, 128, 16) == CAPACITY_MULTIPLE
    assert static_capacity(CAPACITY_MULTIPLE, 1, 16) == 2 * CAPACITY_MULTIPLE


def test_inductor_settings(monkeypatch):
    autotuned = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN",
                 "autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}
    monkeypatch.setenv("EAGLE3_COMPILE_AUTOTUNE", "1")
    monkeypatch.setenv("EAGLE3_COMPILE_CPP_WRAPPER", "1")
    assert inductor_settings(torch.device("cpu")) == {**autotuned, "cpp_wrapper": True}
    assert inductor_settings(torch.device("cuda")) == {}
    monkeypatch.setenv("EAGLE3_COMPILE_CPP_WRAPPER", "0")
    assert inductor_settings(torch.device("cpu")) == autotuned
    monkeypatch.setenv("EAGLE3_COMPILE_AUTOTUNE", "0")
    assert inductor_settings(torch.device("cpu")) == {"freezing": True}
    monkeypatch.delenv("EAGLE3_COMPILE_AUTOTUNE")
    monkeypatch.delenv("EAGLE3_COMPILE_CPP_WRAPPER")
    assert inductor_settings(torch.device("cpu")) == {**autotuned, "cpp_wrapper": True}  # both on by default
    for name in ("EAGLE3_COMPILE_AUTOTUNE", "EAGLE3_COMPILE_CPP_WRAPPER"):
        monkeypatch.setenv(name, "yes")
        with pytest.raises(ValueError, match=f"{name} must be 0 or 1, got 'yes'"):
            inductor_settings(torch.device("cpu"))
        monkeypatch.setenv(name, "1")


def test_compiled_greedy_is_token_identical_and_compiles_once(pair):
    target, tok, draft = pair
    gen = SpeculativeGenerator(target, draft, TreeConfig(3, 2, 8, lookup_tokens=4), tokenizer=tok, compile=True)
    # A stop token the first row emits early: rows finish at different rounds and the batch
    # shrinks (a smaller batch is another shape).
    stop = hf_generate(target, tok, PROMPTS[:1], 24, stop_at_eos=False)[0][0][5]
    expected = hf_generate(target, tok, PROMPTS, 24, eos_token_id=stop)[0]
    assert len({len(e) for e in expected}) > 1
    first = gen.generate(PROMPTS, max_new_tokens=24, eos_token_id=stop, return_dict_in_generate=True)
    assert first.new_tokens == expected
    assert first.stats.compile_time_s > 0
    again = gen.generate(PROMPTS, max_new_tokens=24, eos_token_id=stop, return_dict_in_generate=True)
    assert again.new_tokens == expected
    assert again.stats.compile_time_s == 0  # the same shapes: nothing compiled a second time


def test_autotuned_frozen_graphs_follow_each_call_and_each_model(pair, monkeypatch):
    """The CPU graphs as users get them (weights frozen, GEMMs autotuned, C++ wrapper): token-identical to
    greedy decoding over consecutive calls (each with a new static cache) and for a second
    target of the same shape but other weights (frozen constants belong to one generator)."""
    monkeypatch.setenv("EAGLE3_COMPILE_AUTOTUNE", "1")
    monkeypatch.setenv("EAGLE3_COMPILE_CPP_WRAPPER", "1")
    target, tok, draft = pair
    other = copy.deepcopy(target)
    with torch.no_grad():
        for p in other.model.layers[-1].mlp.parameters():
            p.mul_(1.5)
    for model in (target, other):
        gen = SpeculativeGenerator(model, draft, TreeConfig.chain(3), tokenizer=tok, compile=True)
        for prompt in PROMPTS[:2]:
            expected = hf_generate(model, tok, [prompt], 16)[0]
            assert gen.generate(prompt, max_new_tokens=16, return_dict_in_generate=True).new_tokens == expected
    assert hf_generate(other, tok, PROMPTS[:2], 16)[0] != hf_generate(target, tok, PROMPTS[:2], 16)[0]


def test_compiled_batch_shrinks_to_powers_of_two_with_mirrors(pair, monkeypatch):
    """Four requests, one finishing first: the three left run as four rows, one a mirror of a
    running request whose tokens are dropped; outputs stay identical to plain greedy decoding."""
    from eagle3_ext.engine.batch import Batch

    target, tok, draft = pair
    prompts = PROMPTS + ["return value key item value"]
    gen = SpeculativeGenerator(target, draft, TreeConfig.chain(3), tokenizer=tok, compile=True)
    stop = hf_generate(target, tok, prompts[:1], 24, stop_at_eos=False)[0][0][3]
    expected = hf_generate(target, tok, prompts, 24, eos_token_id=stop)[0]
    sizes = []
    drop = Batch._drop_finished

    def spy(self):
        drop(self)
        sizes.append((len(self.active), sum(self.mirror)))

    monkeypatch.setattr(Batch, "_drop_finished", spy)
    out = gen.generate(prompts, max_new_tokens=24, eos_token_id=stop, return_dict_in_generate=True)
    assert out.new_tokens == expected
    assert {size for size, _ in sizes} <= {4, 2, 1}
    assert any(mirrors for _, mirrors in sizes), sizes
    # Mirrors are not counted: the same rounds and accepted tokens as the eager generator's.
    eager = SpeculativeGenerator(target, draft, TreeConfig.chain(3), tokenizer=tok)
    want = eager.generate(prompts, max_new_tokens=24, eos_token_id=stop, return_dict_in_generate=True).stats
    assert (out.stats.request_rounds, out.stats.accepted_drafts) == (want.request_rounds, want.accepted_drafts)


def test_compile_is_checked(pair):
    target, tok, draft = pair
    with pytest.raises(TypeError, match="compile must be True or False, got 'yes'"):
        SpeculativeGenerator(target, draft, tokenizer=tok, compile="yes")
    with pytest.raises(ValueError, match="compile=True needs attention='tree'"):
        SpeculativeGenerator(target, draft, tokenizer=tok, attention="sdpa", compile=True)
    assert torch.compiler.is_compiling() is False
