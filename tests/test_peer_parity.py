"""Parity with the peers' own model code: SpecForge's ``LlamaForCausalLMEagle3`` and vLLM
speculators' ``Eagle3DraftModel``, installed from PyPI as test dependencies.

For every convention-flag combination each format can express, a draft with random weights is
exported by this library, loaded by the peer's own loader, and the logits of the first step and
of a three-step training-time-test unroll are compared (fp32, max |difference| <= 1e-4). The
other direction too: the peer saves the model with its own writer and this library loads it.

Adaptations, all of how the peers are driven on a CPU with transformers 5.24 (both pin older
versions), not of what they compute: SpecForge's rope cache is a non-persistent buffer that
transformers' meta-device loading leaves empty, so it is rebuilt with SpecForge's own
``_init_rope``; the token embedding, which neither checkpoint stores and which both take from the
target, is copied from the target into both (speculators' own verifier loading leaves it
uninitialized under this transformers); speculators defaults to flex attention, which needs
torch.compile, so its layers run transformers' eager attention with speculators' own dense float
masks.
"""

import itertools
import json

import pytest
import torch

from eagle3_ext import Eagle3DraftModel
from eagle3_ext.train.ttt import shift, ttt_logits
from tiny_models import H, VOCAB, make_draft

specforge_draft = pytest.importorskip("specforge.modeling.draft.llama3_eagle",
                                      reason="specforge is not installed (make test installs it)")
speculators_eagle3 = pytest.importorskip("speculators.models.eagle3",
                                         reason="speculators is not installed (make test installs it)")

pytestmark = pytest.mark.peers

LAYERS, AUX, STEPS, T = 8, [2, 4, 5], 3, 11
TOL = 1e-4


@pytest.fixture(autouse=True)
def no_dynamo():
    # The peers decorate helpers with torch.compile; eager is what is compared here.
    import torch._dynamo
    with torch._dynamo.config.patch(disable=True):
        yield


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    """A random Llama target of the drafts' width and vocabulary (speculators reads the
    verifier's embeddings from it)."""
    import transformers
    torch.manual_seed(1)
    cfg = transformers.LlamaConfig(hidden_size=H, intermediate_size=128, num_hidden_layers=LAYERS,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=VOCAB)
    path = tmp_path_factory.mktemp("peer_target")
    transformers.LlamaForCausalLM(cfg).save_pretrained(str(path))
    return path


def target_embedding(target_dir):
    from safetensors.torch import load_file
    weight = load_file(str(target_dir / "model.safetensors"))["model.embed_tokens.weight"]
    return torch.nn.Embedding.from_pretrained(weight)


def our_draft(target_dir, **flags):
    draft = make_draft(aux_layer_ids=AUX, target_num_hidden_layers=LAYERS, rope_scaling=None, rope_theta=10000.0,
                       rms_norm_eps=1e-5, head_dim=16, **flags)
    draft.bind_embeddings(target_embedding(target_dir))
    return draft


def inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    aux = [torch.randn(1, T, H, generator=gen) for _ in AUX]
    ids = torch.randint(0, VOCAB, (1, T), generator=gen)
    return aux, ids


def our_logits(draft, aux, ids):
    with torch.no_grad():
        return [x for x in ttt_logits(draft, aux, ids, torch.ones_like(ids, dtype=torch.bool), STEPS)]


def written_by_peer(peer, path, target_dir):
    """The peer's model saved by the peer's own writer and loaded back by this library."""
    peer.save_pretrained(str(path))
    back = Eagle3DraftModel.from_pretrained(str(path), target_config=json.loads((target_dir / "config.json").read_text()))
    back.bind_embeddings(target_embedding(target_dir))
    return back


def assert_same(ours, theirs, what):
    assert len(ours) == len(theirs) == STEPS
    for step, (a, b) in enumerate(zip(ours, theirs)):
        diff = (a.float() - b.float()).abs().max().item()
        assert diff <= TOL, f"{what}: step {step} max |logit difference| {diff:.3g} > {TOL}"


# --- SpecForge --------------------------------------------------------------------------------------

def specforge_load(path, target_dir):
    model = specforge_draft.LlamaForCausalLMEagle3.from_pretrained(str(path), torch_dtype=torch.float32).eval()
    model.midlayer.self_attn._init_rope()
    with torch.no_grad():
        model.embed_tokens.weight.copy_(target_embedding(target_dir).weight)
    return model


def specforge_logits(model, aux, ids):
    """SpecForge's training-time-test loop (algorithms/eagle3/model.py) driven step by step:
    each step's backbone output is the next step's hidden state; its cache_hidden holds the keys."""
    b, t = ids.shape
    with torch.no_grad():
        hidden = model.project_hidden_states(torch.cat(aux, -1))
        mask = model.prepare_decoder_attention_mask(attention_mask=torch.ones(b, t, dtype=torch.bool),
                                                    hidden_states=hidden, batch_size=b, seq_length=t,
                                                    past_key_values_length=0)
        cache, out = [[], []], []
        positions = torch.arange(t)[None].expand(b, t)
        for i in range(STEPS):
            embeds = model.embed_input_ids(shift(ids, 1 + i))
            hidden = model.backbone(input_embeds=embeds, hidden_states=hidden, cache_hidden=cache,
                                    attention_mask=mask, position_ids=positions)
            out.append(model.compute_logits(hidden))
    return out


SPECFORGE_FLAGS = [dict(fc_norm=a, final_norm=b) for a, b in itertools.product([False, True], [True, False])]


