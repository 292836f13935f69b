"""Prompt files: JSONL ({"prompt": ...} per line) or plain text (one prompt per blank-line block)."""

from __future__ import annotations

import json
from typing import List


def load_prompts(path: str) -> List[str]:
    """Prompts from a JSONL file ({"prompt": ...} per line) or a text file (one per blank-line block)."""
    with open(path, encoding="utf-8") as f:
        content = f.read()
    if path.endswith(".jsonl"):
        prompts = [json.loads(line)["prompt"] for line in content.splitlines() if line.strip()]
    else:
        prompts = [block.strip("\n") for block in content.split("\n\n") if block.strip()]
    if not prompts:
        raise ValueError(f"{path} holds no prompt")
    return prompts
