"""The Hugging Face-shaped API: from_pretrained, generate(input_ids, attention_mask, ...) with
Hugging Face's arguments, its output tensor, stopping, logits processors, and no side effects
on the caller's model or torch's global RNG. Compared with Hugging Face's own generate."""

import pytest
import torch

import eagle3_ext
from eagle3_ext.api.inputs import prepare
from eagle3_ext.api.settings import HF_DEFAULTS
from eagle3_ext.api.stopping import StopRule
from conftest import FAST_COMPILE
from sampling_stats import chi_square, chi_square_bound, exact_joint, make_small_vocab_pair, sample_joint
from recording_streamer import RecordingStreamer
from tiny_models import make_trained_pair

PROMPTS = ["def print return", "class value key item index count self", "for", "import lambda yield self print"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("api")
    make_trained_pair(str(d), steps=40)
    return str(d / "target"), str(d / "draft")


@pytest.fixture(scope="module")
def gen(pair):
    return eagle3_ext.SpeculativeGenerator.from_pretrained(*pair, dtype="float32",
                                                           tree=eagle3_ext.TreeConfig(4, 2, 8))


def test_four_line_program_equals_hf_generate_on_a_left_padded_batch(pair):
    gen = eagle3_ext.SpeculativeGenerator.from_pretrained(*pair)
    batch = gen.tokenizer(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    out = gen.generate(**batch, max_new_tokens=20)
    text = gen.tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    expected = gen.target.generate(**batch, max_new_tokens=20, do_sample=False)
    assert torch.equal(out, expected)  # prompt, new tokens and the padding after an EOS
    assert len(text) == 4 and len(set(map(len, gen.tokenizer(PROMPTS)["input_ids"]))) > 1


def test_right_padding_and_inferred_padding(gen):
    tok = gen.tokenizer
    left = tok(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    right = tok(PROMPTS, return_tensors="pt", padding=True, padding_side="right")
    want = gen.generate(**left, max_new_tokens=12, eos_token_id=[])
    got = gen.generate(**right, max_new_tokens=12, eos_token_id=[])
    width = left["input_ids"].shape[1]
    assert torch.equal(got[:, :width], right["input_ids"])  # the input as given, then the new tokens
    assert torch.equal(got[:, width:], want[:, width:])
    # Without a mask, padding is inferred from pad_token_id (not the EOS token, present).
    assert torch.equal(gen.generate(left["input_ids"], max_new_tokens=12, eos_token_id=[]), want)


def test_return_dict_has_sequences_and_statistics(gen):
    out = gen.generate(PROMPTS[:2], max_new_tokens=10, eos_token_id=[], return_dict_in_generate=True)
    assert isinstance(out, eagle3_ext.SpeculativeGenerateOutput)
    assert out.sequences.shape[1] == out.sequences.shape[1] and [len(t) for t in out.new_tokens] == [10, 10]
    assert out.finish_reasons == ["length", "length"] and out.stats.new_tokens == 20
    assert out.text == gen.tokenizer.batch_decode(out.new_tokens, skip_special_tokens=True)
    assert out.sequences[:, -10:].tolist() == out.new_tokens


def test_stop_rule_orders_eos_stop_strings_and_length():
    class Chars:  # token t decodes to the letter chr(97 + t)
        @staticmethod
        def decode(ids):
            return "".join(chr(97 + t) for t in ids)

    tokens = [0, 1, 2, 3, 4, 5]  # "abcdef"
    rule = StopRule(limit=10, eos=[4], stop_strings=["cd"], tokenizer=Chars())
    assert rule.scan(tokens, 0) == (4, "stop")                       # "cd" completes at token 3, before EOS 4
    assert StopRule(10, [2], ["cd"], Chars()).scan(tokens, 0) == (3, "eos")  # EOS at 2 comes first
    assert StopRule(2, [4], ["cd"], Chars()).scan(tokens, 0) == (2, "length")  # the limit comes first
    assert StopRule(10, [], ["xy"], Chars()).scan(tokens, 0) is None
    # Tokens looked at in an earlier round are not looked at again; the window still sees them.
    assert rule.scan(tokens, 3) == (4, "stop")
    assert StopRule(4, [5], [], None).scan(tokens, 0) == (4, "length")  # an EOS past the limit is cut off


def test_eos_past_max_new_tokens_is_a_length_stop(gen):
    free = gen.generate(PROMPTS[0], max_new_tokens=16, eos_token_id=[], return_dict_in_generate=True).new_tokens[0]
    eos = free[9]
    first = free.index(eos)
    out = gen.generate(PROMPTS[0], max_new_tokens=first, eos_token_id=eos, return_dict_in_generate=True)
    assert out.new_tokens[0] == free[:first] and out.finish_reasons == ["length"]
    out = gen.generate(PROMPTS[0], max_new_tokens=16, eos_token_id=eos, return_dict_in_generate=True)
    assert out.new_tokens[0] == free[:first + 1] and out.finish_reasons == ["eos"]


def test_min_new_tokens_matches_hf(gen):
    free = gen.generate(PROMPTS[1], max_new_tokens=16, eos_token_id=[], return_dict_in_generate=True).new_tokens[0]
    eos = free[2]
    batch = gen.tokenizer([PROMPTS[1]], return_tensors="pt")
    want = gen.target.generate(**batch, max_new_tokens=16, min_new_tokens=8, eos_token_id=eos, do_sample=False)
    got = gen.generate(**batch, max_new_tokens=16, min_new_tokens=8, eos_token_id=eos)
    assert torch.equal(got, want)
    assert eos not in got[0, batch["input_ids"].shape[1]:][:8].tolist()


def test_logits_processor_matches_hf_greedy(gen):
    from transformers import LogitsProcessorList, NoRepeatNGramLogitsProcessor, RepetitionPenaltyLogitsProcessor
    processors = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.8), NoRepeatNGramLogitsProcessor(3)])
    for prompt in PROMPTS[:2]:
        batch = gen.tokenizer([prompt], return_tensors="pt")
        want = gen.target.generate(**batch, max_new_tokens=20, do_sample=False, logits_processor=processors,
                                   eos_token_id=None)
        got = gen.generate(**batch, max_new_tokens=20, logits_processor=processors, eos_token_id=[])
        assert torch.equal(got, want)
        plain = gen.generate(**batch, max_new_tokens=20, eos_token_id=[])
        assert not torch.equal(plain, got)  # the processors changed the output


