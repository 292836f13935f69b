import json
import math
import os

import pytest
import torch
import torch.nn.functional as F

from eagle3_ext import Eagle3DraftModel, resolve_aux_layer_ids
from eagle3_ext.draft import eagle_default_aux_layers
from eagle3_ext.draft.rope import rope_inv_freq

from tiny_models import DRAFT_VOCAB, H, VOCAB, make_config, make_draft


def target_config(layers=32, hidden=H, vocab=VOCAB):
    return {"num_hidden_layers": layers, "hidden_size": hidden, "vocab_size": vocab}


# --- published config shapes (Llama-3.1-8B drafts, dimensions scaled down, same keys) ------------

LLAMA_KEYS = {"architectures": ["LlamaForCausalLMEagle3"], "bos_token_id": 128000, "eos_token_id": 128001,
              "hidden_act": "silu", "hidden_size": H, "initializer_range": 0.02, "intermediate_size": 128,
              "max_position_embeddings": 2048, "model_type": "llama", "num_attention_heads": 4,
              "num_hidden_layers": 1, "num_key_value_heads": 2, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
              "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                               "original_max_position_embeddings": 8192, "rope_type": "llama3"},
              "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
              "use_cache": True, "vocab_size": VOCAB, "draft_vocab_size": DRAFT_VOCAB}


def test_eagle_official_config_resolves_to_default():
    r = resolve_aux_layer_ids(LLAMA_KEYS, 32)
    assert r.ids == (2, 16, 29) and "EAGLE default" in r.rule and r.raw is None


def test_specforge_config_counts_layer_outputs():
    cfg = dict(LLAMA_KEYS, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 15, 28],
                                         "use_aux_hidden_state": True})
    r = resolve_aux_layer_ids(cfg, 32)
    assert r.ids == (2, 16, 29) and r.raw == (1, 15, 28) and "SpecForge" in r.rule


def test_vllm_config_uses_raw_indices():
    cfg = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
           "transformer_layer_config": dict(LLAMA_KEYS), "draft_vocab_size": DRAFT_VOCAB,
           "norm_before_residual": True, "target_hidden_size": H, "eagle_aux_hidden_state_layer_ids": [2, 16, 29]}
    r = resolve_aux_layer_ids(cfg, 32)
    assert r.ids == (2, 16, 29) and "vLLM" in r.rule


def test_own_format_stores_internal_ids():
    r = resolve_aux_layer_ids({"eagle3_ext": {"aux_layer_ids": [0, 3], "aux_layer_convention": "hf_hidden_states_index"}})
    assert r.ids == (0, 3)
    with pytest.raises(ValueError, match="unknown convention"):
        resolve_aux_layer_ids({"eagle3_ext": {"aux_layer_ids": [1], "aux_layer_convention": "layer_output"}})


def test_conflicting_conventions_are_an_error():
    cfg = dict(LLAMA_KEYS, eagle_aux_hidden_state_layer_ids=[1, 15, 28],
               eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 15, 28]})
    with pytest.raises(ValueError, match="disagree"):
        resolve_aux_layer_ids(cfg, 32)


def test_default_needs_layer_count():
    r = resolve_aux_layer_ids(LLAMA_KEYS, None)
    assert r.ids is None and "needs the target's layer count" in r.rule
    with pytest.raises(ValueError, match="at least 4 layers"):
        eagle_default_aux_layers(3)


def _write_checkpoint(path, config, model, names="midlayer", binary=False):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    state = {}
    for k, v in model.state_dict().items():
        if names == "midlayer" and k.startswith("layers.0."):
            k = "midlayer." + k[len("layers.0."):]
        state[k] = v.contiguous()
    state["embed_tokens.weight"] = model._embed.weight.detach().clone()  # some checkpoints carry the target's
    if binary:
        torch.save(state, os.path.join(path, "pytorch_model.bin"))
    else:
        from safetensors.torch import save_file
        save_file(state, os.path.join(path, "model.safetensors"))