@pytest.mark.parametrize("flags", SPECFORGE_FLAGS, ids=lambda f: "-".join(f"{k}={int(v)}" for k, v in f.items()))
def test_specforge_loads_our_export_and_computes_the_same(tmp_path, target_dir, flags):
    draft = our_draft(target_dir, **flags)
    draft.save_pretrained(str(tmp_path / "sf"), format="specforge")
    peer = specforge_load(tmp_path / "sf", target_dir)
    assert (peer.fc_norm is not None) == flags["fc_norm"] and peer.norm_output == flags["final_norm"]
    aux, ids = inputs()
    assert_same(our_logits(draft, aux, ids), specforge_logits(peer, aux, ids), f"SpecForge {flags}")

    back = written_by_peer(peer, tmp_path / "sf_saved", target_dir)
    assert back.embed_tokens is None  # SpecForge saves the target's embedding; equal, so shared
    assert_same(our_logits(back, aux, ids), specforge_logits(peer, aux, ids), f"SpecForge-written {flags}")


# --- speculators ------------------------------------------------------------------------------------

def speculators_load(path, target_dir):
    from speculators.models.attention import create_float_mask
    model = speculators_eagle3.Eagle3DraftModel.from_pretrained(str(path), torch_dtype=torch.float32).eval()
    model._attn_impl, model._create_mask_fn = "eager", create_float_mask
    model.config.transformer_layer_config._attn_implementation = "eager"
    with torch.no_grad():
        model.embed_tokens.weight.copy_(target_embedding(target_dir).weight)
    return model


def speculators_logits(model, aux, ids):
    out = []
    hook = model.lm_head.register_forward_hook(lambda module, args, result: out.append(result.detach()))
    try:
        with torch.no_grad():
            model(hidden_states=torch.cat(aux, -1), input_ids=shift(ids, 1),
                  document_ids=torch.zeros_like(ids), position_ids=torch.arange(ids.shape[1])[None],
                  ttt_steps=STEPS)
    finally:
        hook.remove()
    return out


SPECULATORS_FLAGS = [dict(norm_before_residual=a, fc_norm=pre == "fc_norm", norm_before_fc=pre == "norm_before_fc",
                          norm_output=c)
                     for a, pre, c in itertools.product([False, True], ["none", "fc_norm", "norm_before_fc"],
                                                        [False, True])]


@pytest.mark.parametrize("flags", SPECULATORS_FLAGS, ids=lambda f: "-".join(f"{k}={int(v)}" for k, v in f.items()))
def test_speculators_loads_our_export_and_computes_the_same(tmp_path, target_dir, flags):
    draft = our_draft(target_dir, **flags)
    draft.save_pretrained(str(tmp_path / "vllm"), format="vllm", speculative_tokens=STEPS,
                          verifier={"name_or_path": str(target_dir), "architectures": ["LlamaForCausalLM"]})
    config = speculators_eagle3.Eagle3SpeculatorConfig.from_pretrained(str(tmp_path / "vllm"))  # its validation
    assert config.speculators_config.proposal_methods[0].speculative_tokens == STEPS
    for key in ("norm_before_residual", "fc_norm", "norm_before_fc", "norm_output"):
        assert getattr(config, key) == flags[key], key
    peer = speculators_load(tmp_path / "vllm", target_dir)
    aux, ids = inputs()
    assert_same(our_logits(draft, aux, ids), speculators_logits(peer, aux, ids), f"speculators {flags}")

    back = written_by_peer(peer, tmp_path / "sp_saved", target_dir)
    for key in ("norm_before_residual", "fc_norm", "norm_before_fc", "norm_output"):
        assert getattr(back.config, key) == flags[key], key
    assert_same(our_logits(back, aux, ids), speculators_logits(peer, aux, ids), f"speculators-written {flags}")


def test_speculators_reads_a_missing_norm_before_residual_as_false(tmp_path, target_dir):
    draft = our_draft(target_dir)
    draft.save_pretrained(str(tmp_path / "vllm"), format="vllm",
                          verifier={"name_or_path": str(target_dir), "architectures": ["LlamaForCausalLM"]})
    config = json.loads((tmp_path / "vllm" / "config.json").read_text())
    del config["norm_before_residual"]
    (tmp_path / "vllm" / "config.json").write_text(json.dumps(config))
    peer_config = speculators_eagle3.Eagle3SpeculatorConfig.from_pretrained(str(tmp_path / "vllm"))
    ours = Eagle3DraftModel.from_pretrained(str(tmp_path / "vllm"))
    assert peer_config.norm_before_residual is False and ours.config.norm_before_residual is False


def test_the_comparison_sees_a_flipped_convention(tmp_path, target_dir):
    # Negative control: the same weights read with the other residual convention differ far
    # beyond the tolerance, so the parity tests above can fail.
    draft = our_draft(target_dir)
    draft.save_pretrained(str(tmp_path / "vllm"), format="vllm",
                          verifier={"name_or_path": str(target_dir), "architectures": ["LlamaForCausalLM"]})
    peer = speculators_load(tmp_path / "vllm", target_dir)
    draft.config.norm_before_residual = True
    for layer in draft.layers:
        layer.norm_before_residual = True
    aux, ids = inputs()
    with pytest.raises(AssertionError, match="max"):
        assert_same(our_logits(draft, aux, ids), speculators_logits(peer, aux, ids), "flipped")
