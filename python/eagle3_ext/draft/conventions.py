"""What each key of a draft checkpoint's config.json means in each format, and the refusal of
keys that are not understood.

A key that changes the draft's computation and is silently ignored is the failure this library
exists to prevent (acceptance collapses, nothing crashes). So every key is either read here,
on an explicit list of keys known to be harmless, or an error that names it.

Convention flags and how each format spells them (``docs/formats.md`` has the table):

| internal               | eagle3_ext            | vllm (speculators)          | specforge (SpecForge trainer)        |
|------------------------|-----------------------|-----------------------------|--------------------------------------|
| norm_before_residual   | same key, default F   | same key, default F         | read (SpecForge ignores it); refused on export |
| fc_norm                | same key              | same key, fc_norm.{i}       | same key (or SGLang's use_aux_norm)  |
| norm_before_fc         | same key              | same key, input_norm        | same key (top level or eagle_config) |
| norm_output            | same key              | same key (fed back normed)  | not expressible: refused on export   |
| final_norm             | same key, default T   | not expressible             | norm_output (default True)           |

SpecForge's trainer and SGLang's runtime read ``norm_output`` differently: SpecForge's
``LlamaForCausalLMEagle3`` uses it to switch the final norm before lm_head (default True),
SGLang and speculators to feed the normed hidden state back (default False). A checkpoint in
SpecForge's layout was trained by SpecForge's code, so the loader follows SpecForge and warns
that SGLang reads an explicit value otherwise.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Mapping

from ..errors import BadInputError

logger = logging.getLogger(__name__)

FLAGS = ("norm_before_residual", "fc_norm", "norm_before_fc", "norm_output", "final_norm")

# Keys the loader reads (shape, rope, vocabulary, ids, flags, fc bias).
UNDERSTOOD = frozenset({
    "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
    "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings", "vocab_size",
    "hidden_act", "attention_bias", "mlp_bias", "num_hidden_layers", "draft_vocab_size", "target_hidden_size",
    "eagle_aux_hidden_state_layer_ids", "eagle_config", "eagle3_ext", "bias", "speculators_model_type",
    "transformer_layer_config", "speculators_config", "use_aux_norm",
} | set(FLAGS))

# Keys that never change what the draft computes at inference: identity and bookkeeping,
# training-only settings, token ids, generation defaults and transformers' base config fields.
HARMLESS = frozenset({
    "architectures", "model_type", "transformers_version", "torch_dtype", "dtype", "_name_or_path",
    "name_or_path", "speculators_version", "has_no_defaults_at_init", "embed_requires_grad",
    "initializer_range", "use_cache", "pretraining_tp", "attention_dropout", "tie_word_embeddings",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "output_attentions", "output_hidden_states", "return_dict", "torchscript", "use_return_dict",
    "is_encoder_decoder", "is_decoder", "add_cross_attention", "cross_attention_hidden_size",
    "chunk_size_feed_forward", "tokenizer_class", "prefix", "task_specific_params", "problem_type",
    "finetuning_task", "id2label", "label2id", "num_labels", "pruned_heads", "tie_encoder_decoder",
    "tf_legacy_loss", "use_bfloat16", "_attn_implementation_autoset", "_attn_implementation",
    "attn_implementation", "output_router_logits", "_commit_hash", "auto_map",
    # Sliding-window keys that are harmless while no window is used (checked below).
    "sliding_window", "use_sliding_window", "max_window_layers", "layer_types",
})

EAGLE_CONFIG_KEYS = frozenset({"eagle_aux_hidden_state_layer_ids", "use_aux_hidden_state", "fc_norm",
                               "norm_before_fc", "norm_output"})
OWN_BLOCK_KEYS = frozenset({"format_version", "aux_layer_ids", "aux_layer_convention",
                            "target_num_hidden_layers", "fingerprint"})


def _refuse(key: str, where: str, why: str) -> ValueError:
    return ValueError(f"{where}: config key {key!r} {why}; eagle3_ext refuses a draft whose computation it "
                      "cannot reproduce rather than run it differently from how it was trained")


def check_known_keys(raw: Mapping[str, Any], fmt: str, where: str) -> None:
    """Raises a ValueError naming the first key of ``raw`` (and its nested blocks) that would
    change the draft's computation but is not understood."""
    _check_block(raw, where, top_level=True)
    if fmt == "vllm" and isinstance(raw.get("transformer_layer_config"), Mapping):
        _check_block(raw["transformer_layer_config"], f"{where} (transformer_layer_config)", top_level=False)
    eagle = raw.get("eagle_config")
    if eagle is not None:
        if not isinstance(eagle, Mapping):
            raise _refuse("eagle_config", where, f"must be an object, got {eagle!r}")
        for key, value in eagle.items():
            if key not in EAGLE_CONFIG_KEYS:
                raise _refuse(f"eagle_config.{key}", where, "is not understood")
        if eagle.get("use_aux_hidden_state") is False:
            raise _refuse("eagle_config.use_aux_hidden_state", where,
                          "is false (an EAGLE-1/2 draft reading one hidden state, not EAGLE-3)")
    ours = raw.get("eagle3_ext")
    if isinstance(ours, Mapping):
        for key in ours:
            if key not in OWN_BLOCK_KEYS and key not in FLAGS and key != "own_embeddings":
                raise _refuse(f"eagle3_ext.{key}", where, "is not understood by this version")


