import copy
import functools
import logging
import os

import pytest
import torch

from eagle3_ext import Eagle3DraftModel
from eagle3_ext.api import SpeculativeGenerator, TreeConfig
from eagle3_ext.decoding import batch as batch_module
from eagle3_ext.bench.baseline import hf_generate
from eagle3_ext.train.trainer import draft_config_for
from conftest import FAST_COMPILE
from sampling_stats import chi_square, chi_square_bound, exact_joint, make_small_vocab_pair, sample_joint
from recording_streamer import RecordingStreamer
from tiny_models import make_trained_pair

PROMPTS = ["def print return", "class value key item index count", "for while if else", "import",
           "lambda yield self print range len list dict", "try except with as"]
TREES = [TreeConfig.chain(3), TreeConfig(depth=3, topk=2, num_draft_tokens=6),
         TreeConfig(depth=5, topk=4, num_draft_tokens=16)]


TRAINED_DIRS = {}  # architecture -> directory with target/ and draft/


@pytest.fixture(scope="module", params=["llama", "qwen2", "mistral"])
def trained(request, tmp_path_factory):
    """A tiny target of each architecture with a draft trained on it (acceptance > 1)."""
    d = tmp_path_factory.mktemp(request.param)
    target, tok = make_trained_pair(str(d), arch=request.param)
    draft = Eagle3DraftModel.from_pretrained(str(d / "draft"), target_config=target.config)
    TRAINED_DIRS[request.param] = d
    return request.param, target, tok, draft


def hf_greedy(target, tok, prompts, max_new_tokens, eos=None):
    """Hugging Face's greedy generate, up to ``eos`` when given (none otherwise)."""
    return hf_generate(target, tok, prompts, max_new_tokens, stop_at_eos=eos is not None, eos_token_id=eos)[0]


@pytest.mark.parametrize("attention", ["tree", "sdpa"])
@pytest.mark.parametrize("tree", TREES, ids=["chain3", "tree3x2n6", "tree5x4n16"])
def test_greedy_is_token_identical(trained, tree, attention):
    arch, target, tok, draft = trained
    gen = SpeculativeGenerator(target, draft, tree, tokenizer=tok, attention=attention)
    expected = hf_greedy(target, tok, PROMPTS, 24)
    batched = gen.generate(PROMPTS, max_new_tokens=24, eos_token_id=[], return_dict_in_generate=True)
    assert batched.new_tokens == expected
    assert batched.stats.acceptance_length > 1.0  # the draft's tokens were really used
    for prompt, want in zip(PROMPTS[:2], expected[:2]):  # batch 1
        assert gen.generate(prompt, max_new_tokens=24, eos_token_id=[], return_dict_in_generate=True).new_tokens == [want]


def test_tree_attention_survives_a_switch_to_sdpa(trained):
    # A plain target.generate with SDPA between speculative calls (as a benchmark does) must not
    # leave the verify forward ignoring the tree mask.
    arch, target, tok, draft = trained
    gen = SpeculativeGenerator(target, draft, TreeConfig(5, 4, 16), tokenizer=tok)
    target.set_attn_implementation("sdpa")
    expected = hf_greedy(target, tok, PROMPTS[:1], 24)
    assert gen.generate(PROMPTS[0], max_new_tokens=24, eos_token_id=[], return_dict_in_generate=True).new_tokens == expected


def test_stop_at_eos_and_stop_strings(trained):
    _, target, tok, draft = trained
    gen = SpeculativeGenerator(target, draft, TREES[1], tokenizer=tok)
    free = gen.generate(PROMPTS[0], max_new_tokens=30, eos_token_id=[], return_dict_in_generate=True).new_tokens[0]
    eos = free[7]
    stopped = gen.generate(PROMPTS[0], max_new_tokens=30, eos_token_id=eos, return_dict_in_generate=True)
    assert stopped.new_tokens[0] == free[: free.index(eos) + 1]
    assert stopped.finish_reasons == ["eos"]
    assert stopped.new_tokens == hf_greedy(target, tok, PROMPTS[:1], 30, eos=eos)
    text = tok.decode(free[:12])
    stop = text[-3:]
    out = gen.generate(PROMPTS[0], max_new_tokens=30, eos_token_id=[], stop_strings=[stop], return_dict_in_generate=True)
    assert stop in tok.decode(out.new_tokens[0]) and stop not in tok.decode(out.new_tokens[0][:-1])
    assert out.finish_reasons == ["stop"]


