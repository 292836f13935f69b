"""A Hugging Face Llama-family checkpoint as a GGUF file (f32), so llama.cpp can run the same
model as the library's peer on CPU.

Written on the ``gguf`` package's writer. Two conventions differ between the formats:

- RoPE: Hugging Face's Llama rotates the two halves of each head (``rotate_half``), llama.cpp's
  ``llama`` architecture rotates adjacent pairs. The rows of every head of W_q and W_k are
  therefore reordered so that llama.cpp's pair (2i, 2i+1) holds Hugging Face's (i, i + d/2):
  the scores q.k are unchanged, because both q and k get the same reordering.
- Tensor names: ``model.layers.N.self_attn.q_proj`` is ``blk.N.attn_q`` and so on.

Only what the architecture needs is converted: models whose config.json says ``llama`` or
``mistral`` (without a sliding window), no biases, default RoPE. Anything else is refused
with the reason, not converted into a model that computes something else.
"""

from __future__ import annotations

import json
import os
from typing import Dict, Iterator, Tuple

import numpy as np
import torch

from ..errors import BadInputError

SUPPORTED_MODEL_TYPES = ("llama", "mistral")

# Hugging Face parameter name (after "model.layers.N.") -> GGUF tensor name (after "blk.N.")
_LAYER_NAMES = {
    **{f"self_attn.{p}_proj.weight": f"attn_{g}.weight" for p, g in zip("qkvo", ("q", "k", "v", "output"))},
    **{f"mlp.{p}_proj.weight": f"ffn_{p}.weight" for p in ("gate", "up", "down")},
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
}
_GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                 "lm_head.weight": "output.weight"}


def rope_pairs_from_halves(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Rows of W_q / W_k ``[num_heads * d, in]`` reordered per head from Hugging Face's half
    layout (i, i + d/2) to llama.cpp's adjacent pairs (2i, 2i + 1)."""
    rows, cols = weight.shape
    d = rows // num_heads
    return weight.reshape(num_heads, 2, d // 2, cols).transpose(1, 2).reshape(rows, cols)


def check_convertible(config: dict) -> None:
    """Raises ValueError naming the first property llama.cpp's ``llama`` architecture would run
    differently."""
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise BadInputError(f"GGUF export: model_type {model_type!r} is not supported, expected one of "
                            f"{SUPPORTED_MODEL_TYPES}")
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise BadInputError("GGUF export: biases in attention or MLP are not supported")
    if config.get("sliding_window"):
        raise BadInputError(f"GGUF export: a sliding window ({config['sliding_window']}) is not supported")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type", "default") != "default":
        raise BadInputError(f"GGUF export: RoPE type {rope.get('rope_type')!r} is not supported, expected 'default'")
    if config.get("hidden_act", "silu") != "silu":
        raise BadInputError(f"GGUF export: activation {config.get('hidden_act')!r} is not supported, expected 'silu'")


def _tensors(model, config: dict) -> Iterator[Tuple[str, np.ndarray]]:
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    for name, param in model.state_dict().items():
        w = param.detach().to(torch.float32).cpu()
        if name in _GLOBAL_NAMES:
            if name == "lm_head.weight" and config.get("tie_word_embeddings"):
                continue  # llama.cpp reads the embedding as the output when output.weight is absent
            yield _GLOBAL_NAMES[name], w.numpy()
            continue
        prefix, _, rest = name.partition(".layers.")
        index, _, leaf = rest.partition(".")
        if prefix != "model" or leaf not in _LAYER_NAMES:
            raise BadInputError(f"GGUF export: no GGUF name for parameter {name!r}")
        if leaf == "self_attn.q_proj.weight":
            w = rope_pairs_from_halves(w, heads)
        elif leaf == "self_attn.k_proj.weight":
            w = rope_pairs_from_halves(w, kv_heads)
        yield f"blk.{index}.{_LAYER_NAMES[leaf]}", w.numpy()


def _add_tokenizer(writer, model_dir: str, config: dict) -> None:
    """The byte-level BPE vocabulary and merges of tokenizer.json ("gpt2" in GGUF's terms)."""
    import gguf

    path = os.path.join(model_dir, "tokenizer.json")
    with open(path) as f:
        tok = json.load(f)
    model = tok.get("model", {})
    if model.get("type") != "BPE":
        raise BadInputError(f"GGUF export: {path} holds a {model.get('type')!r} tokenizer, expected byte-level BPE")
    vocab: Dict[str, int] = dict(model["vocab"])
    special = {t["id"] for t in tok.get("added_tokens", []) if t.get("special")}
    for t in tok.get("added_tokens", []):
        vocab.setdefault(t["content"], t["id"])
    size = config["vocab_size"]
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [gguf.TokenType.UNUSED] * size
    for text, i in vocab.items():
        if i < size:
            tokens[i] = text
            types[i] = gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    for key, add in (("eos_token_id", writer.add_eos_token_id), ("bos_token_id", writer.add_bos_token_id),
                     ("pad_token_id", writer.add_pad_token_id)):
        if isinstance(config.get(key), int):
            add(config[key])
    writer.add_add_bos_token(False)  # the library's prompts carry no BOS either


def export_gguf(model_dir: str, out_path: str) -> str:
    """Writes ``model_dir`` (a Hugging Face Llama-family checkpoint with tokenizer.json) as an f32
    GGUF file at ``out_path``; returns the path."""
    import gguf
    from transformers import AutoModelForCausalLM

    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    check_convertible(config)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    rope = config.get("rope_parameters") or {}
    writer = gguf.GGUFWriter(out_path, "llama")
    writer.add_name(os.path.basename(os.path.normpath(model_dir)))
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(config.get("num_key_value_heads", heads))
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(rope.get("rope_theta", config.get("rope_theta", 10000.0))))
    writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    writer.add_vocab_size(config["vocab_size"])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(writer, model_dir, config)
    for name, array in _tensors(model, config):
        writer.add_tensor(name, np.ascontiguousarray(array))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path
