"""Prompt files: JSONL ({"prompt": ...} per line, optionally with a "category") or plain text (one
prompt per blank-line block)."""

from __future__ import annotations

import json
from typing import List, Optional, Tuple

from .errors import BadInputError
from .validation import read_text_file


def load_prompts(path: str) -> List[str]:
    """Prompts from a JSONL file ({"prompt": ...} per line) or a text file (one per blank-line
    block); a line that is not a JSON object with a non-empty "prompt" string is an error
    naming the file and the line."""
    return [prompt for prompt, _ in load_prompt_records(path)]


def load_categorized_prompts(path: str) -> Tuple[List[str], List[str]]:
    """The prompts of a JSONL file and the "category" of each, in order; an error naming the file
    and the first prompt without a non-empty "category" string (a text file has none)."""
    records = load_prompt_records(path)
    for n, (_, category) in enumerate(records, 1):
        if category is None:
            raise BadInputError(f"{path}: prompt {n} has no \"category\" (a JSONL line "
                                f"{{\"prompt\": ..., \"category\": ...}} gives it one)")
    return [prompt for prompt, _ in records], [category for _, category in records]


def load_prompt_records(path: str) -> List[Tuple[str, Optional[str]]]:
    """(prompt, category or None) of every prompt of the file (``load_prompts``)."""
    content = read_text_file("prompts", path)
    if path.endswith(".jsonl"):
        records = []
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
            category = record.get("category")
            records.append((prompt, category if isinstance(category, str) and category.strip() else None))
    else:
        records = [(block.strip("\n"), None) for block in content.split("\n\n") if block.strip()]
    if not records:
        raise BadInputError(f"{path} holds no prompt")
    return records
