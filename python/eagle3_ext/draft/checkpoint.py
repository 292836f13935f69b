"""Draft checkpoints in the published EAGLE-3 layouts and eagle3_ext's own.

| format      | config.json                                            | weights        | aux ids                          |
|-------------|--------------------------------------------------------|----------------|----------------------------------|
| eagle       | Llama keys + draft_vocab_size (+ target_hidden_size)   | midlayer.*     | none: EAGLE default              |
| specforge   | same, architectures LlamaForCausalLMEagle3 + eagle_config | midlayer.*  | layer outputs (index = id + 1)   |
| vllm        | speculators: transformer_layer_config + top-level keys | layers.0.*     | raw hidden_states indices        |
| eagle3_ext  | Llama keys + "eagle3_ext" block                        | layers.{i}.*   | hidden_states indices, named     |

Convention flags are read and written by ``conventions``; a key that is not understood is an
error. A checkpoint's own ``embed_tokens`` is kept (and exported) when it differs from the
target's embedding, and dropped in favour of the target's when equal. The activation
fingerprint is stored in the eagle3_ext block, and for the other formats in a sidecar file
``eagle3_fingerprint.json`` beside config.json.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Dict, Mapping, Optional, Tuple

import torch

from ..errors import BadInputError, MissingPathError
from . import lookup_corpus
from .aux_layers import (CONVENTION, check_aux_layers, eagle_default_aux_layers,
                         resolve_aux_layer_ids, target_dims)
from .config import Eagle3DraftConfig
from .conventions import FLAGS, check_known_keys, read_flags, write_flags

logger = logging.getLogger(__name__)

FORMATS = ("eagle3_ext", "eagle", "specforge", "vllm")
SAFETENSORS_NAME = "model.safetensors"
BIN_NAME = "pytorch_model.bin"
FORMAT_VERSION = 1
# The activation fingerprint beside a checkpoint whose config.json has no place for it.
FINGERPRINT_NAME = "eagle3_fingerprint.json"

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
    try:
        if os.path.exists(st):
            from safetensors.torch import load_file
            return load_file(st)
        if os.path.exists(binary):
            return torch.load(binary, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001  (truncated or corrupt files raise many kinds)
        name = st if os.path.exists(st) else binary
        raise BadInputError(f"{name} cannot be read (truncated or corrupt?): {type(e).__name__}: {e}") from None
    raise MissingPathError(f"{path}: no {SAFETENSORS_NAME} or {BIN_NAME} found")


# SGLang's legacy names for the per-aux norms.
_LEGACY_NAMES = {"aux_norm_low.": "fc_norm.0.", "aux_norm_mid.": "fc_norm.1.", "aux_norm_high.": "fc_norm.2."}


def normalize_names(state: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Weight names of any supported layout mapped to this library's module names."""
    out: Dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.startswith("model."):
            name = name[len("model."):]
        if name.startswith("midlayer."):
            name = "layers.0." + name[len("midlayer."):]
        for legacy, new in _LEGACY_NAMES.items():
            if name.startswith(legacy):
                name = new + name[len(legacy):]
        if name.startswith(("verifier_lm_head.", "verifier_norm.")):
            continue  # speculators' frozen copies of the target's head, used only for its training loss
        out[name] = tensor
    return out


def config_from_dict(raw: Mapping[str, Any], fmt: str, state: Mapping[str, torch.Tensor],
                     where: str = "config.json") -> Eagle3DraftConfig:
    """The draft's configuration from a checkpoint's config.json and weights (shapes and the
    presence of optional weights), after refusing keys that are not understood."""
    check_known_keys(raw, fmt, where)
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
    flags = read_flags(raw, fmt, where)
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
        own_embeddings="embed_tokens.weight" in state,
        target_num_hidden_layers=ours.get("target_num_hidden_layers"),
        fingerprint=ours.get("fingerprint"),
        **flags,
    )


