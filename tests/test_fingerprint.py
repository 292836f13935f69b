"""The activation fingerprint and the capture guard built on it."""

import json

import pytest
import torch
import transformers

from eagle3_ext import Eagle3DraftModel
from eagle3_ext.draft import fingerprint
from eagle3_ext.api import CaptureMismatchError, SpeculativeGenerator
from tiny_models import make_trained_pair

ARCHS = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
}
AUX = [2, 4, 5]


def tiny_target(arch, residual_scale=1.0, seed=0):
    config_cls, model_cls = ARCHS[arch]
    torch.manual_seed(seed)
    cfg = config_cls(hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=256, max_position_embeddings=256, pad_token_id=0,
                     bos_token_id=1, eos_token_id=2)
    model = model_cls(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.mul_(residual_scale)
    return model


PROBE = torch.randint(3, 256, (fingerprint.PROBE_TOKENS,), generator=torch.Generator().manual_seed(1)).tolist()


@pytest.mark.parametrize("residual_scale", [1.0, 16.0], ids=["random", "distinct-layers"])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_shifts_and_embedding_are_recognised_and_bf16_is_not(arch, residual_scale):
    model = tiny_target(arch, residual_scale)
    fp = fingerprint.record(model, AUX, PROBE)
    assert sorted(int(k) for k in fp["layers"]) == [0, 1, 2, 3, 4, 5, 6]
    assert fingerprint.check(fp, model, AUX).ok
    for wrong in ([3, 5, 6], [1, 3, 4], [0, 4, 5]):
        result = fingerprint.check(fp, model, wrong)
        assert not result.ok and result.looks_like == wrong, (wrong, result.describe())
    # The same target in bf16 sits far inside the tolerance (a few percent of it).
    result = fingerprint.check(fp, model.to(torch.bfloat16), AUX)
    assert result.ok and max(d / t for d, t in zip(result.distance, result.tolerance)) < 0.2
    for row in fingerprint.margins(fp):  # the embedding and both neighbours lie beyond the tolerance
        assert row["embedding"] > 4 and row["minus_1"] >= 4 - 1e-9 and row.get("plus_1", 99) >= 4 - 1e-9


def test_another_target_matches_nothing():
    fp = fingerprint.record(tiny_target("llama", seed=0), AUX, PROBE)
    result = fingerprint.check(fp, tiny_target("llama", seed=1), AUX)
    assert not result.ok and None in result.looks_like
    assert "the target differs from the one the draft was trained with" in result.describe()


def test_shape_and_probe_problems_are_named():
    fp = fingerprint.record(tiny_target("llama"), AUX, PROBE)
    deeper = tiny_target("llama")
    deeper.config.num_hidden_layers = 9
    assert "9 of width 64" in fingerprint.check(fp, deeper, AUX).problem
    assert "trained on 3" in fingerprint.check(fp, tiny_target("llama"), [2, 4]).problem
    with pytest.raises(ValueError, match="at least 16 tokens"):
        fingerprint.probe_from_sequences([[1, 2, 3]])
    with pytest.raises(ValueError, match="missing 'probe_ids'"):
        fingerprint.validate({k: v for k, v in fp.items() if k != "probe_ids"})
    with pytest.raises(ValueError, match="version 7 is not supported"):
        fingerprint.validate(dict(fp, version=7))


def test_probe_stops_at_the_highest_wanted_layer():
    model = tiny_target("llama")
    ran = []
    for i, layer in enumerate(model.model.layers):
        layer.register_forward_hook(lambda *a, i=i: ran.append(i))
    states = fingerprint.probe_states(model, [1, 3], PROBE)
    assert ran == [0, 1, 2] and set(states) == {1, 3}
    with torch.no_grad():
        full = model(input_ids=torch.tensor([PROBE]), output_hidden_states=True).hidden_states
    torch.testing.assert_close(states[3], full[3][0])


# --- the guard in the generator -------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny target and a draft trained on it (the trainer records the fingerprint)."""
    d = tmp_path_factory.mktemp("guard")
    target, tok = make_trained_pair(str(d), steps=20)
    return d, target, tok


def test_trainer_records_the_fingerprint_in_every_export(trained):
    d, target, _ = trained
    config = json.loads((d / "draft" / "config.json").read_text())
    fp = config["eagle3_ext"]["fingerprint"]
    assert fp["aux_layer_ids"] == config["eagle3_ext"]["aux_layer_ids"]
    assert fingerprint.check(fp, target, fp["aux_layer_ids"]).ok
    sidecar = json.loads((d / "draft" / "vllm" / "eagle3_fingerprint.json").read_text())
    assert sidecar == fp
    assert Eagle3DraftModel.from_pretrained(str(d / "draft" / "vllm")).config.fingerprint == fp


def _shifted_draft(d, target, by):
    draft = Eagle3DraftModel.from_pretrained(str(d / "draft"), target_config=target.config)
    draft.config.aux_layer_ids = [i + by for i in draft.config.aux_layer_ids]
    return draft


def test_guard_stops_a_shifted_capture_before_any_draft_step(trained, monkeypatch):
    d, target, tok = trained
    import eagle3_ext.decoding.batch as batch
    steps = []
    monkeypatch.setattr(batch, "extend_eager", lambda *a, **k: steps.append(1))
    gen = SpeculativeGenerator(target, _shifted_draft(d, target, 1), tokenizer=tok)
    with pytest.raises(CaptureMismatchError) as e:
        gen.generate("def f", max_new_tokens=4)
    assert not steps
    trained_ids = json.loads((d / "draft" / "config.json").read_text())["eagle3_ext"]["aux_layer_ids"]
    assert f"trained on target hidden states {trained_ids}" in str(e.value)
    assert "strict=False" in str(e.value) and "eagle_aux_hidden_state_layer_ids" in str(e.value)


def test_guard_warns_when_not_strict_and_costs_one_probe(trained, caplog):
    d, target, tok = trained
    gen = SpeculativeGenerator(target, _shifted_draft(d, target, 1), tokenizer=tok, strict=False)
    with caplog.at_level("WARNING"):
        out = gen.generate("def f", max_new_tokens=4, return_dict_in_generate=True)
    assert "capture check failed" in caplog.text and out.stats.guard_time_s > 0
    assert gen.generate("def f", max_new_tokens=4, return_dict_in_generate=True).stats.guard_time_s == 0.0


def test_guard_passes_the_trained_capture(trained):
    d, target, tok = trained
    draft = Eagle3DraftModel.from_pretrained(str(d / "draft"), target_config=target.config)
    gen = SpeculativeGenerator(target, draft, tokenizer=tok)
    gen.generate("def f", max_new_tokens=4)
    assert gen.capture_check.ok
