"""One convention for the target layers an EAGLE-3 draft reads, and the checks around it.

Internal convention: an aux layer id is an index into Hugging Face's ``output_hidden_states``
tuple: 0 is the embedding output, i (1 <= i <= L) the output of decoder layer i - 1, which is
the input of decoder layer i. Published checkpoints spell the same choice differently:

- EAGLE's official checkpoints store no ids; training used [2, L // 2, L - 3].
- SpecForge / SGLang: ``eagle_config.eagle_aux_hidden_state_layer_ids`` counts layer
  outputs, so id k is index k + 1.
- vLLM speculators: top-level ``eagle_aux_hidden_state_layer_ids`` are raw indices.
- eagle3_ext's own format stores internal indices and names the convention.

A mix-up (every layer off by one, or the embedding output captured) does not crash; it only
collapses acceptance. So every load resolves the ids here, records the rule it used, and
validation against the target names the numbers when anything disagrees.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from ..errors import BadInputError, BadInputTypeError
from ..validation import integer


CONVENTION = "hf_hidden_states_index"
CONVENTION_DOC = "index into output_hidden_states: 0 = embedding output, i = output of decoder layer i-1"


def eagle_default_aux_layers(num_target_layers: int) -> Tuple[int, ...]:
    """EAGLE-3's default capture for a target with ``num_target_layers`` decoder layers."""
    if num_target_layers < 4:
        raise BadInputError(
            f"EAGLE-3's default aux layers [2, L//2, L-3] need a target with at least 4 layers, "
            f"got L={num_target_layers}")
    return (2, num_target_layers // 2, num_target_layers - 3)


@dataclass(frozen=True)
class AuxLayerResolution:
    """Resolved aux layer ids (internal convention) and the rule that produced them."""

    ids: Optional[Tuple[int, ...]]
    rule: str
    raw: Optional[Tuple[int, ...]] = None

    def describe(self) -> str:
        ids = "unresolved" if self.ids is None else list(self.ids)
        raw = "" if self.raw is None else f" from {list(self.raw)}"
        return f"aux layers {ids}{raw} ({self.rule})"


def _ids(value: Any, key: str) -> Tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, int) for v in value):
        raise BadInputError(f"{key} must be a non-empty list of integers, got {value!r}")
    return tuple(int(v) for v in value)


def resolve_aux_layer_ids(config: Mapping[str, Any],
                          num_target_layers: Optional[int] = None) -> AuxLayerResolution:
    """Turn whatever a draft checkpoint's config.json says into internal aux layer ids.

    Args:
        config: the checkpoint's config.json as a dict.
        num_target_layers: the target's decoder layer count; needed only when the checkpoint
            stores no ids (EAGLE's default depends on it).

    The ids are not checked against the target here (``check_aux_layers`` does that): the
    doctor resolves a faulty checkpoint's ids in order to name the fault.
    """
    if not isinstance(config, Mapping):
        raise BadInputTypeError(f"config must be a checkpoint's config.json as a dict, got {type(config).__name__}")
    if num_target_layers is not None:
        integer("num_target_layers", num_target_layers, 1)
    ours = config.get("eagle3_ext")
    if isinstance(ours, Mapping) and "aux_layer_ids" in ours:
        convention = ours.get("aux_layer_convention", CONVENTION)
        if convention != CONVENTION:
            raise BadInputError(f"eagle3_ext.aux_layer_convention: unknown convention {convention!r} "
                                f"(expected {CONVENTION!r})")
        ids = _ids(ours["aux_layer_ids"], "eagle3_ext.aux_layer_ids")
        return AuxLayerResolution(ids, "eagle3_ext format: stored as hidden_states indices", ids)

    top = config.get("eagle_aux_hidden_state_layer_ids")
    nested = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if top is not None and nested is not None:
        top_ids = _ids(top, "eagle_aux_hidden_state_layer_ids")
        nested_ids = _ids(nested, "eagle_config.eagle_aux_hidden_state_layer_ids")
        if top_ids != tuple(i + 1 for i in nested_ids):
            raise BadInputError(
                f"config.json has both eagle_aux_hidden_state_layer_ids={list(top_ids)} (vLLM: raw "
                f"hidden_states indices) and eagle_config.eagle_aux_hidden_state_layer_ids="
                f"{list(nested_ids)} (SpecForge/SGLang: layer outputs, index = id + 1), and they "
                f"disagree; remove the one the draft was not trained with")
    if nested is not None:
        raw = _ids(nested, "eagle_config.eagle_aux_hidden_state_layer_ids")
        return AuxLayerResolution(
            tuple(i + 1 for i in raw),
            "SpecForge/SGLang eagle_config.eagle_aux_hidden_state_layer_ids: layer outputs, index = id + 1",
            raw)
    if top is not None:
        raw = _ids(top, "eagle_aux_hidden_state_layer_ids")
        return AuxLayerResolution(
            raw, "vLLM eagle_aux_hidden_state_layer_ids: raw hidden_states indices", raw)
    if num_target_layers is None:
        return AuxLayerResolution(
            None, "EAGLE default [2, L//2, L-3]: the checkpoint stores no ids; needs the target's layer count")
    return AuxLayerResolution(
        eagle_default_aux_layers(num_target_layers),
        f"EAGLE default [2, L//2, L-3] for L={num_target_layers}: the checkpoint stores no ids")