def test_no_side_effects_on_the_global_rng_or_the_model(gen):
    state = torch.get_rng_state()
    gen.generate(PROMPTS[0], max_new_tokens=6)
    gen.generate(PROMPTS[0], max_new_tokens=6, do_sample=True, temperature=0.9)
    gen.generate(PROMPTS[0], max_new_tokens=6, do_sample=True, temperature=0.9, seed=4)
    assert torch.equal(torch.get_rng_state(), state)
    # The same seed gives the same sample; the call leaves the caller's mode and attention.
    a = gen.generate(PROMPTS[0], max_new_tokens=8, do_sample=True, seed=11)
    gen.target.train()
    b = gen.generate(PROMPTS[0], max_new_tokens=8, do_sample=True, seed=11)
    assert torch.equal(a, b) and gen.target.training
    gen.target.eval()
    assert gen.target.config._attn_implementation != "eagle3_tree"


def test_attention_and_mode_restored_after_a_call_that_raises(gen):
    def boom(input_ids, scores):
        raise RuntimeError("processor failed")
    before = gen.target.config._attn_implementation
    gen.target.train()
    with pytest.raises(RuntimeError, match="processor failed"):
        gen.generate(PROMPTS[0], max_new_tokens=4, logits_processor=[boom])
    assert gen.target.config._attn_implementation == before and gen.target.training
    gen.target.eval()


class StopAfterToken:
    """Stops a row once its last token is ``token`` (a StoppingCriteria: [B, L] ids, [B, V] scores)."""

    def __init__(self, token):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


class StopAtWidth:
    """Stops every row once the output is ``width`` columns wide, left padding included."""

    def __init__(self, width):
        self.width = width

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), input_ids.shape[-1] >= self.width, dtype=torch.bool)


