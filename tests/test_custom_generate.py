"""EAGLE-3 from inside Hugging Face's generate: ``model.generate(..., custom_generate=
eagle3_ext.custom_generate_path(), trust_remote_code=True, draft_model=...)``, loaded by
transformers' own custom-generate machinery and compared with the model's own ``generate``."""

import os

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, StoppingCriteriaList

import eagle3_ext
from eagle3_ext import Eagle3DraftModel, TreeConfig
from eagle3_ext.api import CaptureMismatchError
from eagle3_ext.api.custom_generate import CACHE_ATTRIBUTE
from eagle3_ext.errors import BadInputError
from eagle3_ext.models import pair
from recording_streamer import RecordingStreamer
from tiny_models import make_trained_pair

PROMPTS = ["def print return", "class value key item index count self", "for"]
METHOD = eagle3_ext.custom_generate_path()


def load(target_dir):
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(target_dir)


@pytest.fixture(scope="module")
def toy():
    target_dir, draft_dir = pair("toy")
    return (*load(target_dir), draft_dir)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    d = tmp_path_factory.mktemp("custom_generate_qwen3")
    make_trained_pair(str(d), arch="qwen3", steps=30, self_generated=True)
    return (*load(str(d / "target")), str(d / "draft"))


def eagle3(model, **kwargs):
    return model.generate(custom_generate=METHOD, trust_remote_code=True, **kwargs)


def test_the_folder_is_laid_out_as_the_hub_expects():
    assert os.path.isfile(os.path.join(METHOD, "custom_generate", "generate.py"))
    with open(os.path.join(METHOD, "README.md")) as f:
        card = f.read()
    assert card.startswith("---\n") and "- custom_generate\n" in card.split("---\n")[1]  # the Hub's tag
    for section in ("## Base model", "## Model compatibility", "## Additional arguments", "## Output type"):
        assert section in card
    from transformers.dynamic_module_utils import check_python_requirements
    with open(os.path.join(METHOD, "custom_generate", "requirements.txt")) as f:
        assert "eagle3_ext" in f.read()
    check_python_requirements(METHOD, requirements_file="custom_generate/requirements.txt")  # installed here