def target_dims(target_config: Any) -> Tuple[int, int, int]:
    """(num_hidden_layers, hidden_size, vocab_size) of a transformers config or a dict."""
    get = target_config.get if isinstance(target_config, Mapping) else (
        lambda k, d=None: getattr(target_config, k, d))
    text = get("text_config")
    if text is not None and get("num_hidden_layers") is None:
        return target_dims(text)
    values = [get("num_hidden_layers"), get("hidden_size"), get("vocab_size")]
    if any(v is None for v in values):
        raise BadInputError(
            "target config must give num_hidden_layers, hidden_size and vocab_size, got "
            f"{dict(zip(('num_hidden_layers', 'hidden_size', 'vocab_size'), values))}")
    return int(values[0]), int(values[1]), int(values[2])


def check_aux_layers(ids: Sequence[int], num_target_layers: int, fc_in_features: int,
                     target_hidden_size: int) -> None:
    """Raise a ValueError naming the numbers when ``ids`` cannot feed the draft's fc."""
    bad = [i for i in ids if not 0 <= i <= num_target_layers]
    if bad:
        raise BadInputError(
            f"aux layer ids {list(ids)} include {bad}, outside [0, {num_target_layers}] for a target "
            f"with {num_target_layers} layers (internal convention: {CONVENTION_DOC}); the draft was "
            f"trained for a deeper target or its ids are in another convention")
    k = len(ids)
    if k * target_hidden_size != fc_in_features:
        if fc_in_features % target_hidden_size == 0:
            trained = fc_in_features // target_hidden_size
            cause = ("the embedding output (index 0) or an extra layer is captured"
                     if k > trained else "a layer the draft was trained with is missing")
            raise BadInputError(
                f"{k} aux layers {list(ids)} x hidden {target_hidden_size} = {k * target_hidden_size} "
                f"but the draft's fc expects {fc_in_features} = {trained} x {target_hidden_size}; "
                f"the capture differs from training: {cause}")
        raise BadInputError(
            f"{k} aux layers x target hidden {target_hidden_size} = {k * target_hidden_size} but the "
            f"draft's fc expects {fc_in_features}, not a multiple of {target_hidden_size}: the draft "
            f"was trained for a target of another hidden size")


def config_fix(ids: Sequence[int]) -> Dict[str, Any]:
    """The config.json keys (per format, dotted for nested blocks) that make a draft read ``ids``."""
    ids = [int(i) for i in ids]
    fix: Dict[str, Any] = {"eagle3_ext.aux_layer_ids": ids, "eagle_aux_hidden_state_layer_ids": ids}
    if min(ids) >= 1:
        fix["eagle_config.eagle_aux_hidden_state_layer_ids"] = [i - 1 for i in ids]
    return fix


def describe_fix(ids: Sequence[int]) -> str:
    """One line saying which key to set in each format's config.json to read ``ids``."""
    fix = config_fix(ids)
    specforge = fix.get("eagle_config.eagle_aux_hidden_state_layer_ids")
    return (f"set \"eagle3_ext\": {{\"aux_layer_ids\": {fix['eagle3_ext.aux_layer_ids']}}} (eagle3_ext format), "
            f"\"eagle_aux_hidden_state_layer_ids\": {fix['eagle_aux_hidden_state_layer_ids']} (vLLM speculators), "
            + (f"\"eagle_config\": {{\"eagle_aux_hidden_state_layer_ids\": {specforge}}} (SpecForge/SGLang)"
               if specforge is not None else "SpecForge/SGLang cannot express the embedding output (index 0)"))
