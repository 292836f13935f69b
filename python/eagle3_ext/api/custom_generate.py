"""EAGLE-3 from inside Hugging Face's own ``generate``: the decoding method that
``model.generate(..., custom_generate=eagle3_ext.custom_generate_path(), trust_remote_code=True,
draft_model=...)`` runs.

transformers loads ``custom_generate/generate.py`` from the folder it is given and calls its
``generate(model=..., **arguments)`` with every argument of its own ``generate``. The folder
this package installs (``hub/``, laid out as a Hub repository of a custom generation method)
holds a one-line ``generate.py`` that forwards here, so the method and the library cannot drift
apart.

The generator built for a (model, draft, tree, ...) is kept on the model, so a second call
with the same draft pays no set-up: the draft is not loaded again and the capture guard does
not run again. A model moved to another device or dtype gets a new generator.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any, Optional

import torch

from ..errors import BadInputError, BadInputTypeError
from ..preflight.loading import load_pair_for_generation
from .config import TreeConfig
from .generator import SpeculativeGenerator

# The folder transformers' ``custom_generate=`` takes: a Hub-style repository whose
# custom_generate/generate.py forwards to ``generate`` below.
HUB_FOLDER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hub")
# Where the generators built for a model are kept: an attribute of the model (a plain dict, not a
# submodule, so the model's state dict and parameters are unchanged).
CACHE_ATTRIBUTE = "_eagle3_generators"
# Generators kept per model (the most recently used), each holding its draft and buffers.
CACHE_SIZE = 4


def custom_generate_path() -> str:
    """The folder to pass as ``custom_generate=`` to a transformers model's ``generate``."""
    return HUB_FOLDER


def _draft_key(draft_model: Any) -> Any:
    if isinstance(draft_model, (str, os.PathLike)):
        return ("dir", os.path.realpath(os.fspath(draft_model)))
    return ("model", id(draft_model))


def cached_generator(model, draft_model: Any, tree: Optional[TreeConfig], attention: str, compile: bool,
                     strict: bool) -> SpeculativeGenerator:
    """The generator of ``model`` with ``draft_model`` and these options: the one built by an
    earlier call when there is one, else a new one (kept for the next call)."""
    if draft_model is None:
        raise BadInputError("custom_generate=eagle3_ext.custom_generate_path() needs draft_model=: the directory of "
                            "an EAGLE-3 draft trained for this model, or a loaded Eagle3DraftModel")
    if tree is not None and not isinstance(tree, TreeConfig):
        raise BadInputTypeError(f"tree must be an eagle3_ext.TreeConfig, got {type(tree).__name__}")
    embeddings = model.get_input_embeddings().weight
    key = (_draft_key(draft_model), tree, attention, compile, strict, embeddings.device, embeddings.dtype)
    cache = vars(model).setdefault(CACHE_ATTRIBUTE, OrderedDict())
    entry = cache.get(key)
    if entry is not None and (entry[0] is draft_model or key[0][0] == "dir"):
        cache.move_to_end(key)
        return entry[1]
    target, draft, _ = load_pair_for_generation(model, draft_model)
    generator = SpeculativeGenerator(target, draft, tree or TreeConfig(), attention=attention, strict=strict,
                                     compile=compile)
    cache[key] = (draft_model, generator)
    while len(cache) > CACHE_SIZE:
        cache.popitem(last=False)
    return generator


@torch.no_grad()
def generate(model, inputs: Optional[torch.Tensor] = None, generation_config=None, logits_processor=None,
             stopping_criteria=None, prefix_allowed_tokens_fn=None, synced_gpus: Optional[bool] = None,
             assistant_model=None, streamer=None, negative_prompt_ids=None, negative_prompt_attention_mask=None, *,
             draft_model: Any = None, tree: Optional[TreeConfig] = None, attention: str = "tree",
             compile: bool = False, strict: bool = True, **kwargs):
    """Speculative decoding of ``model`` with an EAGLE-3 draft, called by transformers'
    ``model.generate(..., custom_generate=eagle3_ext.custom_generate_path(), trust_remote_code=True)``.

    Takes what ``SpeculativeGenerator.generate`` takes (``input_ids`` / ``inputs``,
    ``attention_mask``, ``generation_config``, generation-config fields such as
    ``max_new_tokens``, ``do_sample``, ``stop_strings``, ``return_dict_in_generate``, and
    ``tokenizer``, ``streamer``, ``logits_processor``, ``stopping_criteria``, ``seed``), plus:

    Args:
        draft_model: the draft's directory or a loaded ``Eagle3DraftModel`` (required).
        tree: the draft tree per round (default ``TreeConfig()``).
        attention, compile, strict: as for ``SpeculativeGenerator``.

    Returns what ``SpeculativeGenerator.generate`` returns: a LongTensor [B, prompt + new], or
    with ``return_dict_in_generate=True`` a ``SpeculativeGenerateOutput``.
    """
    refused = {"prefix_allowed_tokens_fn": (prefix_allowed_tokens_fn, "a logits_processor= can constrain tokens"),
               "assistant_model": (assistant_model, "the EAGLE-3 draft is passed as draft_model="),
               "negative_prompt_ids": (negative_prompt_ids, "classifier-free guidance is not supported"),
               "negative_prompt_attention_mask": (negative_prompt_attention_mask,
                                                  "classifier-free guidance is not supported")}
    for name, (value, hint) in refused.items():
        if value is not None:
            raise BadInputError(f"custom_generate=eagle3_ext: {name} is not supported ({hint})")
    if synced_gpus:
        raise BadInputError("custom_generate=eagle3_ext: synced_gpus=True is not supported; under tensor parallelism "
                            "every rank runs generate on its own")
    input_ids = kwargs.pop("input_ids", None)
    if inputs is not None and input_ids is not None:
        raise BadInputError("custom_generate=eagle3_ext: pass the prompt as inputs or as input_ids, not both")
    if input_ids is None:
        input_ids = inputs
    if input_ids is None:
        raise BadInputError("custom_generate=eagle3_ext: no prompt; pass input_ids (and attention_mask)")
    generator = cached_generator(model, draft_model, tree, attention, compile, strict)
    if logits_processor is not None and len(logits_processor) > 0:
        kwargs["logits_processor"] = logits_processor
    if stopping_criteria is not None and len(stopping_criteria) > 0:
        kwargs["stopping_criteria"] = stopping_criteria
    if streamer is not None:
        kwargs["streamer"] = streamer
    return generator.generate(input_ids, kwargs.pop("attention_mask", None), generation_config=generation_config,
                              **kwargs)