def read_config(path: str, role: str = "draft") -> Dict[str, Any]:
    """A model directory's config.json as a dict, with a one-line error for a missing directory,
    a directory without config.json or invalid JSON (``role`` names the directory's part)."""
    if not os.path.isdir(path):
        raise MissingPathError(f"{role} directory {path} does not exist")
    config_path = os.path.join(path, "config.json")
    if not os.path.exists(config_path):
        raise MissingPathError(f"{path} has no config.json: not a {role} model directory")
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    except json.JSONDecodeError as e:
        raise BadInputError(f"{config_path} is not valid JSON ({e.msg} at line {e.lineno})") from None
    except UnicodeDecodeError:
        raise BadInputError(f"{config_path} is not UTF-8 text (a binary file?); expected a JSON object") from None
    if not isinstance(config, dict):
        raise BadInputError(f"{config_path} holds a JSON {type(config).__name__}, expected an object of model settings")
    return config


def read_checkpoint(path: str) -> Tuple[Dict[str, Any], str, Dict[str, torch.Tensor]]:
    """(config.json as a dict, its format, weights under this library's names) of a draft
    directory, with a clear error for a missing or unreadable one."""
    raw = read_config(path, "draft")
    state = normalize_names(_read_state(path))
    if "fc.weight" not in state:
        raise BadInputError(f"{path}: the checkpoint has no fc.weight; it is not an EAGLE-3 draft")
    return raw, detect_format(raw), state


def load_draft(cls, path: str, target_config: Any = None):
    raw, fmt, state = read_checkpoint(path)
    config = config_from_dict(raw, fmt, state, where=os.path.join(path, "config.json"))
    if config.fingerprint is None:
        config.fingerprint = read_fingerprint_sidecar(path)
    target_layers = target_dims(target_config)[0] if target_config is not None else config.target_num_hidden_layers
    resolution = resolve_aux_layer_ids(raw, target_layers)
    if resolution.ids is not None:
        bound = target_layers if target_layers is not None else max(0, *resolution.ids)
        check_aux_layers(resolution.ids, bound, int(state["fc.weight"].shape[1]), config.target_hidden_size)
    # Like transformers' dtype="auto": the draft comes back in the dtype it was saved in.
    model = cls(config).to(state["fc.weight"].dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or missing:
        hint = ""
        if any(k.startswith(("fc_norm.", "input_norm.")) for k in list(unexpected) + list(missing)):
            hint = (" (the norm weights before the fc and the fc_norm / norm_before_fc flags in config.json "
                    "disagree)")
        raise BadInputError(f"{path} ({fmt} format): unexpected weights {sorted(unexpected)}, missing "
                            f"{sorted(missing)}{hint}")
    model.set_aux_layers(resolution)
    model.lookup_corpus = lookup_corpus.load_beside(path)
    logger.info("loaded EAGLE-3 draft from %s (%s format)", path, fmt)
    if target_config is not None:
        model.validate_against_target(target_config)
    return model


def read_fingerprint_sidecar(path: str) -> Optional[Dict[str, Any]]:
    sidecar = os.path.join(path, FINGERPRINT_NAME)
    if not os.path.exists(sidecar):
        return None
    with open(sidecar) as f:
        return json.load(f)


def _llama_dict(config: Eagle3DraftConfig) -> Dict[str, Any]:
    d = {k: getattr(config, k) for k in _LLAMA_KEYS}
    d["model_type"] = "llama"
    return d


def _renamed_state(model, single_layer_prefix: Optional[str]) -> Dict[str, torch.Tensor]:
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if single_layer_prefix is None:
        return state
    if model.config.num_hidden_layers != 1:
        raise BadInputError(f"this format stores exactly one draft layer ({single_layer_prefix}*), the draft "
                            f"has {model.config.num_hidden_layers}")
    return {(single_layer_prefix + k[len("layers.0."):] if k.startswith("layers.0.") else k): v
            for k, v in state.items()}


def _formatted(model, fmt: str, verifier: Optional[Mapping[str, Any]],
               speculative_tokens: int) -> Tuple[Dict[str, Any], Dict[str, torch.Tensor]]:
    cfg = model.config
    ids = model.aux_layer_ids
    if ids is None:
        raise ValueError("the draft's aux layers are unresolved; call validate_against_target(target_config) "
                         "before saving")
    if fmt not in FORMATS:
        raise BadInputError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    flags = write_flags({key: getattr(cfg, key) for key in FLAGS}, fmt)
    base = dict(_llama_dict(cfg), draft_vocab_size=cfg.draft_vocab_size, target_hidden_size=cfg.target_hidden_size)
    if fmt == "eagle3_ext":
        block = {"format_version": FORMAT_VERSION, "aux_layer_ids": ids, "aux_layer_convention": CONVENTION,
                 "target_num_hidden_layers": cfg.target_num_hidden_layers, **flags}
        if cfg.fingerprint is not None:
            block["fingerprint"] = cfg.fingerprint
        config = dict(base, architectures=["Eagle3DraftModel"], eagle3_ext=block)
        return config, _renamed_state(model, None)
    if fmt in ("eagle", "specforge"):
        config = dict(base, architectures=["LlamaForCausalLMEagle3"], bias=cfg.fc_bias, **flags)
        if fmt == "eagle":
            layers = cfg.target_num_hidden_layers
            default = list(eagle_default_aux_layers(layers)) if layers else None
            if ids != default:
                raise BadInputError(
                    f"EAGLE's layout stores no aux ids, so readers assume the default [2, L//2, L-3] = {default} "
                    f"(L={layers}); this draft reads {ids}: save it as 'specforge', 'vllm' or 'eagle3_ext'")
        else:
            if min(ids) < 1:
                raise BadInputError(f"aux layers {ids} include the embedding output (index 0), which SpecForge's "
                                    "layer-output ids cannot express")
            config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in ids],
                                      "use_aux_hidden_state": True}
        return config, _renamed_state(model, "midlayer.")
    # vLLM / speculators: its Eagle3SpeculatorConfig, including the speculators_config block
    # (proposal method and verifier) that vLLM requires.
    verifier = dict(verifier or {})
    config = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
              "transformer_layer_config": _llama_dict(cfg), "draft_vocab_size": cfg.draft_vocab_size,
              "target_hidden_size": cfg.target_hidden_size, "eagle_aux_hidden_state_layer_ids": ids,
              "vocab_size": cfg.vocab_size, **flags,
              "speculators_config": {
                  "algorithm": "eagle3",
                  "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(speculative_tokens),
                                        "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                  "default_proposal_method": "greedy",
                  "verifier": {"name_or_path": verifier.get("name_or_path"),
                               "architectures": list(verifier.get("architectures") or [])}}}
    return config, _renamed_state(model, None)