@pytest.mark.parametrize("binary", [False, True], ids=["safetensors", "bin"])
def test_load_hand_written_eagle_checkpoint(tmp_path, binary):
    src = make_draft(rope_scaling=LLAMA_KEYS["rope_scaling"], rms_norm_eps=1e-5)
    _write_checkpoint(tmp_path, LLAMA_KEYS, src, binary=binary)
    loaded = Eagle3DraftModel.from_pretrained(str(tmp_path), target_config=target_config())
    assert loaded.aux_layer_ids == [2, 16, 29]
    assert "EAGLE default" in loaded.aux_layer_ids_source
    assert loaded.config.own_embeddings  # carried until compared with the target's
    loaded.bind_embeddings(src._embed)   # equal to the target's: shared, the copy dropped
    assert loaded.embed_tokens is None and not loaded.config.own_embeddings
    for (k, a), (k2, b) in zip(sorted(src.state_dict().items()), sorted(loaded.state_dict().items())):
        assert k == k2 and torch.equal(a, b)


def test_own_embeddings_that_differ_are_used_and_exported(tmp_path):
    src = make_draft()
    _write_checkpoint(tmp_path / "in", LLAMA_KEYS, src)
    own = torch.randn(VOCAB, H)
    from safetensors.torch import load_file, save_file
    state = load_file(str(tmp_path / "in" / "model.safetensors"))
    state["embed_tokens.weight"] = own
    save_file(state, str(tmp_path / "in" / "model.safetensors"))
    loaded = Eagle3DraftModel.from_pretrained(str(tmp_path / "in"), target_config=target_config())
    loaded.bind_embeddings(src._embed)
    assert loaded.embed_tokens is not None and torch.equal(loaded.embed_tokens.weight, own)
    ids = torch.randint(0, VOCAB, (1, 4))
    torch.testing.assert_close(loaded.embed(ids), own[ids])
    for fmt in ("vllm", "specforge", "eagle3_ext"):
        loaded.save_pretrained(str(tmp_path / fmt), format=fmt)
        assert torch.equal(load_file(str(tmp_path / fmt / "model.safetensors"))["embed_tokens.weight"], own)


def test_load_without_target_leaves_default_unresolved_until_validated(tmp_path):
    _write_checkpoint(tmp_path, LLAMA_KEYS, make_draft())
    loaded = Eagle3DraftModel.from_pretrained(str(tmp_path))
    assert loaded.aux_layer_ids is None
    loaded.validate_against_target(target_config(layers=40))
    assert loaded.aux_layer_ids == [2, 20, 37]


def test_four_ids_with_embedding_for_fc_trained_on_three(tmp_path):
    cfg = {"speculators_model_type": "eagle3", "transformer_layer_config": dict(LLAMA_KEYS),
           "draft_vocab_size": DRAFT_VOCAB, "eagle_aux_hidden_state_layer_ids": [0, 2, 16, 29]}
    _write_checkpoint(tmp_path, cfg, make_draft(), names="layers")
    with pytest.raises(ValueError) as e:
        Eagle3DraftModel.from_pretrained(str(tmp_path), target_config=target_config())
    msg = str(e.value)
    assert "4 aux layers [0, 2, 16, 29] x hidden 64 = 256" in msg
    assert "fc expects 192 = 3 x 64" in msg and "embedding output" in msg


