"""Every config key of every draft format is read, known harmless, or refused by name; every
convention flag round-trips through the formats that can express it and is refused by the ones
that cannot."""

import itertools
import json
import logging

import pytest
import torch

from eagle3_ext import Eagle3DraftModel
from eagle3_ext.draft.model import RMSNorm, joint_rms_norm
from tiny_models import H, VOCAB, make_draft

FLAGS = ("norm_before_residual", "fc_norm", "norm_before_fc", "norm_output", "final_norm")


def target_config():
    return {"num_hidden_layers": 32, "hidden_size": H, "vocab_size": VOCAB}


def saved(tmp_path, fmt="vllm", **flags):
    draft = make_draft(**flags)
    draft.save_pretrained(str(tmp_path), format=fmt)
    return draft


def edit_config(path, edit):
    config = json.loads((path / "config.json").read_text())
    edit(config)
    (path / "config.json").write_text(json.dumps(config))


def logits(draft, seed=0):
    gen = torch.Generator().manual_seed(seed)
    aux = [torch.randn(1, 5, H, generator=gen) for _ in range(3)]
    ids = torch.randint(0, VOCAB, (1, 5), generator=gen)
    out = draft(ids, draft.project_aux(aux), torch.arange(5)[None])
    return out.logits, out.hidden


# --- keys -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("where,key", [("top", "logit_scale"), ("eagle_config", "mystery"),
                                       ("transformer_layer_config", "residual_multiplier"),
                                       ("eagle3_ext", "new_flag")])
def test_unknown_keys_are_refused_by_name(tmp_path, where, key):
    fmt = {"top": "vllm", "eagle_config": "specforge", "transformer_layer_config": "vllm",
           "eagle3_ext": "eagle3_ext"}[where]
    saved(tmp_path, fmt)

    def add(config):
        block = config if where == "top" else config[where]
        block[key] = 1.5
    edit_config(tmp_path, add)
    name = key if where in ("top", "transformer_layer_config") else f"{where}.{key}"
    with pytest.raises(ValueError, match=f"config key '{name}'"):
        Eagle3DraftModel.from_pretrained(str(tmp_path))


def test_harmless_keys_load(tmp_path):
    saved(tmp_path, "specforge")
    edit_config(tmp_path, lambda c: c.update(torch_dtype="bfloat16", transformers_version="4.51.0", bos_token_id=1,
                                             initializer_range=0.02, use_cache=True, pretraining_tp=1,
                                             sliding_window=4096, use_sliding_window=False))
    Eagle3DraftModel.from_pretrained(str(tmp_path))


@pytest.mark.parametrize("edit,match", [
    (lambda c: c.update(sliding_window=512), "sliding-window attention"),
    (lambda c: c.update(layer_types=["sliding_attention"]), "attention types other than full"),
    (lambda c: c["eagle_config"].update(use_aux_hidden_state=False), "EAGLE-1/2 draft"),
    (lambda c: c.update(norm_before_residual="yes"), "must be true or false"),
], ids=["window", "layer-types", "no-aux", "not-a-bool"])
def test_semantic_keys_we_cannot_honour_are_refused(tmp_path, edit, match):
    saved(tmp_path, "specforge")
    edit_config(tmp_path, edit)
    with pytest.raises(ValueError, match=match):
        Eagle3DraftModel.from_pretrained(str(tmp_path))


# --- defaults per format -----------------------------------------------------------------------------

def test_vllm_reads_a_missing_norm_before_residual_as_false(tmp_path):
    saved(tmp_path, "vllm", norm_before_residual=True)
    edit_config(tmp_path, lambda c: c.pop("norm_before_residual"))
    assert Eagle3DraftModel.from_pretrained(str(tmp_path)).config.norm_before_residual is False


@pytest.mark.parametrize("value,final_norm", [(True, True), (False, False)])
def test_specforge_norm_output_is_read_as_specforge_trains_it(tmp_path, caplog, value, final_norm):
    saved(tmp_path, "specforge")
    edit_config(tmp_path, lambda c: c.update(norm_output=value))
    with caplog.at_level(logging.WARNING):
        cfg = Eagle3DraftModel.from_pretrained(str(tmp_path)).config
    assert cfg.final_norm is final_norm and cfg.norm_output is False
    assert "SGLang reads this key" in caplog.text


def test_sglang_legacy_aux_norm_names(tmp_path):
    src = saved(tmp_path, "specforge", fc_norm=True)
    from safetensors.torch import load_file, save_file
    state = load_file(str(tmp_path / "model.safetensors"))
    for i, name in enumerate(("low", "mid", "high")):
        state[f"aux_norm_{name}.weight"] = state.pop(f"fc_norm.{i}.weight")
    save_file(state, str(tmp_path / "model.safetensors"))
    edit_config(tmp_path, lambda c: (c.pop("fc_norm"), c.update(use_aux_norm=True)))
    loaded = Eagle3DraftModel.from_pretrained(str(tmp_path), target_config=target_config())
    loaded.bind_embeddings(src._embed)
    assert loaded.config.fc_norm
    torch.testing.assert_close(logits(loaded)[0], logits(src)[0])


