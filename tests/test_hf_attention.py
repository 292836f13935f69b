"""eagle3_ext.hf_attention: a tree verify forward of a small random Llama through the op."""

import copy

import pytest
import torch

from conftest import DEVICES
from eagle3_ext import reference

transformers = pytest.importorskip("transformers")
from eagle3_ext import hf_attention  # noqa: E402

PROMPT = 11
# parents of the tree tokens (-1: child of the last prompt token), EAGLE-style: 2 branches.
PARENTS = [-1, 0, 0, 1, 2, 3, 1]


FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 64}),
}


def tiny_model(device, family="llama"):
    config_name, model_name, extra = FAMILIES[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2, head_dim=16, max_position_embeddings=128, **extra,
    )
    return getattr(transformers, model_name)(config).eval().to(device)


def tree_inputs(parents, batch, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = len(parents)
    depth, mask = [0] * n, torch.zeros(n, n, dtype=torch.bool)
    for i, par in enumerate(parents):
        depth[i] = 0 if par < 0 else depth[par] + 1
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    ids = torch.randint(0, 97, (batch, n), generator=g)
    positions = PROMPT + torch.tensor(depth).expand(batch, n)
    return ids.to(device), positions.to(device), mask.expand(batch, n, n).contiguous().to(device)


def path(parents, i):
    out = []
    while i >= 0:
        out.append(i)
        i = parents[i]
    return out[::-1]


@pytest.fixture(scope="module", autouse=True)
def registered():
    return hf_attention.register()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_tree_forward_matches_per_path_forwards_and_sdpa_4d_mask(device, family):
    model = tiny_model(device, family)
    batch = 2
    prompt = torch.randint(0, 97, (batch, PROMPT), generator=torch.Generator().manual_seed(1)).to(device)
    ids, positions, mask = tree_inputs(PARENTS, batch, device)
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        prefill = model(input_ids=prompt, use_cache=True)
        cache = prefill.cache

        model.set_attn_implementation(hf_attention.ATTENTION_NAME)
        lens = torch.full((batch,), PROMPT, dtype=torch.int32, device=device)
        tree = model(input_ids=ids, position_ids=positions, cache=copy.deepcopy(cache),
                     use_cache=True, tree_mask=mask, cache_lens=lens).logits

        # SDPA with the equivalent 4D mask over the same cache.
        model.set_attn_implementation("sdpa")
        dense = reference.dense_tree_mask(lens, mask, PROMPT + len(PARENTS))
        sdpa = model(input_ids=ids, position_ids=positions, cache=copy.deepcopy(cache),
                     use_cache=True, attention_mask=dense).logits
        torch.testing.assert_close(tree, sdpa, atol=1e-4, rtol=1e-4)

        # Each tree token's logits equal a plain forward over prompt + its root-to-node path.
        for i in range(len(PARENTS)):
            p = path(PARENTS, i)
            seq = torch.cat([prompt, ids[:, p]], dim=1)
            plain = model(input_ids=seq).logits[:, -1]
            torch.testing.assert_close(tree[:, i], plain, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_without_tree_kwargs_it_is_sdpa(device):
    model = tiny_model(device)
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(2)).to(device)
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        expected = model(input_ids=ids).logits
        model.set_attn_implementation(hf_attention.ATTENTION_NAME)
        got = model(input_ids=ids).logits
        # decode over a cache (q_len > 1 over a non-empty cache needs the causal mask the
        # mask interface registration provides)
        out = model(input_ids=ids[:, :5], use_cache=True)
        cache = out.cache
        rest = model(input_ids=ids[:, 5:], cache=cache, use_cache=True).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rest, expected[:, 5:], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("window", [3, 8], ids=lambda w: f"window{w}")
def test_sliding_window_tree_forward_matches_per_path_forwards(window):
    # A window shorter than prompt + tree: the tree forward over a full-history cache must equal
    # a plain forward of the model (with its own sliding-window mask) over prompt + each path.
    model = tiny_model("cpu", "mistral")
    model.config.sliding_window = window
    ids, positions, mask = tree_inputs(PARENTS, 1, "cpu")
    prompt = torch.randint(0, 97, (1, PROMPT), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        cache = model(input_ids=prompt, use_cache=True, cache=transformers.DynamicCache()).cache
        model.set_attn_implementation(hf_attention.ATTENTION_NAME)
        tree = model(input_ids=ids, position_ids=positions, cache=cache, tree_mask=mask,
                     cache_lens=torch.tensor([PROMPT])).logits
        model.set_attn_implementation("sdpa")
        for i in range(len(PARENTS)):
            seq = torch.cat([prompt, ids[:, path(PARENTS, i)]], dim=1)
            torch.testing.assert_close(tree[:, i], model(input_ids=seq).logits[:, -1], atol=1e-4, rtol=1e-4)


def test_one_tree_keyword_alone_is_an_error():
    model = tiny_model("cpu")
    model.set_attn_implementation(hf_attention.ATTENTION_NAME)
    ids, positions, mask = tree_inputs(PARENTS, 1, "cpu")
    with pytest.raises(ValueError, match="pass both tree_mask and cache_lens"):
        model(input_ids=ids, position_ids=positions, tree_mask=mask)
