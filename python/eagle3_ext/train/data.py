"""Training data for the draft: plain text files or JSONL (text, chat conversations rendered
with the target's chat template, loss on assistant tokens only, or pre-tokenized "input_ids"
with an optional "loss_mask"), tokenized by the target's tokenizer into sequences of at most
max_len tokens."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence, Tuple

import torch

from ..errors import BadInputError
from ..validation import read_text_file


@dataclass
class Example:
    input_ids: torch.Tensor  # [T] int64
    loss_mask: torch.Tensor  # [T] bool: tokens the draft learns to predict
    cached: Optional[Tuple[str, str]] = None  # (shard file, key) of its target outputs in an offline cache


def _chat_example(tokenizer, messages: list, where: str, max_len: int) -> Example:
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages):
        raise BadInputError(f"{where}: \"messages\" must be a non-empty list of {{\"role\": str, \"content\": str}} "
                            "objects")
    if getattr(tokenizer, "chat_template", None) is None:
        raise BadInputError(f"{where}: chat data needs a tokenizer with a chat template; the target's has none")
    ids: List[int] = []
    mask: List[bool] = []
    for k, message in enumerate(messages):
        # Render the growing conversation and attribute the new tokens to message k.
        rendered = tokenizer.apply_chat_template(messages[: k + 1], tokenize=True)
        if not isinstance(rendered, list):  # transformers 5 returns a BatchEncoding
            rendered = rendered["input_ids"]
        if list(rendered[: len(ids)]) != ids:
            raise BadInputError(f"{where}: the chat template does not render conversations prefix by prefix, so "
                                "assistant tokens cannot be located")
        new = list(rendered[len(ids):])
        ids.extend(new)
        mask.extend([message["role"] == "assistant"] * len(new))
    if not any(mask):
        raise BadInputError(f"{where}: the conversation has no assistant message to learn from")
    first = mask.index(True)
    if first >= max_len:
        raise BadInputError(f"{where}: the prompt before the first assistant token is {first} tokens, longer than "
                            f"max_len={max_len}; raise --max-len or shorten the conversation")
    return Example(torch.tensor(ids[:max_len]), torch.tensor(mask[:max_len]))


def _text_examples(tokenizer, text: str, max_len: int) -> Iterator[Example]:
    ids = tokenizer(text, add_special_tokens=True)["input_ids"]
    for start in range(0, len(ids), max_len):
        chunk = ids[start:start + max_len]
        if len(chunk) >= 3:  # a feature, its token and a target at the least
            yield Example(torch.tensor(chunk), torch.ones(len(chunk), dtype=torch.bool))


def _token_examples(record: dict, where: str, max_len: int) -> Iterator[Example]:
    """Pre-tokenized data: "input_ids" (and optionally a 0/1 "loss_mask" of the same length),
    cut into windows of max_len tokens like text."""
    ids, mask = record["input_ids"], record.get("loss_mask")
    if not isinstance(ids, list) or not all(isinstance(t, int) and t >= 0 for t in ids):
        raise BadInputError(f"{where}: \"input_ids\" must be a list of non-negative integers")
    if mask is not None and (not isinstance(mask, list) or len(mask) != len(ids) or
                             not all(m in (0, 1, True, False) for m in mask)):
        raise BadInputError(f"{where}: \"loss_mask\" must be a list of 0/1 as long as \"input_ids\" ({len(ids)})")
    mask = [True] * len(ids) if mask is None else [bool(m) for m in mask]
    for start in range(0, len(ids), max_len):
        chunk = ids[start:start + max_len]
        if len(chunk) >= 3 and any(mask[start:start + max_len]):
            yield Example(torch.tensor(chunk), torch.tensor(mask[start:start + max_len]))


def jsonl_records(path: str, content: str) -> Iterator[Tuple[int, str, dict]]:
    """(line number, the line, its JSON object) for every non-blank line of a JSONL file; a line
    that is not a JSON object is an error naming file:line."""
    # Lines end at "\n" only: splitlines() would also cut at U+2028, which JSON strings hold raw.
    for n, line in enumerate(content.split("\n"), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise BadInputError(f"{where}: not valid JSON ({e.msg})") from None
        if not isinstance(record, dict):
            raise BadInputError(f"{where}: expected a JSON object, got {type(record).__name__}")
        yield n, line, record


def load_examples(paths: Sequence[str], tokenizer, max_len: int, vocab_size: Optional[int] = None) -> List[Example]:
    """Reads every file: *.jsonl lines with "text", "messages" or "input_ids"; anything else as
    plain text."""
    if max_len < 4:
        raise BadInputError(f"max_len must be at least 4 tokens, got {max_len}")
    if not paths:
        raise BadInputError("no training data files given")
    examples: List[Example] = []
    for path in paths:
        content = read_text_file("training data file", path)
        before = len(examples)
        if path.endswith(".jsonl"):
            for n, _, record in jsonl_records(path, content):
                where = f"{path}:{n}"
                if "messages" in record:
                    examples.append(_chat_example(tokenizer, record["messages"], where, max_len))
                elif isinstance(record.get("text"), str):
                    examples.extend(_text_examples(tokenizer, record["text"], max_len))
                elif "input_ids" in record:
                    examples.extend(_token_examples(record, where, max_len))
                else:
                    raise BadInputError(f"{where}: expected a \"text\" string, a \"messages\" list or an "
                                        "\"input_ids\" list")
        else:
            examples.extend(_text_examples(tokenizer, content, max_len))
        if len(examples) == before:
            raise BadInputError(f"training data file {path} yields no example of at least 3 tokens")
    vocab = vocab_size or len(tokenizer)
    top = max(int(e.input_ids.max()) for e in examples)
    if top >= vocab:
        raise BadInputError(f"token id {top} in the data is outside the {'target' if vocab_size else 'tokenizer'}'s "
                            f"vocabulary ({vocab})")
    return examples


def batches(examples: Sequence[Example], batch_tokens: int, order: Sequence[int]) -> Iterator[List[Example]]:
    """Groups examples (in ``order``) so that batch size x longest length <= batch_tokens."""
    batch: List[Example] = []
    longest = 0
    for i in order:
        ex = examples[i]
        new_longest = max(longest, ex.input_ids.numel())
        if batch and new_longest * (len(batch) + 1) > batch_tokens:
            yield batch
            batch, new_longest = [], ex.input_ids.numel()
        batch.append(ex)
        longest = new_longest
    if batch:
        yield batch


def collate(batch: Sequence[Example], pad_id: int) -> tuple:
    """Right-padded input_ids [B, T], loss_mask [B, T] and valid [B, T] (not padding)."""
    t = max(e.input_ids.numel() for e in batch)
    ids = torch.full((len(batch), t), pad_id, dtype=torch.int64)
    loss = torch.zeros(len(batch), t, dtype=torch.bool)
    valid = torch.zeros(len(batch), t, dtype=torch.bool)
    for b, e in enumerate(batch):
        n = e.input_ids.numel()
        ids[b, :n], loss[b, :n], valid[b, :n] = e.input_ids, e.loss_mask, True
    return ids, loss, valid
