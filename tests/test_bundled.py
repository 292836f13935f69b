"""The bundled default pair: it ships within the size cap, loads through the public API, gives
token-identical greedy output with real speculation, and the doctor finds it healthy."""

import json
import os

import pytest
import torch

from eagle3_ext import Eagle3DraftModel
from eagle3_ext.draft import eagle_default_aux_layers
from eagle3_ext.cli import main as cli_main
from eagle3_ext.doctor import diagnose
from eagle3_ext.api import SpeculativeGenerator, TreeConfig
from eagle3_ext.bench.baseline import hf_generate
from eagle3_ext.models import bundled_eval_prompts, bundled_paths, recipe

SIZE_CAP = 40 * 10**6


@pytest.fixture(scope="module")
def pair():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target_dir, draft_dir = bundled_paths()
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    draft = Eagle3DraftModel.from_pretrained(draft_dir, target_config=target.config).float()
    return target, draft, AutoTokenizer.from_pretrained(target_dir)


def test_weights_fit_the_size_cap():
    total = 0
    for path in bundled_paths():
        for name in os.listdir(path):
            if name.endswith(".safetensors"):
                total += os.path.getsize(os.path.join(path, name))
    assert 0 < total <= SIZE_CAP


def test_pair_is_a_llama_target_with_its_eagle3_draft(pair):
    target, draft, tok = pair
    assert target.config.model_type == "llama"
    assert 10e6 <= sum(p.numel() for p in target.parameters()) <= 30e6
    assert draft.aux_layer_ids == list(eagle_default_aux_layers(target.config.num_hidden_layers))
    assert len(tok) <= target.config.vocab_size


def test_eval_prompts_come_from_held_out_modules():
    prompts = bundled_eval_prompts()
    assert len(prompts) >= 16 and all(p.startswith(("def ", "class ")) for p in prompts)
    with open(os.path.join(os.path.dirname(recipe.__file__), "recipe", "corpus.json")) as f:
        manifest = json.load(f)
    assert manifest["held_out"] == list(recipe.HELD_OUT)
    assert all(f["split"] == "eval" for f in manifest["files"] if f["file"].split(os.sep)[0].removesuffix(".py")
               in recipe.HELD_OUT)


def test_greedy_speculation_is_identical_and_accepts_drafts(pair):
    target, draft, tok = pair
    prompts = bundled_eval_prompts()[:4]
    ref, _ = hf_generate(target, tok, prompts, 48)
    gen = SpeculativeGenerator(target, draft, TreeConfig(5, 4, 16), tokenizer=tok)
    for prompt, expected in zip(prompts, ref):
        out = gen.generate(prompt, max_new_tokens=48, return_dict_in_generate=True)
        assert out.new_tokens[0] == expected
    # A trained pair drafts tokens the target accepts; a mismatched capture falls to about 1.
    out = gen.generate(prompts, max_new_tokens=48, return_dict_in_generate=True)
    assert out.stats.acceptance_length > 2.0, out.stats


def test_cli_generate_runs_on_the_bundled_default(capsys):
    assert cli_main(["generate", "--max-new-tokens", "24", "--baseline", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["identical"] is True and report["new_tokens"] == 24
    assert report["target"] == bundled_paths()[0] and report["speedup"] > 0


def test_doctor_finds_the_bundled_pair_healthy():
    report = diagnose(*bundled_paths(), steps=2, max_examples=4)
    assert report.healthy, report.verdict
    assert report.best == "configured"