@pytest.mark.parametrize("fmt", ["eagle3_ext", "eagle", "specforge", "vllm"])
@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "bin"])
def test_round_trip(tmp_path, fmt, safe):
    src = make_draft(norm_before_residual=(fmt in ("eagle3_ext", "vllm")))
    src.save_pretrained(str(tmp_path), format=fmt, safe_serialization=safe)
    assert os.path.exists(tmp_path / ("model.safetensors" if safe else "pytorch_model.bin"))
    loaded = Eagle3DraftModel.from_pretrained(str(tmp_path), target_config=target_config())
    assert loaded.aux_layer_ids == [2, 16, 29]
    assert loaded.config.norm_before_residual == src.config.norm_before_residual
    for (k, a), (_, b) in zip(sorted(src.state_dict().items()), sorted(loaded.state_dict().items())):
        assert torch.equal(a, b), k
    loaded.bind_embeddings(src._embed)
    ids = torch.randint(0, VOCAB, (1, 5))
    feat = torch.randn(1, 5, H)
    pos = torch.arange(5)[None]
    torch.testing.assert_close(loaded(ids, feat, pos).logits, src(ids, feat, pos).logits)


def test_save_refuses_what_a_format_cannot_express(tmp_path):
    with pytest.raises(ValueError, match="EAGLE's layout stores no aux ids"):
        make_draft(aux_layer_ids=[3, 16, 29]).save_pretrained(str(tmp_path), format="eagle")
    with pytest.raises(ValueError, match="embedding output"):
        make_draft(aux_layer_ids=[0, 16, 29]).save_pretrained(str(tmp_path), format="specforge")
    with pytest.raises(ValueError, match="format must be one of"):
        make_draft().save_pretrained(str(tmp_path), format="onnx")


# --- validation against the target ---------------------------------------------------------------

def test_validation_errors_name_the_numbers():
    d = make_draft()
    with pytest.raises(ValueError, match=r"target hidden size 128 differs from the draft's target_hidden_size 64"):
        d.validate_against_target(target_config(hidden=128))
    with pytest.raises(ValueError, match=r"target vocabulary 100 differs from the draft's vocab_size 96"):
        d.validate_against_target(target_config(vocab=100))
    with pytest.raises(ValueError, match=r"trained on a target with 32 layers but this target has 24"):
        d.validate_against_target(target_config(layers=24))
    d2 = make_draft(aux_layer_ids=[2, 16, 40], target_num_hidden_layers=None)
    with pytest.raises(ValueError, match=r"include \[40\], outside \[0, 32\]"):
        d2.validate_against_target(target_config())


def test_vocab_mapping_checks():
    d = make_draft()
    d.validate_against_target(target_config())
    with torch.no_grad():
        d.d2t.zero_()
    with pytest.raises(ValueError, match="d2t is all zeros"):
        d.check_vocab_mapping()
    d = make_draft()
    with torch.no_grad():
        d.d2t[-1] = VOCAB
    with pytest.raises(ValueError, match=r"outside the target vocabulary \[0, 96\)"):
        d.check_vocab_mapping()
    d = make_draft()
    with torch.no_grad():
        d.t2d[1] = True
    with pytest.raises(ValueError, match="t2d marks 49 target ids but d2t maps 48"):
        d.check_vocab_mapping()


def test_config_validation():
    with pytest.raises(ValueError, match="num_attention_heads=4 is not a multiple of num_key_value_heads=3"):
        make_config(num_key_value_heads=3)
    with pytest.raises(ValueError, match="draft_vocab_size=200 is larger"):
        make_config(draft_vocab_size=200)
    with pytest.raises(ValueError, match="rope_type 'yarn' is not supported"):
        make_config(rope_scaling={"rope_type": "yarn", "factor": 2.0})


# --- numerics ------------------------------------------------------------------------------------

def test_llama3_rope_matches_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    scaling = LLAMA_KEYS["rope_scaling"]
    cfg = LlamaConfig(hidden_size=256, num_attention_heads=2, rope_theta=500000.0, rope_scaling=dict(scaling),
                      max_position_embeddings=131072)
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    torch.testing.assert_close(rope_inv_freq(128, 500000.0, scaling), expected.float())


