"""Loading a target and its draft from directories (or taking loaded models), with one-line
errors for the usual mistakes: a missing directory, one without config.json, a draft given as
the target or a target as the draft, a model that is no causal LM."""

from __future__ import annotations

import os
from typing import Any, Optional, Tuple, Union

import torch

from ..draft.checkpoint import read_config
from ..dtypes import DTYPES, check_dtype_name

DRAFT_MARKERS = ("eagle3_ext", "eagle_config", "speculators_model_type", "eagle_aux_hidden_state_layer_ids",
                 "draft_vocab_size")


def check_target_dir(path: str) -> None:
    """Raises with the reason when ``path`` is not a target model directory."""
    raw = read_config(path, "target")
    if any(k in raw for k in DRAFT_MARKERS):
        raise ValueError(f"{path} holds an EAGLE-3 draft, not a target model (swap the target and the draft)")


def check_draft_dir(path: str) -> None:
    """Raises with the reason when ``path`` is not a draft directory."""
    raw = read_config(path, "draft")
    if not any(k in raw for k in DRAFT_MARKERS) and "architectures" in raw and \
            not any("Eagle" in a for a in raw.get("architectures") or []):
        raise ValueError(f"{path} holds a {', '.join(raw['architectures'])} model, not an EAGLE-3 draft (is it the "
                         "target? swap the target and the draft)")


def torch_dtype(name: Union[None, str, torch.dtype], what: str) -> Optional[torch.dtype]:
    if name is None or isinstance(name, torch.dtype):
        return name
    check_dtype_name(what, name)
    return DTYPES[name]


def load_target(path: str, dtype: Optional[torch.dtype]):
    """AutoModelForCausalLM from ``path`` (under torchrun: sharded with the TP plan)."""
    from transformers import AutoModelForCausalLM

    from ..distributed import tp

    check_target_dir(path)
    if tp.is_distributed():
        return tp.load_target(path, dtype or torch.float32)
    try:
        return AutoModelForCausalLM.from_pretrained(path, **({"dtype": dtype} if dtype is not None else {}))
    except ValueError as e:
        if "Unrecognized configuration class" in str(e) or "AutoModelForCausalLM" in str(e):
            raise ValueError(f"{path} is not a causal language model transformers can load for generation: "
                             f"{str(e).splitlines()[0]}") from None
        raise


def load_pair_for_generation(target: Any, draft: Any, tokenizer: Any = None,
                             dtype: Union[None, str, torch.dtype] = None,
                             draft_dtype: Union[None, str, torch.dtype] = None,
                             device: Union[None, str, torch.device] = None) -> Tuple[Any, Any, Any]:
    """(target model, draft model, tokenizer) from directories or loaded models; the draft is
    validated against the target and moved to its device."""
    from ..draft import Eagle3DraftModel

    t_dtype, d_dtype = torch_dtype(dtype, "dtype"), torch_dtype(draft_dtype, "draft_dtype")
    if isinstance(target, (str, os.PathLike)):
        target_dir = os.fspath(target)
        target = load_target(target_dir, t_dtype)
        if tokenizer is None:
            from transformers import AutoTokenizer
            tokenizer = AutoTokenizer.from_pretrained(target_dir)
    elif t_dtype is not None:
        target = target.to(t_dtype)
    if not hasattr(target, "get_input_embeddings") or not hasattr(target, "config"):
        raise TypeError(f"target must be a directory or a transformers causal LM, got {type(target).__name__}")
    if device is not None:
        target = target.to(device)
    if isinstance(draft, (str, os.PathLike)):
        check_draft_dir(os.fspath(draft))
        draft = Eagle3DraftModel.from_pretrained(os.fspath(draft), target_config=target.config)
    elif not isinstance(draft, Eagle3DraftModel):
        raise TypeError(f"draft must be a directory or an Eagle3DraftModel, got {type(draft).__name__}")
    if d_dtype is not None:
        draft = draft.to(d_dtype)
    draft = draft.to(target.get_input_embeddings().weight.device)
    return target, draft, tokenizer