def test_streaming_order(trained):
    _, target, tok, draft = trained
    gen = SpeculativeGenerator(target, draft, TREES[2], tokenizer=tok)
    streamer = RecordingStreamer()
    out = gen.generate(PROMPTS[1], max_new_tokens=20, eos_token_id=[], streamer=streamer, return_dict_in_generate=True)
    assert streamer.chunks[0] == [tok(PROMPTS[1])["input_ids"]]  # the prompt first, as HF streamers expect
    streamed = [t for chunk in streamer.chunks[1:] for t in chunk]
    assert streamed == out.new_tokens[0] and streamer.ended
    assert len(streamer.chunks) > 2


def test_stats(trained):
    _, target, tok, draft = trained
    out = SpeculativeGenerator(target, draft, TREES[2], tokenizer=tok).generate(PROMPTS, max_new_tokens=16,
                                                                                 eos_token_id=[],
                                                                                 return_dict_in_generate=True)
    s = out.stats
    assert s.new_tokens == 16 * len(PROMPTS)
    assert s.target_forwards == s.rounds + 1
    assert 1.0 <= s.acceptance_length <= TREES[2].depth + 1
    assert s.depth_acceptance == sorted(s.depth_acceptance, reverse=True)
    assert s.tokens_per_s > 0 and s.draft_time_s > 0 and s.verify_time_s > 0
    assert out.text is not None and len(out.text) == len(PROMPTS)


