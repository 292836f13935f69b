"""The bundled default target + draft pair that ``eagle3 generate`` uses when no model is named."""

from __future__ import annotations

import os
from typing import Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET_DIR = os.path.join(HERE, "target")
DRAFT_DIR = os.path.join(HERE, "draft")


def bundled_paths() -> Tuple[str, str]:
    """(target directory, draft directory) of the bundled pair, or a clear error if absent."""
    for path in (TARGET_DIR, DRAFT_DIR):
        if not os.path.exists(os.path.join(path, "config.json")):
            raise FileNotFoundError(
                f"the bundled default models are not installed ({path} has no config.json); pass --target and "
                "--draft")
    return TARGET_DIR, DRAFT_DIR


EVAL_PROMPTS = os.path.join(HERE, "eval_prompts.jsonl")


def bundled_eval_prompts():
    """The held-out evaluation prompts shipped with the bundled pair, or a clear error if absent."""
    if not os.path.exists(EVAL_PROMPTS):
        raise FileNotFoundError(f"the bundled evaluation prompts are not installed ({EVAL_PROMPTS}); pass --prompts")
    from ..prompts import load_prompts
    return load_prompts(EVAL_PROMPTS)