def test_stopping_criteria_match_hf_on_a_left_padded_batch(gen):
    from transformers import StoppingCriteriaList
    batch = gen.tokenizer(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    width = batch["input_ids"].shape[1]
    plain = gen.target.generate(**batch, max_new_tokens=16, do_sample=False)
    # The 6th new token of row 1 stops row 1 there (and any other row that emits it); a width
    # stops every row. A row that stops is padded (there is an EOS token), as after an EOS.
    cases = [StopAfterToken(int(plain[1, width + 5])), StopAtWidth(width + 7)]
    for criterion in cases:
        criteria = StoppingCriteriaList([criterion])
        want = gen.target.generate(**batch, max_new_tokens=16, do_sample=False, stopping_criteria=criteria)
        got = gen.generate(**batch, max_new_tokens=16, stopping_criteria=criteria,
                           return_dict_in_generate=True)
        assert not torch.equal(want, plain), type(criterion).__name__  # it did stop a row early
        assert torch.equal(got.sequences, want), type(criterion).__name__
        assert "stop" in got.finish_reasons


def test_stopping_criteria_with_the_compiled_round(pair):
    from transformers import StoppingCriteriaList
    gen = eagle3_ext.SpeculativeGenerator.from_pretrained(*pair, dtype="float32", tree=eagle3_ext.TreeConfig(4, 2, 8),
                                                          compile=FAST_COMPILE)
    batch = gen.tokenizer(PROMPTS[:2], return_tensors="pt", padding=True, padding_side="left")
    plain = gen.target.generate(**batch, max_new_tokens=12, do_sample=False)
    criteria = StoppingCriteriaList([StopAfterToken(int(plain[0, -6]))])
    want = gen.target.generate(**batch, max_new_tokens=12, do_sample=False, stopping_criteria=criteria)
    assert torch.equal(gen.generate(**batch, max_new_tokens=12, stopping_criteria=criteria), want)


def test_streamer_at_batch_3(gen):
    streamer = RecordingStreamer()
    out = gen.generate(PROMPTS[:3], max_new_tokens=9, eos_token_id=[], streamer=streamer, return_dict_in_generate=True)
    prompt, *rest = streamer.puts
    assert streamer.ended and torch.equal(prompt, out.sequences[:, :prompt.shape[1]])
    rows = [[] for _ in range(3)]
    pad = gen.target.generation_config.pad_token_id
    for chunk in rest:  # [3, n]: one request's tokens per put, the other rows padding
        assert chunk.shape[0] == 3
        for b in range(3):
            if (chunk[b] != pad).any():
                rows[b] += chunk[b].tolist()
    assert rows == out.new_tokens


class FakeTokenizer:
    """A tokenizer whose special tokens can be seen: BOS is id 1, every character its code."""

    bos_token = "<s>"
    chat_template = "fake"

    def __call__(self, text, add_special_tokens=True):
        ids = [ord(c) for c in text.replace("<s>", "\x01")]
        return {"input_ids": ([1] if add_special_tokens else []) + ids}

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        text = "<s>" + "".join(f"[{m['role']}]{m['content']}" for m in messages) + ("[assistant]" if
                                                                                   add_generation_prompt else "")
        return self(text, add_special_tokens=False)["input_ids"]


def test_one_bos_for_rendered_prompts_and_chat_messages():
    tok = FakeTokenizer()
    plain = prepare("hi", None, tok, 0, [2]).ids[0]
    rendered = prepare("<s>[user]hi[assistant]", None, tok, 0, [2]).ids[0]
    chat = prepare([{"role": "user", "content": "hi"}], None, tok, 0, [2]).ids[0]
    assert plain == [1, ord("h"), ord("i")]
    assert rendered.count(1) == 1 and chat.count(1) == 1 and chat == rendered
    two = prepare([[{"role": "user", "content": "a"}], [{"role": "user", "content": "bc"}]], None, tok, 0, [2])
    assert [r.count(1) for r in two.ids] == [1, 1] and two.echo.shape == (2, max(map(len, two.ids)))


def test_hf_defaults_agree_with_transformers():
    from transformers import GenerationConfig
    defaults = GenerationConfig._get_default_generation_params()
    assert {k: defaults[k] for k in HF_DEFAULTS} == HF_DEFAULTS


def test_unsupported_options_are_named(gen):
    with pytest.raises(ValueError, match="num_beams=2 is not supported"):
        gen.generate(PROMPTS[0], num_beams=2)
    with pytest.raises(ValueError, match="repetition_penalty=1.3 is not supported.*logits_processor="):
        gen.generate(PROMPTS[0], repetition_penalty=1.3)
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['stop'\]"):
        gen.generate(PROMPTS[0], stop=["x"])
    with pytest.raises(ValueError, match="stop_strings need a tokenizer"):
        eagle3_ext.SpeculativeGenerator(gen.target, gen.draft).generate([[5, 6]], stop_strings=["x"])
    with pytest.raises(ValueError, match="attention_mask must be a tensor of input_ids' shape"):
        gen.generate(torch.tensor([[5, 6, 7]]), attention_mask=torch.ones(1, 2))


def test_from_pretrained_errors(pair, tmp_path):
    target, draft = pair
    with pytest.raises(FileNotFoundError, match="target directory .*missing does not exist"):
        eagle3_ext.SpeculativeGenerator.from_pretrained(str(tmp_path / "missing"), draft)
    with pytest.raises(ValueError, match="holds an EAGLE-3 draft, not a target model"):
        eagle3_ext.SpeculativeGenerator.from_pretrained(draft, draft)
    with pytest.raises(ValueError, match="not an EAGLE-3 draft"):
        eagle3_ext.SpeculativeGenerator.from_pretrained(target, target)
    with pytest.raises(ValueError, match="dtype must be one of"):
        eagle3_ext.SpeculativeGenerator.from_pretrained(target, draft, dtype="int8")


@pytest.mark.slow
def test_sampling_with_a_top_p_processor_is_lossless():
    from transformers import TopPLogitsWarper
    target, draft = make_small_vocab_pair()
    processor = TopPLogitsWarper(0.7)
    prompt, length, temperature, trials = [1, 5, 2], 3, 1.0, 10000
    probs = exact_joint(target, prompt, length, temperature, processor=processor)
    counts = sample_joint(target, draft, prompt, length, temperature, trials, logits_processor=[processor])
    stat, dof = chi_square(counts, probs, trials)
    assert stat < chi_square_bound(dof), f"chi-square {stat:.1f} with {dof} dof"
    # Negative control: the distribution without the processor is a different one.
    stat, dof = chi_square(counts, exact_joint(target, prompt, length, temperature), trials)
    assert stat > chi_square_bound(dof), f"the processor made no difference: chi-square {stat:.1f}"
