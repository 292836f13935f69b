"""Loading a target and its draft from directories (or taking loaded models), with one-line
errors for the usual mistakes: a missing directory, one without config.json, a draft given as
the target or a target as the draft, a model that is no causal LM."""

from __future__ import annotations

import os
from typing import Any, Optional, Tuple, Union

import torch

from ..distributed import tp
from ..draft import Eagle3DraftModel
from ..draft.checkpoint import read_config
from ..dtypes import DTYPES, check_dtype_name, dtype_name
from ..errors import BadInputError, BadInputTypeError
from ..models.gguf_target import resolve_target

DRAFT_MARKERS = ("eagle3_ext", "eagle_config", "speculators_model_type", "eagle_aux_hidden_state_layer_ids",
                 "draft_vocab_size")


def check_target_dir(path: str) -> None:
    """Raises with the reason when ``path`` is not a target model directory."""
    raw = read_config(path, "target")
    if any(k in raw for k in DRAFT_MARKERS):
        raise BadInputError(f"{path} holds an EAGLE-3 draft, not a target model (swap the target and the draft)")


def check_draft_dir(path: str) -> None:
    """Raises with the reason when ``path`` is not a draft directory."""
    raw = read_config(path, "draft")
    if not any(k in raw for k in DRAFT_MARKERS) and "architectures" in raw and \
            not any("Eagle" in a for a in raw.get("architectures") or []):
        raise BadInputError(f"{path} holds a {', '.join(raw['architectures'])} model, not an EAGLE-3 draft (is it the "
                            "target? swap the target and the draft)")


def check_device(device: Union[None, str, torch.device]) -> Optional[torch.device]:
    """``device`` as a torch.device that exists here, or None."""
    if device is None:
        return None
    if not isinstance(device, (str, torch.device)):
        raise BadInputTypeError(f"device must be a string or a torch.device, got {type(device).__name__}")
    try:
        device = torch.device(device)
    except RuntimeError as e:
        raise BadInputError(f"device {device!r} is not a device torch knows: {_first_line(e)}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BadInputError(f"device {str(device)!r}: no CUDA GPU is visible to torch here")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise BadInputError(f"device {str(device)!r}: only {torch.cuda.device_count()} CUDA devices are visible")
    return device


def default_device() -> torch.device:
    """This process's GPU when torch sees one (under torchrun, init_from_env made the local
    rank's GPU the current one), else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def torch_dtype(name: Union[None, str, torch.dtype], what: str) -> Optional[torch.dtype]:
    if name is None:
        return None
    if isinstance(name, torch.dtype):
        if name not in DTYPES.values():
            raise BadInputError(f"{what} must be one of {', '.join(DTYPES)} (or its torch.dtype), got {name}")
        return name
    if not isinstance(name, str):
        raise BadInputTypeError(f"{what} must be a dtype name ({', '.join(DTYPES)}) or a torch.dtype, got "
                                f"{type(name).__name__}")
    check_dtype_name(what, name)
    return DTYPES[name]


def load_target(path: str, dtype: Optional[torch.dtype], shard: bool = True):
    """AutoModelForCausalLM from ``path`` (under torchrun and with ``shard``: sharded with the TP
    plan; without, a whole copy on every rank, as data parallelism wants it)."""
    from transformers import AutoModelForCausalLM

    check_target_dir(path)
    if shard and tp.is_distributed():
        return tp.load_target(path, dtype or torch.float32)
    try:
        return AutoModelForCausalLM.from_pretrained(path, **({"dtype": dtype} if dtype is not None else {}))
    except ValueError as e:
        if "Unrecognized configuration class" in str(e) or "AutoModelForCausalLM" in str(e):
            raise BadInputError(f"{path} is not a causal language model transformers can load for generation: "
                                f"{_first_line(e)}") from None
        raise BadInputError(f"target {path} cannot be loaded: {_first_line(e)}") from None
    except Exception as e:  # noqa: BLE001  (a truncated or corrupt weight file raises many kinds)
        raise BadInputError(f"target {path}: the weights cannot be read (truncated or corrupt?): "
                            f"{type(e).__name__}: {_first_line(e)}") from None


def check_context(target, name: str, length: int) -> None:
    """Raises when ``length`` positions (the argument ``name``) exceed the target's context."""
    context = getattr(target.config, "max_position_embeddings", None)
    if isinstance(context, int) and length > context:
        raise BadInputError(f"{name} {length} is longer than the target's context ({context} positions, "
                            "max_position_embeddings)")


def load_tokenizer(path: str):
    """The tokenizer saved with the target at ``path``, with a one-line error when it is missing
    or unreadable."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as e:  # noqa: BLE001  (tokenizer files fail in many ways)
        raise BadInputError(f"target {path}: no usable tokenizer (tokenizer.json / tokenizer_config.json): "
                            f"{type(e).__name__}: {_first_line(e)}") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def load_pair_for_generation(target: Any, draft: Any, tokenizer: Any = None,
                             dtype: Union[None, str, torch.dtype] = None,
                             draft_dtype: Union[None, str, torch.dtype] = None,
                             device: Union[None, str, torch.device] = None) -> Tuple[Any, Any, Any]:
    """(target model, draft model, tokenizer) from directories or loaded models; the draft is
    validated against the target and moved to its device."""
    t_dtype, d_dtype = torch_dtype(dtype, "dtype"), torch_dtype(draft_dtype, "draft_dtype")
    device = check_device(device)
    if isinstance(target, (str, os.PathLike)):
        target_dir = resolve_target(os.fspath(target), dtype_name(t_dtype))
        target = load_target(target_dir, t_dtype)
        if tokenizer is None:
            tokenizer = load_tokenizer(target_dir)
    elif t_dtype is not None:
        target = target.to(t_dtype)
    if not hasattr(target, "get_input_embeddings") or not hasattr(target, "config"):
        raise BadInputTypeError(f"target must be a directory or a transformers causal LM, got {type(target).__name__}")
    if device is not None:
        target = target.to(device)
    if isinstance(draft, (str, os.PathLike)):
        check_draft_dir(os.fspath(draft))
        draft = Eagle3DraftModel.from_pretrained(os.fspath(draft), target_config=target.config)
    elif not isinstance(draft, Eagle3DraftModel):
        raise BadInputTypeError(f"draft must be a directory or an Eagle3DraftModel, got {type(draft).__name__}")
    if d_dtype is not None:
        draft = draft.to(d_dtype)
    draft = draft.to(target.get_input_embeddings().weight.device)
    return target, draft, tokenizer