def save_draft(model, path: str, fmt: str, safe_serialization: bool = True,
               verifier: Optional[Mapping[str, Any]] = None, speculative_tokens: int = 3) -> None:
    if not isinstance(speculative_tokens, int) or speculative_tokens < 1:
        raise BadInputError(f"speculative_tokens must be a positive integer, got {speculative_tokens!r}")
    config, state = _formatted(model, fmt, verifier, speculative_tokens)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    for stale in (SAFETENSORS_NAME, BIN_NAME, FINGERPRINT_NAME, lookup_corpus.FILE_NAME):
        if os.path.exists(os.path.join(path, stale)):
            os.remove(os.path.join(path, stale))
    if fmt != "eagle3_ext" and model.config.fingerprint is not None:
        # Other formats have no place for it in config.json: a sidecar that this library reads back.
        with open(os.path.join(path, FINGERPRINT_NAME), "w") as f:
            json.dump(model.config.fingerprint, f)
    if safe_serialization:
        from safetensors.torch import save_file
        save_file(state, os.path.join(path, SAFETENSORS_NAME), metadata={"format": "pt"})
    else:
        torch.save(state, os.path.join(path, BIN_NAME))
    if model.lookup_corpus is not None:  # every format: a file the other engines leave alone
        model.lookup_corpus.save(os.path.join(path, lookup_corpus.FILE_NAME))