def _check_block(block: Mapping[str, Any], where: str, top_level: bool) -> None:
    for key, value in block.items():
        if key in UNDERSTOOD:
            continue
        if key not in HARMLESS:
            raise _refuse(key, where, "is not understood (neither a known setting nor on the list of harmless keys)")
        if key == "sliding_window" and value not in (None, 0) and block.get("use_sliding_window", True):
            raise _refuse(key, where, f"= {value} asks for sliding-window attention in the draft layer, which "
                                      "eagle3_ext's draft does not implement")
        if key == "layer_types" and value and any(t != "full_attention" for t in value):
            raise _refuse(key, where, f"= {value} asks for attention types other than full attention")
        if key == "attention_dropout" and value not in (None, 0, 0.0):
            logger.info("%s: attention_dropout=%s only matters in training; ignored at inference", where, value)


def _flag(value: Any, key: str, where: str) -> bool:
    if not isinstance(value, bool):
        raise BadInputError(f"{where}: config key {key!r} must be true or false, got {value!r}")
    return value


def read_flags(raw: Mapping[str, Any], fmt: str, where: str) -> Dict[str, bool]:
    """The convention flags of a checkpoint, with each format's own defaults."""
    flags = {"norm_before_residual": False, "fc_norm": False, "norm_before_fc": False, "norm_output": False,
             "final_norm": True}
    eagle = raw.get("eagle_config") or {}
    layer = raw.get("transformer_layer_config") or {}
    if fmt == "eagle3_ext":
        ours = raw.get("eagle3_ext") or {}
        for key in FLAGS:
            if key in ours:
                flags[key] = _flag(ours[key], f"eagle3_ext.{key}", where)
            elif key in raw:
                flags[key] = _flag(raw[key], key, where)
        return flags
    if fmt == "vllm":
        for key in ("norm_before_residual", "fc_norm", "norm_before_fc", "norm_output"):
            value = raw.get(key, layer.get(key))
            if value is not None:
                flags[key] = _flag(value, key, where)
        return flags
    # "eagle" and "specforge": SpecForge's trainer and SGLang's runtime. Neither implements
    # norm_before_residual; a checkpoint that sets it was trained elsewhere, so it is honoured.
    if "norm_before_residual" in raw:
        flags["norm_before_residual"] = _flag(raw["norm_before_residual"], "norm_before_residual", where)
        if flags["norm_before_residual"]:
            logger.warning("%s: norm_before_residual=true honoured; SpecForge and SGLang ignore this key", where)
    fc_norm = raw.get("fc_norm", eagle.get("fc_norm"))
    if fc_norm is None and raw.get("use_aux_norm") is not None:
        fc_norm = raw["use_aux_norm"]
    if fc_norm is not None:
        flags["fc_norm"] = _flag(fc_norm, "fc_norm", where)
    before_fc = eagle.get("norm_before_fc", raw.get("norm_before_fc"))
    if before_fc is not None:
        flags["norm_before_fc"] = _flag(before_fc, "norm_before_fc", where)
    norm_output = raw.get("norm_output", eagle.get("norm_output"))
    if norm_output is not None:
        flags["final_norm"] = _flag(norm_output, "norm_output", where)
        logger.warning("%s: norm_output=%s read as SpecForge's trainer reads it (the final norm before lm_head "
                       "%s); SGLang reads this key as 'feed the normed hidden state back'", where, norm_output,
                       "on" if norm_output else "off")
    return flags


def write_flags(flags: Mapping[str, bool], fmt: str) -> Dict[str, Any]:
    """Config keys that express ``flags`` in ``fmt``; a ValueError for what ``fmt`` cannot say."""
    if fmt == "eagle3_ext":
        return {key: bool(flags[key]) for key in FLAGS}
    if fmt == "vllm":
        if not flags["final_norm"]:
            raise BadInputError("the vllm (speculators) format cannot express final_norm=False (lm_head reading the "
                                "hidden state without the final norm); save it as 'specforge' or 'eagle3_ext'")
        return {key: bool(flags[key]) for key in ("norm_before_residual", "fc_norm", "norm_before_fc", "norm_output")}
    out: Dict[str, Any] = {}
    if flags["norm_output"]:
        raise BadInputError(f"the {fmt} format cannot express norm_output (the normed hidden state fed back across "
                            "draft steps): SpecForge's LlamaForCausalLMEagle3 always feeds the pre-norm state back; "
                            "save it as 'vllm' or 'eagle3_ext'")
    if flags["norm_before_fc"]:
        raise BadInputError(f"the {fmt} format cannot express norm_before_fc (SpecForge's LlamaForCausalLMEagle3 has "
                            "no input_norm); save it as 'vllm' or 'eagle3_ext'")
    if fmt == "eagle" and (flags["norm_before_residual"] or flags["fc_norm"] or not flags["final_norm"]):
        raise BadInputError("EAGLE's layout has no convention flags; save this draft as 'specforge', 'vllm' or "
                            "'eagle3_ext'")
    if flags["norm_before_residual"]:
        raise BadInputError(f"the {fmt} format cannot express norm_before_residual: SpecForge's "
                            "LlamaForCausalLMEagle3 and SGLang always add the raw feature; save it as 'vllm' or "
                            "'eagle3_ext'")
    if flags["fc_norm"]:
        out["fc_norm"] = True
    if not flags["final_norm"]:
        out["norm_output"] = False
    return out
