"""The GGUF converter of the llama.cpp peer row: the RoPE row order checked against both
conventions' rotations written out here, the file read back with gguf's own reader, and,
where llama-cpp-python is installed, llama.cpp's greedy tokens against Hugging Face's."""

import json
import os

import pytest
import torch

from eagle3_ext.peers.gguf_export import check_convertible, rope_pairs_from_halves

BUNDLED_TARGET = os.path.join(os.path.dirname(__import__("eagle3_ext").__file__), "models", "target")


def _angles(d: int, pos: int) -> torch.Tensor:
    return pos * 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # [d/2]


def rope_halves(x: torch.Tensor, pos: int) -> torch.Tensor:
    """Hugging Face's Llama rotation: element i pairs with i + d/2."""
    d = x.shape[-1]
    a = _angles(d, pos)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * a.cos() - x2 * a.sin(), x2 * a.cos() + x1 * a.sin()], dim=-1)


def rope_pairs(x: torch.Tensor, pos: int) -> torch.Tensor:
    """llama.cpp's normal rotation: element 2i pairs with 2i + 1."""
    d = x.shape[-1]
    a = _angles(d, pos)
    even, odd = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = even * a.cos() - odd * a.sin()
    out[..., 1::2] = odd * a.cos() + even * a.sin()
    return out


@pytest.mark.parametrize("heads,d", [(1, 8), (6, 64), (2, 16)])
def test_permuted_rows_give_the_same_attention_scores(heads, d):
    g = torch.Generator().manual_seed(0)
    wq = torch.randn(heads * d, 32, generator=g, dtype=torch.float64)
    wk = torch.randn(heads * d, 32, generator=g, dtype=torch.float64)
    x, y = torch.randn(32, generator=g, dtype=torch.float64), torch.randn(32, generator=g, dtype=torch.float64)
    q_hf = rope_halves((wq @ x).view(heads, d), pos=7)
    k_hf = rope_halves((wk @ y).view(heads, d), pos=3)
    q_ll = rope_pairs((rope_pairs_from_halves(wq, heads) @ x).view(heads, d), pos=7)
    k_ll = rope_pairs((rope_pairs_from_halves(wk, heads) @ y).view(heads, d), pos=3)
    torch.testing.assert_close((q_ll * k_ll).sum(-1), (q_hf * k_hf).sum(-1))
    # and without the reordering the scores differ: the test sees a wrong layout
    q_bad = rope_pairs((wq @ x).view(heads, d), pos=7)
    k_bad = rope_pairs((wk @ y).view(heads, d), pos=3)
    assert not torch.allclose((q_bad * k_bad).sum(-1), (q_hf * k_hf).sum(-1))


@pytest.mark.parametrize("change,message", [
    ({"model_type": "qwen2"}, "model_type 'qwen2' is not supported"),
    ({"attention_bias": True}, "biases"),
    ({"sliding_window": 4096}, "sliding window"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "RoPE type 'yarn'"),
    ({"hidden_act": "gelu"}, "activation 'gelu'"),
])
def test_refuses_what_llama_cpp_would_run_differently(change, message):
    with open(os.path.join(BUNDLED_TARGET, "config.json")) as f:
        config = json.load(f)
    check_convertible(config)
    with pytest.raises(ValueError, match=message):
        check_convertible({**config, **change})


@pytest.fixture(scope="module")
def bundled_gguf(tmp_path_factory):
    pytest.importorskip("gguf", reason="gguf is not installed")
    from eagle3_ext.peers.llama_cpp import gguf_path

    return gguf_path(BUNDLED_TARGET, str(tmp_path_factory.mktemp("gguf")))


def test_written_file_reads_back(bundled_gguf):
    import gguf
    from safetensors.torch import load_file

    reader = gguf.GGUFReader(bundled_gguf)
    with open(os.path.join(BUNDLED_TARGET, "config.json")) as f:
        config = json.load(f)
    fields = {name: f.contents() for name, f in reader.fields.items() if name.startswith(("llama.", "general.arch"))}
    assert fields["general.architecture"] == "llama"
    assert fields["llama.block_count"] == config["num_hidden_layers"]
    assert fields["llama.attention.head_count_kv"] == config["num_key_value_heads"]
    tensors = {t.name: t for t in reader.tensors}
    assert len(tensors) == 2 + 9 * config["num_hidden_layers"]  # tied: no output.weight
    weights = load_file(os.path.join(BUNDLED_TARGET, "model.safetensors"))
    q = torch.from_numpy(tensors["blk.3.attn_q.weight"].data.copy())
    expected = rope_pairs_from_halves(weights["model.layers.3.self_attn.q_proj.weight"].float(),
                                      config["num_attention_heads"])
    assert torch.equal(q, expected)
    v = torch.from_numpy(tensors["blk.3.attn_v.weight"].data.copy())
    assert torch.equal(v, weights["model.layers.3.self_attn.v_proj.weight"].float())  # V is not rotated


def test_llama_cpp_decodes_the_same_tokens_as_hf(bundled_gguf):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (an optional source build)")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eagle3_ext.bench.baseline import hf_generate
    from eagle3_ext.models import bundled_eval_prompts
    from eagle3_ext.peers.llama_cpp import LlamaCppGreedy

    tok = AutoTokenizer.from_pretrained(BUNDLED_TARGET)
    target = AutoModelForCausalLM.from_pretrained(BUNDLED_TARGET, dtype=torch.float32)
    runner = LlamaCppGreedy(bundled_gguf, 512, target.generation_config.eos_token_id)
    for prompt in bundled_eval_prompts()[:3]:
        ref, _ = hf_generate(target, tok, [prompt], 48)
        ours, _ = runner.generate(tok(prompt).input_ids, 48)
        assert ours == ref[0]


def test_the_conversion_cache_key_follows_the_checkpoint_files(tmp_path):
    """A bench run reuses the converted GGUF without reading the weights again, and converts
    anew once a weight or config file changes."""
    import shutil

    from eagle3_ext.peers.llama_cpp import checkpoint_key

    target = tmp_path / "target"
    shutil.copytree(BUNDLED_TARGET, target)
    key = checkpoint_key(str(target))
    assert checkpoint_key(str(target)) == key
    config = target / "config.json"
    stat = config.stat()
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert checkpoint_key(str(target)) != key
    assert checkpoint_key(BUNDLED_TARGET) != checkpoint_key(str(target))  # another directory