def test_cli_generate_json_with_baseline(trained, capsys):
    import json

    from eagle3_ext.cli import main

    arch = trained[0]
    d = TRAINED_DIRS[arch]
    rc = main(["generate", "--target", str(d / "target"), "--draft", str(d / "draft"), "--prompt", PROMPTS[0],
               "--max-new-tokens", "12", "--depth", "3", "--topk", "2", "--num-draft-tokens", "6", "--baseline",
               "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["identical"] is True
    for key in ("text", "new_tokens", "target_forwards", "acceptance_length", "tokens_per_s",
                "baseline_tokens_per_s", "speedup"):
        assert key in report
    assert report["new_tokens"] == len(report["tokens"]) <= 12


def test_cli_generate_errors(capsys, tmp_path):
    from eagle3_ext.cli import main

    assert main(["generate", "--target", str(tmp_path)]) == 2
    assert "give both --target and --draft" in capsys.readouterr().err


# --- sampling is lossless ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_vocab_pair():
    return make_small_vocab_pair()


@pytest.mark.slow
def test_sampling_matches_target_distribution(small_vocab_pair, monkeypatch):
    target, draft = small_vocab_pair
    prompt, length, temperature, trials = [1, 5, 2], 3, 0.8, 10000
    probs = exact_joint(target, prompt, length, temperature)
    stat, dof = chi_square(sample_joint(target, draft, prompt, length, temperature, trials), probs, trials)
    assert stat < chi_square_bound(dof), f"chi-square {stat:.1f} with {dof} dof"

    # Negative control: a lossy acceptance rule (sgl-kernel's threshold_acc < 1) must fail the bound.
    from eagle3_ext.decoding import tree
    monkeypatch.setattr(batch_module, "verify_sampling",
                        functools.partial(tree.verify_sampling, threshold_acc=0.3))
    stat, dof = chi_square(sample_joint(target, draft, prompt, length, temperature, trials), probs, trials)
    assert stat > chi_square_bound(dof), f"biased sampler passed: chi-square {stat:.1f} with {dof} dof"


@pytest.mark.slow
def test_sampled_draft_matches_target_distribution(small_vocab_pair, monkeypatch):
    """A chain of tokens drawn from the draft, verified with the draft's probabilities (batch
    2500 per call), samples the target's distribution; claiming the draft's q were the target's
    own (every drawn token accepted) must fail the same test."""
    target, draft = small_vocab_pair
    prompt, length, temperature, trials = [1, 5, 2], 3, 0.8, 10000
    chain = TreeConfig.chain(3, sampled=True)
    probs = exact_joint(target, prompt, length, temperature)
    counts = sample_joint(target, draft, prompt, length, temperature, trials, tree=chain)
    stat, dof = chi_square(counts, probs, trials)
    assert stat < chi_square_bound(dof), f"chi-square {stat:.1f} with {dof} dof"

    from eagle3_ext.decoding import tree
    monkeypatch.setattr(batch_module, "verify_sampling_draft_probs",
                        lambda t, p, q, generator: tree.verify_sampling_draft_probs(t, p, p, generator=generator))
    stat, dof = chi_square(sample_joint(target, draft, prompt, length, temperature, trials, tree=chain), probs,
                           trials)
    assert stat > chi_square_bound(dof), f"biased sampler passed: chi-square {stat:.1f} with {dof} dof"


@pytest.mark.slow
def test_compiled_sampled_draft_matches_target_distribution(small_vocab_pair, monkeypatch):
    """The same through the compiled draft loop and verify (compile=True). Two tokens: the
    prefill's, then one round, which every request of the batch of 2500 finishes, so the graphs
    compile for one batch size; the chain's depths beyond the first are covered eagerly above
    and by tests/test_compiled_draft.py (compiled draws equal eager ones)."""
    target, draft = small_vocab_pair
    prompt, length, temperature, trials = [1, 5, 2], 2, 0.8, 10000
    chain = TreeConfig.chain(3, sampled=True)
    probs = exact_joint(target, prompt, length, temperature)
    counts = sample_joint(target, draft, prompt, length, temperature, trials, tree=chain, compile=FAST_COMPILE)
    stat, dof = chi_square(counts, probs, trials)
    assert stat < chi_square_bound(dof), f"chi-square {stat:.1f} with {dof} dof"

    from eagle3_ext.decoding import tree
    monkeypatch.setattr(batch_module, "verify_sampling_draft_probs",
                        lambda t, p, q, generator: tree.verify_sampling_draft_probs(t, p, p, generator=generator))
    biased = sample_joint(target, draft, prompt, length, temperature, trials, tree=chain, compile=FAST_COMPILE)
    stat, dof = chi_square(biased, probs, trials)
    assert stat > chi_square_bound(dof), f"biased sampler passed: chi-square {stat:.1f} with {dof} dof"


def test_sampled_draft_needs_a_chain():
    with pytest.raises(ValueError, match="TreeConfig.sampled needs a chain without lookup"):
        TreeConfig(depth=3, topk=2, num_draft_tokens=6, lookup_tokens=0, sampled=True)
    with pytest.raises(ValueError, match="TreeConfig.sampled needs a chain without lookup"):
        TreeConfig.chain(3, lookup_tokens=4, sampled=True)
    assert TreeConfig.chain(4, sampled=True).name == "chain4-sampled"


# --- bad input ---------------------------------------------------------------------------------

def test_bad_inputs_fail_before_generation(trained, tmp_path):
    _, target, tok, draft = trained
    gen = SpeculativeGenerator(target, draft, TREES[0], tokenizer=tok)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        gen.generate([[1, 2], []])
    with pytest.raises(ValueError, match=r"prompt 0 has 600 tokens, longer than the target's context \(512"):
        gen.generate([[1] * 600])
    with pytest.raises(ValueError, match="max_new_tokens must be a positive integer, got 0"):
        gen.generate("def", max_new_tokens=0)
    with pytest.raises(ValueError, match="temperature must be a number >= 0, got -1"):
        gen.generate("def", do_sample=True, temperature=-1)
    with pytest.raises(ValueError, match=r"num_draft_tokens must be an integer in \[2, 7\], got 40"):
        TreeConfig(depth=2, topk=2, num_draft_tokens=40, lookup_tokens=0)


def test_draft_context_shorter_than_the_call_warns_and_stays_lossless(trained, caplog):
    # The draft's max_position_embeddings may be smaller than the target's: the call runs past it
    # with one warning, and the output is still the target's own greedy output.
    arch, target, tok, draft = trained
    short = copy.deepcopy(draft)
    short.config.max_position_embeddings = 16
    gen = SpeculativeGenerator(target, short, TREES[1], tokenizer=tok)
    with caplog.at_level(logging.WARNING, logger="eagle3_ext"):
        out = gen.generate(PROMPTS, max_new_tokens=40, eos_token_id=[], return_dict_in_generate=True)
        gen.generate(PROMPTS[0], max_new_tokens=40, eos_token_id=[])
    warnings = [r.getMessage() for r in caplog.records if "max_position_embeddings (16)" in r.getMessage()]
    assert len(warnings) == 1, warnings  # once per generator, not per call
    assert "the output is unchanged" in warnings[0]
    assert out.new_tokens == hf_greedy(target, tok, PROMPTS, 40)


def test_mismatched_draft_is_rejected(trained, tmp_path):
    _, target, tok, draft = trained
    cfg = draft_config_for(target.config, [2, 3, 3], 200)
    wide = Eagle3DraftModel(draft_config_for(target.config.__class__(**{**target.config.to_dict(),
                                                                      "hidden_size": 96}), [2, 3, 3], 200))
    with pytest.raises(ValueError, match="target hidden size 64 differs from the draft's target_hidden_size 96"):
        SpeculativeGenerator(target, wide)
    deep = Eagle3DraftModel(cfg)
    deep.config.aux_layer_ids = [2, 3, 9]
    deep.config.target_num_hidden_layers = None
    with pytest.raises(ValueError, match=r"include \[9\], outside \[0, 6\]"):
        SpeculativeGenerator(target, deep)
    other_vocab = Eagle3DraftModel(draft_config_for(target.config.__class__(**{**target.config.to_dict(),
                                                                              "vocab_size": 400}), [2, 3, 3], 200))
    with pytest.raises(ValueError, match="target vocabulary .* differs from the draft's vocab_size 400"):
        SpeculativeGenerator(target, other_vocab)


def test_unsupported_architecture_names_missing_hooks():
    class NoLayers(torch.nn.Module):
        config = type("C", (), {"num_hidden_layers": 6, "hidden_size": 64, "vocab_size": 320})()

        def get_input_embeddings(self):
            return torch.nn.Embedding(320, 64)

    draft = Eagle3DraftModel(draft_config_for(make_cfg(), [2, 3, 3], 320))
    with torch.no_grad():
        draft.t2d[:] = True
    with pytest.raises(ValueError, match="unsupported architecture NoLayers: .*model.model.layers"):
        SpeculativeGenerator(NoLayers(), draft, attention="sdpa")


def make_cfg():
    import transformers
    return transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                                    num_key_value_heads=2, vocab_size=320)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class ConstantHead(torch.nn.Module):
    """An lm_head that always prefers one token: target and draft then agree on every token, so
    a long generation takes few rounds."""

    def __init__(self, vocab: int, token: int):
        super().__init__()
        self.register_buffer("bias", torch.zeros(vocab))
        self.bias[token] = 10.0

    def forward(self, hidden):
        return hidden.new_zeros(*hidden.shape[:-1], self.bias.numel()) + self.bias.to(hidden.dtype)


@pytest.mark.slow
def test_memory_flat_over_10k_tokens():
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=64, max_position_embeddings=12000,
                                   tie_word_embeddings=False)
    target = transformers.LlamaForCausalLM(cfg).eval()
    target.lm_head = ConstantHead(64, 5)
    draft = Eagle3DraftModel(draft_config_for(cfg, [1, 2, 3], 64))
    with torch.no_grad():
        draft.t2d[:] = True
    draft.lm_head = ConstantHead(64, 5)
    gen = SpeculativeGenerator(target, draft, TreeConfig.chain(7))
    gen.generate([[1, 2, 3]], max_new_tokens=2000, eos_token_id=[])  # warm the allocator
    before = rss_bytes()
    out = gen.generate([[1, 2, 3]], max_new_tokens=10000, eos_token_id=[], return_dict_in_generate=True)
    grown = rss_bytes() - before
    assert out.new_tokens[0] == [5] * 10000
    assert out.stats.acceptance_length > 7.5
    # KV caches of 10k tokens: target 4 layers x 2 x 2 heads x 8 dims x 4 B = 512 B per token, the
    # draft's 256 B: about 8 MB in all. Anything that kept per-round state would add far more.
    assert grown < 64 << 20, f"RSS grew by {grown / 2**20:.1f} MiB"


def test_sampling_defaults_to_a_sampled_chain():
    """`eagle3 generate` picks the tree per temperature: greedy keeps the default tree, sampling
    without tree options drafts a sampled chain; any tree option keeps the tree asked for."""
    from eagle3_ext.bench.generate_job import GenerateRequest

    assert GenerateRequest().tree() == TreeConfig()
    assert GenerateRequest(temperature=0.8).tree() == TreeConfig.chain(TreeConfig.SAMPLED_DEPTH, sampled=True)
    assert GenerateRequest(temperature=0.8, depth=3).tree().sampled is False
    assert GenerateRequest(temperature=0.8, sampled_draft=True, depth=4).tree() == TreeConfig.chain(4, sampled=True)
    with pytest.raises(ValueError, match="--sampled-draft drafts a chain of --depth tokens without lookup"):
        GenerateRequest(temperature=0.8, sampled_draft=True, topk=2)