def plain_forward(model, ids, features, positions):
    """Independent re-implementation of the EAGLE-3 draft step (causal, no cache)."""
    cfg = model.config
    sd = {k: v.float() for k, v in model.state_dict().items()}

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps))

    def rope(x, pos):
        inv = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        ang = pos[..., None].float() * inv
        cos, sin = torch.cat([ang, ang], -1).cos()[:, :, None], torch.cat([ang, ang], -1).sin()[:, :, None]
        x1, x2 = x[..., : cfg.head_dim // 2], x[..., cfg.head_dim // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    emb = model._embed(ids).float()
    h = features.float()
    x = torch.cat([rms(emb, sd["layers.0.input_layernorm.weight"]), rms(h, sd["layers.0.hidden_norm.weight"])], -1)
    residual = rms(h, sd["layers.0.hidden_norm.weight"]) if cfg.norm_before_residual else h
    b, n, _ = x.shape
    q = (x @ sd["layers.0.self_attn.q_proj.weight"].T).view(b, n, cfg.num_attention_heads, cfg.head_dim)
    k = (x @ sd["layers.0.self_attn.k_proj.weight"].T).view(b, n, cfg.num_key_value_heads, cfg.head_dim)
    v = (x @ sd["layers.0.self_attn.v_proj.weight"].T).view(b, n, cfg.num_key_value_heads, cfg.head_dim)
    q, k = rope(q, positions), rope(k, positions)
    rep = cfg.num_attention_heads // cfg.num_key_value_heads
    k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(cfg.head_dim)
    scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    attn = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(b, n, -1)
    h = residual + attn @ sd["layers.0.self_attn.o_proj.weight"].T
    m = rms(h, sd["layers.0.post_attention_layernorm.weight"])
    m = (F.silu(m @ sd["layers.0.mlp.gate_proj.weight"].T) * (m @ sd["layers.0.mlp.up_proj.weight"].T)) @ sd["layers.0.mlp.down_proj.weight"].T
    h = h + m
    return rms(h, sd["norm.weight"]) @ sd["lm_head.weight"].T, h


@pytest.mark.parametrize("norm_before_residual", [False, True], ids=["residual-raw", "norm-before-residual"])
def test_forward_matches_plain_reimplementation(norm_before_residual):
    d = make_draft(norm_before_residual=norm_before_residual)
    aux = [torch.randn(2, 7, H) for _ in range(3)]
    ids = torch.randint(0, VOCAB, (2, 7))
    pos = torch.arange(7).expand(2, 7) + 90  # past the llama3 original context: scaled band
    features = d.project_aux(aux)
    torch.testing.assert_close(features, torch.cat(aux, -1) @ d.fc.weight.T)
    out = d(ids, features, pos)
    logits, hidden = plain_forward(d, ids, features, pos)
    torch.testing.assert_close(out.logits, logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out.hidden, hidden, atol=1e-4, rtol=1e-4)


def test_prefill_equals_step_by_step_tree_decoding():
    d = make_draft()
    b, t = 2, 9
    ids = torch.randint(0, VOCAB, (b, t))
    feats = torch.randn(b, t, H)
    pos = torch.arange(t).expand(b, t)
    full = d(ids, feats, pos).logits

    # Prefill the first 4 tokens, then feed the rest one step at a time as a chain "tree".
    cache = d.new_cache(b, 32)
    first = d(ids[:, :4], feats[:, :4], pos[:, :4], cache=cache).logits
    cache.commit()
    steps = [first]
    for j in range(4, t):
        mask = torch.ones(b, 1, cache.tree_len + 1, dtype=torch.bool)
        steps.append(d(ids[:, j:j + 1], feats[:, j:j + 1], pos[:, j:j + 1], cache=cache, tree_mask=mask).logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


def prefix_then_two_siblings(d):
    """Commits 3 prompt tokens, then drafts two siblings a, b (both at position 3)."""
    ids = torch.randint(0, VOCAB, (1, 6))
    feats = torch.randn(1, 6, H)
    cache = d.new_cache(1, 16)
    d(ids[:, :3], feats[:, :3], torch.arange(3)[None], cache=cache)
    cache.commit()
    siblings = d(ids[:, 3:5], feats[:, 3:5], torch.tensor([[3, 3]]), cache=cache,
                 tree_mask=torch.tensor([[[True, False], [False, True]]]))
    return ids, feats, cache, siblings


def chain(d, ids, feats):
    return d(ids, feats, torch.arange(ids.shape[1])[None]).logits


def test_tree_step_sees_only_ancestors():
    # Each tree token's logits must equal a plain chain over its own root-to-node path.
    d = make_draft()
    ids, feats, cache, siblings = prefix_then_two_siblings(d)
    child_of_a = d(ids[:, 5:6], feats[:, 5:6], torch.tensor([[4]]), cache=cache,
                   tree_mask=torch.tensor([[[True, False, True]]]))
    path_a = [0, 1, 2, 3, 5]
    path_b = [0, 1, 2, 4]
    chain_a, chain_b = chain(d, ids[:, path_a], feats[:, path_a]), chain(d, ids[:, path_b], feats[:, path_b])
    torch.testing.assert_close(siblings.logits[:, 0], chain_a[:, 3], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(siblings.logits[:, 1], chain_b[:, 3], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(child_of_a.logits[:, 0], chain_a[:, 4], atol=1e-5, rtol=1e-5)


def test_cache_keep_compacts_accepted_path():
    d = make_draft()
    ids, feats, cache, _ = prefix_then_two_siblings(d)
    cache.keep(torch.tensor([[1]]))  # accept the second sibling
    nxt = d(ids[:, 5:6], feats[:, 5:6], torch.tensor([[4]]), cache=cache).logits
    path = [0, 1, 2, 4, 5]
    torch.testing.assert_close(nxt[:, 0], chain(d, ids[:, path], feats[:, path])[:, 4], atol=1e-5, rtol=1e-5)


def test_forward_argument_errors():
    d = make_draft()
    ids = torch.randint(0, VOCAB, (1, 3))
    with pytest.raises(ValueError, match=r"hidden_states must be \[1, 3, 64\]"):
        d(ids, torch.randn(1, 3, 32), torch.arange(3)[None])
    with pytest.raises(ValueError, match=r"tree_mask must be bool \[1, 3, 3\]"):
        d(ids, torch.randn(1, 3, H), torch.arange(3)[None], tree_mask=torch.ones(1, 3, 3))
    unbound = Eagle3DraftModel(make_config())
    with pytest.raises(RuntimeError, match="bind_embeddings"):
        unbound(ids, torch.randn(1, 3, H), torch.arange(3)[None])


def test_two_layer_draft_round_trips_in_own_format(tmp_path):
    src = make_draft(num_hidden_layers=2)
    assert not src.layers[1].reads_embeddings and src.layers[1].self_attn.q_proj.in_features == H
    src.save_pretrained(str(tmp_path))
    loaded = Eagle3DraftModel.from_pretrained(str(tmp_path), target_config=target_config())
    assert loaded.config.num_hidden_layers == 2
    loaded.bind_embeddings(src._embed)
    ids, feats, pos = torch.randint(0, VOCAB, (1, 4)), torch.randn(1, 4, H), torch.arange(4)[None]
    torch.testing.assert_close(loaded(ids, feats, pos).logits, src(ids, feats, pos).logits)
    with pytest.raises(ValueError, match="stores exactly one draft layer"):
        src.save_pretrained(str(tmp_path / "x"), format="specforge")


def test_bfloat16_forward_close_to_float32():
    d = make_draft()
    ids, pos = torch.randint(0, VOCAB, (2, 5)), torch.arange(5).expand(2, 5)
    aux = [torch.randn(2, 5, H) for _ in range(3)]
    ref = d(ids, d.project_aux(aux), pos).logits
    d16 = d.to(torch.bfloat16)
    d16.bind_embeddings(torch.nn.Embedding.from_pretrained(d._embed.weight.to(torch.bfloat16)))
    out = d16(ids, d16.project_aux(aux), pos).logits
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=0.15, rtol=0.05)
