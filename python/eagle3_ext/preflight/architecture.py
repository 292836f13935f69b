"""Which targets the speculative loop can serve exactly, and a clear error for the others.

The loop needs every decoder layer to be attention over a KV cache whose entries can be
dropped and moved (rejected tree tokens are removed, accepted ones compacted). Attention
variants the tree-attention op expresses are fine: full and sliding-window layers, soft-capped
logits, attention sinks, MLA (value head dim != query/key head dim), grouped-query heads.
Recurrent state (state-space, linear-attention and RWKV-style layers) cannot be rolled back
token by token, and chunked local attention is not what the op computes: such targets are
refused by name rather than served with wrong outputs.
"""

from __future__ import annotations

from typing import Any

from ..errors import BadInputError

SERVED_LAYER_TYPES = ("full_attention", "sliding_attention")

# Model types whose layers keep a recurrent state (or another attention the op does not
# express), with the feature named in the error.
UNSERVED_MODEL_TYPES = {
    "mamba": "state-space (Mamba) layers",
    "mamba2": "state-space (Mamba-2) layers",
    "falcon_mamba": "state-space (Mamba) layers",
    "jamba": "state-space (Mamba) layers",
    "bamba": "state-space (Mamba-2) layers",
    "zamba": "state-space (Mamba) layers",
    "zamba2": "state-space (Mamba-2) layers",
    "falcon_h1": "state-space (Mamba-2) layers",
    "granitemoehybrid": "state-space (Mamba-2) layers",
    "nemotron_h": "state-space (Mamba-2) layers",
    "plamo2": "state-space (Mamba) layers",
    "lfm2": "short convolution layers with a recurrent state",
    "lfm2_moe": "short convolution layers with a recurrent state",
    "rwkv": "RWKV (linear attention) layers",
    "recurrent_gemma": "recurrent (RG-LRU) layers",
    "xlstm": "xLSTM recurrent layers",
    "qwen3_next": "linear-attention (Gated DeltaNet) layers",
    "minimax": "linear (lightning) attention layers",
    "llama4": "chunked local attention",
}


def check_served(config: Any) -> None:
    """Raises ValueError naming the feature when the target cannot be served exactly."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    model_type = getattr(text, "model_type", None) or getattr(config, "model_type", None)
    if model_type in UNSERVED_MODEL_TYPES:
        raise BadInputError(
            f"eagle3_ext cannot serve a {model_type} target exactly: it has {UNSERVED_MODEL_TYPES[model_type]}, whose "
            "state cannot be rolled back when draft tokens are rejected (only attention layers over a KV cache can)")
    layer_types = getattr(text, "layer_types", None) or []
    other = sorted({t for t in layer_types if t not in SERVED_LAYER_TYPES})
    if other:
        raise BadInputError(
            f"eagle3_ext cannot serve this {model_type} target exactly: its layer_types include {other} (served: "
            f"{', '.join(SERVED_LAYER_TYPES)})")
    if getattr(text, "attention_chunk_size", None):
        raise BadInputError(f"eagle3_ext cannot serve this {model_type} target exactly: it uses chunked local "
                            f"attention (attention_chunk_size={text.attention_chunk_size}), which tree_attention "
                            "does not compute")
