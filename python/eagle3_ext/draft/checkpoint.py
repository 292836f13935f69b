"""Draft checkpoints in the published EAGLE-3 layouts and eagle3_ext's own.

| format      | config.json                                            | weights        | aux ids                          |
|-------------|--------------------------------------------------------|----------------|----------------------------------|
| eagle       | Llama keys + draft_vocab_size (+ target_hidden_size)   | midlayer.*     | none: EAGLE default              |
| specforge   | same, architectures LlamaForCausalLMEagle3 + eagle_config | midlayer.*  | layer outputs (index = id + 1)   |
| vllm        | speculators: transformer_layer_config + top-level keys | layers.0.*     | raw hidden_states indices        |
| eagle3_ext  | Llama keys + "eagle3_ext" block                        | layers.{i}.*   | hidden_states indices, named     |
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Dict, Mapping, Optional, Tuple

import torch

from .aux_layers import (CONVENTION, AuxLayerResolution, check_aux_layers, eagle_default_aux_layers,
                         resolve_aux_layer_ids, target_dims)
from .config import Eagle3DraftConfig

logger = logging.getLogger(__name__)

FORMATS = ("eagle3_ext", "eagle", "specforge", "vllm")
SAFETENSORS_NAME = "model.safetensors"
BIN_NAME = "pytorch_model.bin"
FORMAT_VERSION = 1

_LLAMA_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
               "rms_norm_eps", "rope_theta", "rope_scaling", "max_position_embeddings", "vocab_size",
               "hidden_act", "attention_bias", "mlp_bias", "num_hidden_layers")


def detect_format(config: Mapping[str, Any]) -> str:
    if isinstance(config.get("eagle3_ext"), Mapping):
        return "eagle3_ext"
    if "speculators_model_type" in config or "transformer_layer_config" in config:
        return "vllm"
    if "eagle_config" in config:
        return "specforge"
    if "eagle_aux_hidden_state_layer_ids" in config:
        return "vllm"
    return "eagle"


def _read_state(path: str) -> Dict[str, torch.Tensor]:
    st, binary = os.path.join(path, SAFETENSORS_NAME), os.path.join(path, BIN_NAME)
    if os.path.exists(st):
        from safetensors.torch import load_file
        return load_file(st)
    if os.path.exists(binary):
        return torch.load(binary, map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{path}: no {SAFETENSORS_NAME} or {BIN_NAME} found")


def _normalize_names(state: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    out: Dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.startswith("model."):
            name = name[len("model."):]
        if name.startswith("midlayer."):
            name = "layers.0." + name[len("midlayer."):]
        if name.startswith("embed_tokens."):
            logger.info("ignoring %s in the checkpoint: the draft shares the target's embeddings", name)
            continue
        out[name] = tensor
    return out


def _config_from_dict(raw: Mapping[str, Any], fmt: str, state: Mapping[str, torch.Tensor]) -> Eagle3DraftConfig:
    llama = dict(raw.get("transformer_layer_config") or raw) if fmt == "vllm" else dict(raw)
    rope_params = llama.get("rope_parameters") or {}
    rope_scaling = llama.get("rope_scaling")
    if rope_scaling is None and rope_params.get("rope_type", "default") != "default":
        rope_scaling = rope_params
    hidden = int(llama["hidden_size"])
    fc_in = int(state["fc.weight"].shape[1])
    target_hidden = int(raw.get("target_hidden_size") or llama.get("target_hidden_size") or hidden)
    layer_ids = {int(k.split(".")[1]) for k in state if k.startswith("layers.")}
    ours = raw.get("eagle3_ext") or {}
    return Eagle3DraftConfig(
        hidden_size=hidden,
        intermediate_size=int(llama["intermediate_size"]),
        num_attention_heads=int(llama["num_attention_heads"]),
        num_key_value_heads=int(llama.get("num_key_value_heads") or llama["num_attention_heads"]),
        head_dim=llama.get("head_dim"),
        num_hidden_layers=max(layer_ids) + 1 if layer_ids else 1,
        vocab_size=int(raw.get("vocab_size") or llama["vocab_size"]),
        draft_vocab_size=int(raw.get("draft_vocab_size") or llama.get("draft_vocab_size") or llama["vocab_size"]),
        target_hidden_size=target_hidden,
        num_aux_layers=max(1, fc_in // target_hidden),
        rms_norm_eps=float(llama.get("rms_norm_eps", 1e-6)),
        rope_theta=float(llama.get("rope_theta") or rope_params.get("rope_theta") or 10000.0),
        rope_scaling=rope_scaling,
        max_position_embeddings=int(llama.get("max_position_embeddings", 2048)),
        hidden_act=llama.get("hidden_act", "silu"),
        fc_bias="fc.bias" in state,
        attention_bias="layers.0.self_attn.q_proj.bias" in state,
        mlp_bias="layers.0.mlp.gate_proj.bias" in state,
        # vLLM's speculators format defaults to the norm-before-residual variant.
        norm_before_residual=bool(raw.get("norm_before_residual", llama.get("norm_before_residual", fmt == "vllm"))),
        target_num_hidden_layers=ours.get("target_num_hidden_layers"),
    )


def load_draft(cls, path: str, target_config: Any = None):
    with open(os.path.join(path, "config.json")) as f:
        raw = json.load(f)
    fmt = detect_format(raw)
    state = _normalize_names(_read_state(path))
    if "fc.weight" not in state:
        raise ValueError(f"{path}: the checkpoint has no fc.weight; it is not an EAGLE-3 draft")
    config = _config_from_dict(raw, fmt, state)
    target_layers = target_dims(target_config)[0] if target_config is not None else config.target_num_hidden_layers
    resolution = resolve_aux_layer_ids(raw, target_layers)
    if resolution.ids is not None:
        bound = target_layers if target_layers is not None else max(0, *resolution.ids)
        check_aux_layers(resolution.ids, bound, int(state["fc.weight"].shape[1]), config.target_hidden_size)
    # Like transformers' dtype="auto": the draft comes back in the dtype it was saved in.
    model = cls(config).to(state["fc.weight"].dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or missing:
        raise ValueError(f"{path} ({fmt} format): unexpected weights {sorted(unexpected)}, missing "
                         f"{sorted(missing)}")
    model.set_aux_layers(resolution)
    logger.info("loaded EAGLE-3 draft from %s (%s format)", path, fmt)
    if target_config is not None:
        model.validate_against_target(target_config)
    return model


def _llama_dict(config: Eagle3DraftConfig) -> Dict[str, Any]:
    d = {k: getattr(config, k) for k in _LLAMA_KEYS}
    d["model_type"] = "llama"
    return d


def _renamed_state(model, single_layer_prefix: Optional[str]) -> Dict[str, torch.Tensor]:
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if single_layer_prefix is None:
        return state
    if model.config.num_hidden_layers != 1:
        raise ValueError(f"this format stores exactly one draft layer ({single_layer_prefix}*), the draft "
                         f"has {model.config.num_hidden_layers}")
    return {(single_layer_prefix + k[len("layers.0."):] if k.startswith("layers.0.") else k): v
            for k, v in state.items()}


def _formatted(model, fmt: str) -> Tuple[Dict[str, Any], Dict[str, torch.Tensor]]:
    cfg = model.config
    ids = model.aux_layer_ids
    if ids is None:
        raise ValueError("the draft's aux layers are unresolved; call validate_against_target(target_config) "
                         "before saving")
    base = dict(_llama_dict(cfg), draft_vocab_size=cfg.draft_vocab_size, target_hidden_size=cfg.target_hidden_size)
    if fmt == "eagle3_ext":
        config = dict(base, architectures=["Eagle3DraftModel"], norm_before_residual=cfg.norm_before_residual,
                      eagle3_ext={"format_version": FORMAT_VERSION, "aux_layer_ids": ids,
                                  "aux_layer_convention": CONVENTION,
                                  "target_num_hidden_layers": cfg.target_num_hidden_layers})
        return config, _renamed_state(model, None)
    if fmt in ("eagle", "specforge"):
        if cfg.norm_before_residual:
            raise ValueError(f"the {fmt} layout has no norm_before_residual variant")
        config = dict(base, architectures=["LlamaForCausalLMEagle3"], bias=cfg.fc_bias)
        if fmt == "eagle":
            layers = cfg.target_num_hidden_layers
            default = list(eagle_default_aux_layers(layers)) if layers else None
            if ids != default:
                raise ValueError(
                    f"EAGLE's layout stores no aux ids, so readers assume the default [2, L//2, L-3] = {default} "
                    f"(L={layers}); this draft reads {ids}: save it as 'specforge', 'vllm' or 'eagle3_ext'")
        else:
            if min(ids) < 1:
                raise ValueError(f"aux layers {ids} include the embedding output (index 0), which SpecForge's "
                                 "layer-output ids cannot express")
            config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in ids]}
        return config, _renamed_state(model, "midlayer.")
    if fmt == "vllm":
        config = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
                  "transformer_layer_config": _llama_dict(cfg), "draft_vocab_size": cfg.draft_vocab_size,
                  "target_hidden_size": cfg.target_hidden_size, "norm_before_residual": cfg.norm_before_residual,
                  "eagle_aux_hidden_state_layer_ids": ids, "vocab_size": cfg.vocab_size}
        return config, _renamed_state(model, None)
    raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")


def save_draft(model, path: str, fmt: str, safe_serialization: bool = True) -> None:
    config, state = _formatted(model, fmt)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    for stale in (SAFETENSORS_NAME, BIN_NAME):
        if os.path.exists(os.path.join(path, stale)):
            os.remove(os.path.join(path, stale))
    if safe_serialization:
        from safetensors.torch import save_file
        save_file(state, os.path.join(path, SAFETENSORS_NAME), metadata={"format": "pt"})
    else:
        torch.save(state, os.path.join(path, BIN_NAME))
