"""The architecture matrix: tiny random targets of every supported family, each with an
EAGLE-3 draft trained for a few steps on the target's own continuations (so that drafts are
accepted and the caches are compacted), generated greedily through the tree-attention path and
compared token for token with the target's own Hugging Face greedy generate (fp32, CPU). The
targets' layers write to the residual stream at 0.15 of their random scale, so that the
next token leans on the current one (learnable in a few steps) while the context still moves
it: on the windowed targets, removing the window changes Hugging Face's own output.

Windowed architectures use a window of 16 positions, shorter than prompt + generation, so that
the window decides the output; Gemma 2 soft-caps its logits, GPT-OSS has attention sinks,
DeepSeek-V3 is MLA (value head dim 16 against 24 for queries and keys) with routed experts.
"""

import pytest
import torch

from eagle3_ext import Eagle3DraftModel
from eagle3_ext.api import SpeculativeGenerator, TreeConfig
from eagle3_ext.bench.baseline import hf_generate
from conftest import FAST_COMPILE
from tiny_models import ARCH_SETTINGS, corpus, make_trained_pair

ARCHS = ["llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "gemma2", "gemma3_text", "phi3", "olmo2", "deepseek_v3",
         "gpt_oss", "cohere2", "exaone4", "granite", "gemma"]
TREES = {"tree-d4-k2-n8": TreeConfig(depth=4, topk=2, num_draft_tokens=8), "chain4": TreeConfig.chain(4)}
NEW_TOKENS = 24
STEPS = 120
RESIDUAL_SCALE = 0.15
_PAIRS = {}


def trained_pair(arch, tmp_path_factory):
    if arch not in _PAIRS:
        d = tmp_path_factory.mktemp(f"arch_{arch}")
        make_trained_pair(str(d), arch=arch, steps=STEPS, ttt_steps=3, self_generated=True,
                          residual_scale=RESIDUAL_SCALE)
        _PAIRS[arch] = d
    return _PAIRS[arch]


def prompts(tokenizer, count):
    lines = corpus(30, seed=7).splitlines()
    ids = [tokenizer(" ".join(lines[i:i + 3]))["input_ids"] for i in range(0, 3 * count, 3)]
    return [p[:20 - 6 * i] for i, p in enumerate(ids)]  # 20, 14, 8 tokens: a ragged batch


def hf_greedy(target_dir, prompt, **config):
    return hf_generate(_reference_model(target_dir, **config), None, [prompt], NEW_TOKENS, stop_at_eos=False)[0][0]


_REFERENCE = {}


def _reference_model(target_dir, **config):
    # The target as Hugging Face runs it by default (its own attention implementation), loaded
    # apart from the one the generator rewires.
    from transformers import AutoModelForCausalLM
    key = (target_dir, tuple(sorted(config.items())))
    if key not in _REFERENCE:
        _REFERENCE[key] = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32, **config).eval()
    return _REFERENCE[key]


@pytest.mark.parametrize("tree", list(TREES), ids=list(TREES))
@pytest.mark.parametrize("arch", ARCHS)
def test_identical_to_hf_generate_with_acceptance(arch, tree, tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    d = trained_pair(arch, tmp_path_factory)
    target_dir = str(d / "target")
    tok = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    draft = Eagle3DraftModel.from_pretrained(str(d / "draft"), target_config=target.config)
    gen = SpeculativeGenerator(target, draft, TREES[tree], attention="tree")
    batch = prompts(tok, 3)
    single = gen.generate([batch[0]], max_new_tokens=NEW_TOKENS, eos_token_id=[], return_dict_in_generate=True)
    ragged = gen.generate(batch, max_new_tokens=NEW_TOKENS, eos_token_id=[], return_dict_in_generate=True)
    expected = [hf_greedy(target_dir, p) for p in batch]
    assert single.new_tokens[0] == expected[0], f"{arch} {tree} batch 1"
    assert ragged.new_tokens == expected, f"{arch} {tree} ragged batch of 3"
    assert gen.attention_path == "tree"
    window = ARCH_SETTINGS[arch].get("sliding_window")
    if window:  # the window decides the output: without it Hugging Face's own output differs
        assert len(batch[0]) + NEW_TOKENS > window
        assert any(hf_greedy(target_dir, p, sliding_window=10_000) != e for p, e in zip(batch, expected)), arch
    length = (single.stats.acceptance_length + ragged.stats.acceptance_length) / 2
    print(f"\n{arch:<12} {tree:<14} acceptance length {length:.2f}")
    assert length > 1.3, f"{arch} {tree}: acceptance length {length:.2f}"


@pytest.mark.slow
def test_compiled_is_identical_with_sliding_windows_and_a_soft_cap(tmp_path_factory):
    """compile=True on Gemma 2 (sliding-window layers, a soft-cap) over a ragged batch of 2: its
    static cache keeps every layer's full history and its prompt fills it through an eager
    prefill. (Each compiled architecture costs minutes of compiling; this one exercises both.)"""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    arch = "gemma2"
    d = trained_pair(arch, tmp_path_factory)
    target_dir = str(d / "target")
    tok = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    draft = Eagle3DraftModel.from_pretrained(str(d / "draft"), target_config=target.config)
    gen = SpeculativeGenerator(target, draft, TREES["tree-d4-k2-n8"], compile=FAST_COMPILE)
    batch = prompts(tok, 2)  # a third request would compile a third batch size's graphs (minutes)
    out = gen.generate(batch, max_new_tokens=NEW_TOKENS, eos_token_id=[], return_dict_in_generate=True)
    assert out.new_tokens == [hf_greedy(target_dir, p) for p in batch]


@pytest.mark.parametrize("model_type,feature", [("mamba", "state-space"), ("qwen3_next", "linear-attention"),
                                                ("rwkv", "RWKV"), ("llama4", "chunked local attention")])
def test_unservable_architectures_are_refused_by_name(model_type, feature):
    from types import SimpleNamespace

    from eagle3_ext.preflight.architecture import check_served
    with pytest.raises(ValueError, match=f"cannot serve a {model_type} target exactly: it has .*{feature}"):
        check_served(SimpleNamespace(model_type=model_type))


def test_unknown_layer_types_are_refused():
    from types import SimpleNamespace

    from eagle3_ext.preflight.architecture import check_served
    config = SimpleNamespace(model_type="hybrid", layer_types=["full_attention", "linear_attention"])
    with pytest.raises(ValueError, match=r"layer_types include \['linear_attention'\]"):
        check_served(config)
