"""The text the doctor measures on.

By default the target writes it: prompts cut from the sample text (the bundled code sample or
``--data``) are continued greedily by the target, and only the continuations are scored. That
is the text a draft meets at inference, where it predicts the target's own tokens; on
arbitrary text the draft is judged on tokens the target would not have written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Sequence

import torch

from ..errors import BadInputError
from ..train.data import Example, load_examples

SAMPLE_TEXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sample.txt")


@dataclass
class EvalData:
    sequences: List["Example"]  # noqa: F821  (train.data.Example)
    source: str                 # "self-generated" or "text"

    @property
    def scored_tokens(self) -> int:
        return sum(int(e.loss_mask.sum()) for e in self.sequences)


def _text_ids(paths: Sequence[str], tokenizer) -> List[int]:
    ids: List[int] = []
    for e in load_examples(paths, tokenizer, max_len=1 << 20):
        ids.extend(e.input_ids.tolist())
    return ids


def self_generated(target, tokenizer, paths: Sequence[str], num_sequences: int, prompt_tokens: int,
                   new_tokens: int, batch_size: int = 16) -> EvalData:
    """``num_sequences`` prompts of ``prompt_tokens`` tokens, spread over the text, each continued
    by ``new_tokens`` greedy target tokens; the continuations are scored (up to an EOS)."""
    ids = _text_ids(paths, tokenizer)
    if len(ids) < prompt_tokens:
        raise BadInputError(f"the doctor's sample text has {len(ids)} tokens; at least {prompt_tokens} are needed to "
                            "cut prompts from it (give more text with --data)")
    span = len(ids) - prompt_tokens
    starts = [round(i * span / max(1, num_sequences - 1)) for i in range(num_sequences)]
    prompts = torch.tensor([ids[s:s + prompt_tokens] for s in starts], dtype=torch.long)
    device = target.get_input_embeddings().weight.device
    eos = target.generation_config.eos_token_id
    eos = set([eos] if isinstance(eos, int) else (eos or []))
    sequences = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start:start + batch_size].to(device)
        with torch.no_grad():
            out = target.generate(input_ids=batch, attention_mask=torch.ones_like(batch), max_new_tokens=new_tokens,
                                  min_new_tokens=new_tokens, do_sample=False, eos_token_id=None,
                                  pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        for row in out.cpu():
            new = row[prompt_tokens:].tolist()
            cut = next((i + 1 for i, t in enumerate(new) if t in eos), len(new))
            seq = row[:prompt_tokens + cut]
            mask = torch.zeros(seq.numel(), dtype=torch.bool)
            mask[prompt_tokens:] = True
            sequences.append(Example(seq, mask))
    return EvalData(sequences, "self-generated")


def from_text(tokenizer, paths: Sequence[str], max_len: int, max_sequences: int) -> EvalData:
    """The text itself, in windows of ``max_len`` tokens, every token scored."""
    return EvalData(load_examples(paths, tokenizer, max_len)[:max_sequences], "text")