@pytest.mark.parametrize("drop", ["flag", "weights"])
def test_flag_and_weights_must_agree(tmp_path, drop):
    saved(tmp_path, "vllm", fc_norm=True)
    if drop == "flag":
        edit_config(tmp_path, lambda c: c.update(fc_norm=False))
    else:
        from safetensors.torch import load_file, save_file
        state = {k: v for k, v in load_file(str(tmp_path / "model.safetensors")).items() if "fc_norm" not in k}
        save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="flags in config.json disagree"):
        Eagle3DraftModel.from_pretrained(str(tmp_path))


# --- round trips and refusals ------------------------------------------------------------------------

def combos():
    for nbr, pre, out, final in itertools.product([False, True], ["none", "fc_norm", "norm_before_fc"],
                                                  [False, True], [True, False]):
        if out and not final:
            continue
        yield dict(norm_before_residual=nbr, fc_norm=pre == "fc_norm", norm_before_fc=pre == "norm_before_fc",
                   norm_output=out, final_norm=final)


def expressible(fmt, flags):
    if fmt == "eagle3_ext":
        return True
    if fmt == "vllm":
        return flags["final_norm"]
    return not (flags["norm_before_residual"] or flags["norm_before_fc"] or flags["norm_output"]) and (
        fmt == "specforge" or not (flags["fc_norm"] or not flags["final_norm"]))


@pytest.mark.parametrize("fmt", ["eagle3_ext", "vllm", "specforge", "eagle"])
def test_every_flag_round_trips_or_is_refused_by_name(tmp_path, fmt):
    for n, flags in enumerate(combos()):
        src = make_draft(aux_layer_ids=[2, 16, 29], **flags)
        path = tmp_path / str(n)
        if not expressible(fmt, flags):
            with pytest.raises(ValueError, match="cannot express|has no convention flags"):
                src.save_pretrained(str(path), format=fmt)
            continue
        src.save_pretrained(str(path), format=fmt)
        loaded = Eagle3DraftModel.from_pretrained(str(path), target_config=target_config())
        loaded.bind_embeddings(src._embed)
        assert {k: getattr(loaded.config, k) for k in FLAGS} == flags, (fmt, flags)
        for a, b in zip(logits(loaded), logits(src)):
            torch.testing.assert_close(a, b)


def test_each_flag_changes_the_computation():
    # Otherwise the round trips above could not tell a dropped flag from a kept one.
    base = make_draft(fc_norm=True)
    with torch.no_grad():
        for norm in base.fc_norm:
            norm.weight.mul_(3.0)
    reference = logits(base)
    for flag, value in (("norm_before_residual", True), ("norm_output", True), ("final_norm", False)):
        other = make_draft(fc_norm=True, **{flag: value})
        other.load_state_dict(base.state_dict())
        other.bind_embeddings(base._embed)
        assert not torch.allclose(logits(other)[1 if flag == "norm_output" else 0], reference[1 if flag ==
                                  "norm_output" else 0], atol=1e-3), flag
    plain = make_draft()
    plain.load_state_dict({k: v for k, v in base.state_dict().items() if "fc_norm" not in k})
    plain.bind_embeddings(base._embed)
    assert not torch.allclose(logits(plain)[0], reference[0], atol=1e-3)


def test_joint_norm_equals_rmsnorm_of_the_concatenation():
    norm = RMSNorm(3 * H, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(3 * H) + 0.5)
    parts = [torch.randn(2, 4, H) * s for s in (0.1, 1.0, 10.0)]
    torch.testing.assert_close(torch.cat(joint_rms_norm(parts, norm), -1), norm(torch.cat(parts, -1)))


def test_vllm_export_carries_speculators_config(tmp_path):
    make_draft().save_pretrained(str(tmp_path), format="vllm", speculative_tokens=4,
                                 verifier={"name_or_path": "org/target", "architectures": ["LlamaForCausalLM"]})
    config = json.loads((tmp_path / "config.json").read_text())
    block = config["speculators_config"]
    assert block["algorithm"] == "eagle3" and block["default_proposal_method"] == "greedy"
    assert block["proposal_methods"][0] == {"proposal_type": "greedy", "speculative_tokens": 4,
                                            "verifier_accept_k": 1, "accept_tolerance": 0.0}
    assert block["verifier"] == {"name_or_path": "org/target", "architectures": ["LlamaForCausalLM"]}
    assert config["norm_before_residual"] is False and config["eagle_aux_hidden_state_layer_ids"] == [2, 16, 29]
    with pytest.raises(ValueError, match="speculative_tokens must be a positive integer"):
        make_draft().save_pretrained(str(tmp_path), format="vllm", speculative_tokens=0)
