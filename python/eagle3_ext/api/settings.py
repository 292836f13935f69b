"""What one ``generate`` call does, resolved the way Hugging Face's ``generate`` resolves it: the
target's generation config, then a ``generation_config`` argument, then keyword arguments,
with transformers' defaults for whatever stays unset.

Options speculative decoding cannot honour exactly (beam search, several sequences per
prompt, scores in the output) and processors that Hugging Face would build from the config
(repetition penalty, n-gram bans, ...) are errors that name the option; a processor can be
passed as ``logits_processor`` instead, where it is applied to the target's distribution at
every tree node, so greedy and sampling stay lossless.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ..validation import integer, number
from .config import SamplingConfig

MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed takes 64-bit seeds

# transformers' defaults for what a generation config leaves unset (GenerationConfig.
# _get_default_generation_params in 5.24; tests/test_api.py checks they still agree).
HF_DEFAULTS = {"max_length": 20, "do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0}

# Config fields whose non-default value asks for something this generator does not do, with
# the value that is fine.
REFUSED = {
    "num_beams": 1, "num_beam_groups": 1, "num_return_sequences": 1, "penalty_alpha": None, "dola_layers": None,
    "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0, "bad_words_ids": None, "force_words_ids": None, "constraints": None,
    "sequence_bias": None, "forced_bos_token_id": None, "forced_eos_token_id": None, "suppress_tokens": None,
    "begin_suppress_tokens": None, "exponential_decay_length_penalty": None, "renormalize_logits": False,
    "remove_invalid_values": False, "typical_p": 1.0, "min_p": None, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0,
    "top_h": None, "guidance_scale": None, "watermarking_config": None, "token_healing": False,
    "output_scores": False, "output_logits": False, "output_attentions": False, "output_hidden_states": False,
    "prompt_lookup_num_tokens": None, "max_time": None, "min_length": 0, "diversity_penalty": 0.0,
}
# Extra keywords generate takes besides the generation config's fields.
EXTRA_KEYWORDS = ("tokenizer", "streamer", "logits_processor", "stopping_criteria", "seed")


@dataclass
class GenerateSettings:
    """The resolved options of one call; lengths in tokens."""

    max_new_tokens: Optional[int]            # None: from max_length once the prompt length is known
    max_length: int
    min_new_tokens: int
    sampling: SamplingConfig
    eos_token_ids: List[int]
    pad_token_id: int
    stop_strings: List[str] = field(default_factory=list)
    logits_processor: Any = None             # a LogitsProcessorList (or list of processors) or None
    stopping_criteria: Any = None            # a StoppingCriteriaList or None
    streamer: Any = None
    tokenizer: Any = None
    return_dict_in_generate: bool = False
    seed: Optional[int] = None

    def new_tokens_for(self, prompt_length: int) -> int:
        """How many tokens a request with a prompt of ``prompt_length`` may add (Hugging Face: an
        explicit max_new_tokens wins over max_length)."""
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        return self.max_length - prompt_length


def _ids(value: Any, name: str) -> List[int]:
    if value is None:
        return []
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    raise TypeError(f"{name} must be an int or a list of ints, got {value!r}")


# Numeric generation options: (is an integer, minimum, exclusive minimum, maximum).
FIELD_LIMITS = {"max_new_tokens": (True, 1, False, None), "min_new_tokens": (True, 0, False, None),
                "max_length": (True, 1, False, None), "top_k": (True, 0, False, None),
                "temperature": (False, 0, False, None), "top_p": (False, 0, True, 1)}


def _check_fields(values: Dict[str, Any]) -> None:
    """TypeError / ValueError naming the first numeric option of ``values`` that is out of place."""
    for name, (whole, low, open_low, high) in FIELD_LIMITS.items():
        value = values.get(name)
        if value is None:
            continue
        if whole:
            integer(f"generate: {name}", value, low, high)
        else:
            number(f"generate: {name}", value, low, high, exclusive_minimum=open_low)
    if values.get("do_sample") is not None and not isinstance(values["do_sample"], bool):
        raise TypeError(f"generate: do_sample must be True or False, got {values['do_sample']!r}")


def _stopping_criteria(criteria: Any) -> Any:
    """A StoppingCriteriaList from ``stopping_criteria=`` (a list, one criterion, or None)."""
    if criteria is None:
        return None
    from transformers import StoppingCriteriaList
    if callable(criteria) and not isinstance(criteria, list):
        criteria = [criteria]
    if not isinstance(criteria, list) or not all(callable(c) for c in criteria):
        raise TypeError("generate: stopping_criteria must be a StoppingCriteriaList or a list of StoppingCriteria, got "
                        f"{type(criteria).__name__}")
    return StoppingCriteriaList(criteria) if criteria else None


def resolve(target_config: Any, generation_config: Any, kwargs: Dict[str, Any], tokenizer: Any = None) -> GenerateSettings:
    """GenerateSettings for a target whose generation config is ``target_config`` (a
    transformers GenerationConfig or None), as Hugging Face's generate would resolve them."""
    from transformers import GenerationConfig

    if generation_config is not None and not isinstance(generation_config, GenerationConfig):
        raise TypeError(f"generation_config must be a transformers GenerationConfig, got "
                        f"{type(generation_config).__name__}")
    config = copy.deepcopy(generation_config or target_config or GenerationConfig())
    extras = {k: kwargs.pop(k) for k in list(kwargs) if k in EXTRA_KEYWORDS}
    _check_fields(kwargs)  # before transformers' own validation, which fails on a wrong type unnamed
    unused = config.update(**kwargs)
    if unused:
        raise TypeError(f"generate got unexpected keyword arguments {sorted(unused)}: they are neither generation "
                        f"config fields nor one of {', '.join(EXTRA_KEYWORDS)}")
    for name, fine in REFUSED.items():
        value = getattr(config, name, None)
        if value is not None and value != fine:
            raise ValueError(
                f"generate: {name}={value!r} is not supported by speculative decoding (it takes {fine!r}); a logits "
                "processor can be passed as logits_processor=, which is applied to the target at every tree node")
    get = lambda name: HF_DEFAULTS[name] if getattr(config, name, None) is None else getattr(config, name)  # noqa: E731
    _check_fields({name: getattr(config, name, None) for name in (*FIELD_LIMITS, "do_sample")})
    do_sample = get("do_sample")
    temperature, top_p, top_k = float(get("temperature")), float(get("top_p")), int(get("top_k"))
    if do_sample and temperature == 0:
        raise ValueError("generate: do_sample=True needs temperature > 0 (temperature 0 is greedy: do_sample=False)")
    sampling = SamplingConfig(temperature, top_p, top_k) if do_sample else SamplingConfig()
    max_new = config.max_new_tokens
    max_length = int(get("max_length"))
    min_new = config.min_new_tokens or 0
    eos = _ids(config.eos_token_id, "eos_token_id")
    pad = config.pad_token_id
    if pad is None:
        pad = eos[0] if eos else 0
    stop = config.stop_strings
    if isinstance(stop, str):
        stop = [stop]
    stop = list(stop or [])
    if not all(isinstance(s, str) and s for s in stop):
        raise TypeError(f"generate: stop_strings must be non-empty strings, got {stop!r}")
    tokenizer = extras.get("tokenizer") or tokenizer
    if stop and tokenizer is None:
        raise ValueError("generate: stop_strings need a tokenizer (tokenizer=..., or the generator's own)")
    processors = extras.get("logits_processor")
    if processors is not None:
        from transformers import LogitsProcessorList
        if callable(processors) and not isinstance(processors, list):
            processors = [processors]
        if not isinstance(processors, list) or not all(callable(p) for p in processors):
            raise TypeError("generate: logits_processor must be a LogitsProcessorList or a list of processors")
        processors = LogitsProcessorList(processors) if processors else None
    criteria = _stopping_criteria(extras.get("stopping_criteria"))
    streamer = extras.get("streamer")
    if streamer is not None and not (callable(getattr(streamer, "put", None)) and
                                     callable(getattr(streamer, "end", None))):
        raise TypeError(f"generate: streamer must have put() and end() methods (a transformers BaseStreamer), got "
                        f"{type(streamer).__name__}")
    seed = extras.get("seed")
    if seed is not None:
        integer("generate: seed", seed, 0, MAX_SEED)
    return GenerateSettings(
        max_new_tokens=max_new, max_length=max_length, min_new_tokens=min_new, sampling=sampling, eos_token_ids=eos,
        pad_token_id=int(pad), stop_strings=stop, logits_processor=processors, stopping_criteria=criteria,
        streamer=streamer, tokenizer=tokenizer,
        return_dict_in_generate=bool(config.return_dict_in_generate), seed=seed)
