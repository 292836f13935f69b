"""Prompt files: JSONL ({"prompt": ...} per line) or plain text (one prompt per blank-line block)."""

from __future__ import annotations

import json
from typing import List

from .errors import BadInputError
from .validation import read_text_file


def load_prompts(path: str) -> List[str]:
    """Prompts from a JSONL file ({"prompt": ...} per line) or a text file (one per blank-line
    block); a line that is not a JSON object with a non-empty "prompt" string is an error
    naming the file and the line."""
    content = read_text_file("prompts", path)
    if path.endswith(".jsonl"):
        prompts = []
        for n, line in enumerate(content.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise BadInputError(f"{path}:{n}: not valid JSON ({e.msg})") from None
            prompt = record.get("prompt") if isinstance(record, dict) else None
            if not isinstance(prompt, str) or not prompt.strip():
                raise BadInputError(f"{path}:{n}: expected an object with a non-empty \"prompt\" string")
            prompts.append(prompt)
    else:
        prompts = [block.strip("\n") for block in content.split("\n\n") if block.strip()]
    if not prompts:
        raise BadInputError(f"{path} holds no prompt")
    return prompts
