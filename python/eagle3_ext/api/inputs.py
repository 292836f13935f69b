"""The prompts of one ``generate`` call, from whatever Hugging Face users pass.

- ``input_ids`` [B, L] (or [L]) with ``attention_mask`` (left or right padding, or none);
  without a mask, padding is inferred as Hugging Face's generate infers it: tokens equal to
  ``pad_token_id`` when it is set, differs from the EOS token and occurs in the input.
- A string or a list of strings (tokenized; no second BOS when the string already starts with
  the tokenizer's BOS text, as a prompt rendered with a chat template does).
- Chat messages, one conversation (a list of {"role", "content"} dicts) or a list of them:
  rendered with the tokenizer's chat template and a generation prompt, tokenized as rendered.
- A list of token-id lists.

``Prompts.echo`` is what Hugging Face's output starts with: the input tensor as given, or the
prompts left-padded with ``pad_token_id``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

import torch

from ..errors import BadInputError, BadInputTypeError


@dataclass
class Prompts:
    ids: List[List[int]]     # each request's prompt tokens
    echo: torch.Tensor       # [B, L] the prompt part of the output


def _is_message(x: Any) -> bool:
    return isinstance(x, dict) and "role" in x and "content" in x


def _render_chat(conversation: List[dict], tokenizer) -> List[int]:
    if tokenizer is None or getattr(tokenizer, "chat_template", None) is None:
        raise BadInputError("chat messages need a tokenizer with a chat template")
    rendered = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True)
    if not isinstance(rendered, list):  # transformers 5 may return a BatchEncoding
        rendered = rendered["input_ids"]
    return [int(t) for t in rendered]


def uses_chat(chat: Optional[bool], tokenizer) -> bool:
    """Whether prompts are asked as chat turns: ``chat`` when given, else whether the
    tokenizer has a chat template."""
    return chat if chat is not None else getattr(tokenizer, "chat_template", None) is not None


def chat_prompt(text: str, tokenizer) -> str:
    """``text`` as one user turn rendered with the tokenizer's chat template and a generation
    prompt: what an instruct target is asked in a chat."""
    if tokenizer is None or getattr(tokenizer, "chat_template", None) is None:
        raise BadInputError("chat prompts need a tokenizer with a chat template")
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                         tokenize=False)


def encode_prompt(text: str, tokenizer) -> List[int]:
    """A string prompt's token ids, as ``generate`` encodes it."""
    if tokenizer is None:
        raise BadInputError("string prompts need a tokenizer: pass tokenizer= or build the generator with one")
    bos = getattr(tokenizer, "bos_token", None)
    # A prompt rendered with a chat template already starts with the BOS text.
    add_special = not (bos and text.startswith(bos))
    return list(tokenizer(text, add_special_tokens=add_special)["input_ids"])


def _mask_from_padding(input_ids: torch.Tensor, pad: Optional[int], eos: List[int]) -> torch.Tensor:
    if pad is not None and pad not in eos and bool((input_ids == pad).any()):
        return (input_ids != pad).long()
    return torch.ones_like(input_ids)


def prepare(input_ids: Any, attention_mask: Optional[torch.Tensor], tokenizer, pad_token_id: int,
            eos_token_ids: List[int]) -> Prompts:
    """Prompts from any of the accepted forms (see the module docstring)."""
    if isinstance(input_ids, torch.Tensor):
        ids = input_ids
        if ids.dim() == 1:
            ids = ids[None]
            attention_mask = None if attention_mask is None else attention_mask.view(1, -1)
        if ids.dtype not in (torch.int64, torch.int32):
            raise BadInputTypeError(f"input_ids must be an int64 or int32 tensor of token ids, got {ids.dtype}")
        if ids.dim() != 2:
            raise BadInputError(f"input_ids must be [B, L] or [L], got shape {list(input_ids.shape)}")
        if attention_mask is None:
            attention_mask = _mask_from_padding(ids, pad_token_id, eos_token_ids)
        if not isinstance(attention_mask, torch.Tensor):
            raise BadInputTypeError(f"attention_mask must be a tensor, got {type(attention_mask).__name__}")
        if attention_mask.shape != ids.shape:
            raise BadInputError(f"attention_mask must be a tensor of input_ids' shape {list(ids.shape)}, got "
                                f"{getattr(attention_mask, 'shape', attention_mask)!r}")
        mask = attention_mask.to(ids.device).bool()
        return Prompts([row[m].tolist() for row, m in zip(ids, mask)], ids.long())
    if attention_mask is not None:
        raise BadInputError("attention_mask goes with an input_ids tensor; strings, messages and token lists bring "
                            "their own lengths")
    if isinstance(input_ids, str):
        rows = [encode_prompt(input_ids, tokenizer)]
    elif isinstance(input_ids, (list, tuple)) and input_ids and all(_is_message(m) for m in input_ids):
        rows = [_render_chat(list(input_ids), tokenizer)]
    elif isinstance(input_ids, (list, tuple)) and input_ids:
        rows = []
        for p in input_ids:
            if isinstance(p, str):
                rows.append(encode_prompt(p, tokenizer))
            elif isinstance(p, (list, tuple)) and p and all(_is_message(m) for m in p):
                rows.append(_render_chat(list(p), tokenizer))
            elif isinstance(p, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
                rows.append([int(t) for t in p])
            elif isinstance(p, torch.Tensor) and p.dim() == 1:
                rows.append(p.tolist())
            else:
                raise BadInputTypeError(f"prompt {len(rows)}: expected a string, a list of token ids or chat messages, "
                                        f"got {type(p).__name__}")
    else:
        raise BadInputTypeError("input_ids must be a tensor [B, L], a string, a non-empty list of strings / token-id "
                                f"lists, or chat messages; got {type(input_ids).__name__}")
    longest = max(len(r) for r in rows)
    echo = torch.full((len(rows), longest), pad_token_id, dtype=torch.long)
    for b, r in enumerate(rows):
        if r:
            echo[b, longest - len(r):] = torch.tensor(r)
    return Prompts(rows, echo)