@pytest.mark.parametrize("which", ["toy", "qwen3"])
def test_greedy_equals_the_models_own_generate_on_a_left_padded_batch(which, request):
    model, tok, draft = request.getfixturevalue(which)
    batch = tok(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    want = model.generate(**batch, max_new_tokens=24, do_sample=False)
    for tree in (TreeConfig(4, 2, 8), TreeConfig.chain(3)):
        got = eagle3(model, **batch, max_new_tokens=24, draft_model=draft, tree=tree, return_dict_in_generate=True)
        assert torch.equal(got.sequences, want)
        assert got.stats.accepted_drafts > 0  # the draft did speculate
    # The prompt as a positional argument, as model.generate(ids) is called.
    ids = tok(PROMPTS[:1], return_tensors="pt")["input_ids"]
    assert torch.equal(model.generate(ids, custom_generate=METHOD, trust_remote_code=True, draft_model=draft,
                                      max_new_tokens=12), model.generate(ids, max_new_tokens=12, do_sample=False))


def test_the_generator_is_kept_on_the_model(toy, monkeypatch):
    model, tok, draft = toy
    vars(model).pop(CACHE_ATTRIBUTE, None)
    batch = tok(PROMPTS[:1], return_tensors="pt")
    first = eagle3(model, **batch, max_new_tokens=8, draft_model=draft, return_dict_in_generate=True)
    assert first.stats.guard_time_s > 0  # the capture guard ran on the first call
    loads = []
    original = Eagle3DraftModel.from_pretrained
    monkeypatch.setattr(Eagle3DraftModel, "from_pretrained",
                        classmethod(lambda cls, *a, **k: loads.append(a) or original.__func__(cls, *a, **k)))
    second = eagle3(model, **batch, max_new_tokens=8, draft_model=draft, return_dict_in_generate=True)
    assert loads == [] and second.stats.guard_time_s == 0  # no draft loading, no guard
    assert torch.equal(first.sequences, second.sequences)
    assert len(vars(model)[CACHE_ATTRIBUTE]) == 1
    eagle3(model, **batch, max_new_tokens=8, draft_model=draft, tree=TreeConfig.chain(2))
    assert len(loads) == 1 and len(vars(model)[CACHE_ATTRIBUTE]) == 2  # another tree: another generator
    assert CACHE_ATTRIBUTE not in dict(model.named_modules()) and not any(CACHE_ATTRIBUTE in k for k in
                                                                           model.state_dict())


def test_streamer_logits_processor_stopping_criteria_and_stop_strings(toy):
    from transformers import NoRepeatNGramLogitsProcessor, LogitsProcessorList

    model, tok, draft = toy
    batch = tok(PROMPTS[:1], return_tensors="pt")
    width = batch["input_ids"].shape[1]
    hf, ours = RecordingStreamer(), RecordingStreamer()
    want = model.generate(**batch, max_new_tokens=20, do_sample=False, streamer=hf)
    got = eagle3(model, **batch, max_new_tokens=20, draft_model=draft, streamer=ours)
    assert torch.equal(got, want) and ours.ended
    assert torch.equal(torch.cat([p.view(-1) for p in ours.puts]), torch.cat([p.view(-1) for p in hf.puts]))
    processors = LogitsProcessorList([NoRepeatNGramLogitsProcessor(2)])
    assert torch.equal(eagle3(model, **batch, max_new_tokens=20, draft_model=draft, logits_processor=processors),
                       model.generate(**batch, max_new_tokens=20, do_sample=False, logits_processor=processors))

    def stop_after(token):
        return lambda ids, scores, **kwargs: ids[:, -1] == token

    criteria = StoppingCriteriaList([stop_after(int(want[0, width + 6]))])
    assert torch.equal(eagle3(model, **batch, max_new_tokens=20, draft_model=draft, stopping_criteria=criteria),
                       model.generate(**batch, max_new_tokens=20, do_sample=False, stopping_criteria=criteria))
    stop = tok.decode(want[0, width + 4:width + 6])
    assert torch.equal(eagle3(model, **batch, max_new_tokens=20, draft_model=draft, stop_strings=[stop], tokenizer=tok),
                       model.generate(**batch, max_new_tokens=20, do_sample=False, stop_strings=[stop], tokenizer=tok))


def test_sampling_equals_the_generator_with_the_same_seed(toy):
    model, tok, draft = toy
    batch = tok(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    options = dict(max_new_tokens=16, do_sample=True, temperature=0.8, top_k=20, seed=7)
    got = eagle3(model, **batch, draft_model=draft, **options)
    generator = eagle3_ext.SpeculativeGenerator.from_pretrained(model, draft)
    assert torch.equal(got, generator.generate(**batch, **options))
    assert not torch.equal(got, eagle3(model, **batch, draft_model=draft, **{**options, "seed": 8}))


def test_a_loaded_draft_and_errors(toy):
    model, tok, draft_dir = toy
    batch = tok(PROMPTS[:1], return_tensors="pt")
    draft = Eagle3DraftModel.from_pretrained(draft_dir, target_config=model.config)
    want = model.generate(**batch, max_new_tokens=10, do_sample=False)
    assert torch.equal(eagle3(model, **batch, max_new_tokens=10, draft_model=draft), want)
    with pytest.raises(BadInputError, match="needs draft_model="):
        eagle3(model, **batch, max_new_tokens=4)
    with pytest.raises(BadInputError, match="assistant_model is not supported"):
        eagle3(model, **batch, max_new_tokens=4, draft_model=draft, assistant_model=model)
    with pytest.raises(TypeError, match="tree must be an eagle3_ext.TreeConfig"):
        eagle3(model, **batch, max_new_tokens=4, draft_model=draft, tree=(4, 2, 8))
    with pytest.raises(ValueError, match="num_beams=2 is not supported"):
        eagle3(model, **batch, max_new_tokens=4, draft_model=draft, num_beams=2)
    # transformers' own gate: a custom generate method is code, run only with trust_remote_code.
    with pytest.raises(ValueError, match="trust_remote_code"):
        model.generate(**batch, custom_generate=METHOD, draft_model=draft, max_new_tokens=4)


def test_a_draft_of_another_target_is_refused(toy, qwen3):
    model, tok, draft = toy
    batch = tok(PROMPTS[:1], return_tensors="pt")
    # Same architecture and sizes, other weights: only the capture guard can tell.
    torch.manual_seed(0)
    stranger = AutoModelForCausalLM.from_config(model.config).eval()
    with pytest.raises(CaptureMismatchError, match="capture check failed"):
        eagle3(stranger, **batch, max_new_tokens=4, draft_model=draft)
    with pytest.raises(BadInputError, match="trained on a target with 6 layers"):  # another shape: named at load
        eagle3(model, **batch, max_new_tokens=4, draft_model=qwen3[2])
