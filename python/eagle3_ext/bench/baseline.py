"""Plain Hugging Face generate, the baseline every comparison in this library uses: the CLI's
``--baseline``, ``eagle3 bench``, the benchmarks and the tests."""

from __future__ import annotations

import time
from typing import List, Optional, Sequence, Tuple, Union

import torch


def hf_generate(target, tokenizer, prompts: Sequence[Union[str, Sequence[int]]], max_new_tokens: int,
                stop_at_eos: bool = True, seed: Optional[int] = None, **kwargs) -> Tuple[List[List[int]], float]:
    """Hugging Face's ``generate`` on ``prompts`` (strings, or token-id lists) as one left-padded
    batch: (new tokens per prompt, seconds). Greedy unless ``do_sample=True`` is passed;
    ``seed`` seeds torch's global RNG first, which is what Hugging Face samples from.

    The target runs its own attention implementation (SDPA where the library's tree attention
    was set). With ``stop_at_eos`` each row ends at the target's EOS (included); otherwise every
    row runs to ``max_new_tokens``. An ``eos_token_id`` keyword replaces the target's EOS.
    """
    if getattr(target.config, "_attn_implementation", None) == "eagle3_tree":
        target.set_attn_implementation("sdpa")
    if all(isinstance(p, str) for p in prompts):
        enc = tokenizer(list(prompts), return_tensors="pt", padding=True, padding_side="left")
    else:
        longest = max(len(p) for p in prompts)
        pad = tokenizer.pad_token_id if tokenizer is not None and tokenizer.pad_token_id is not None else 0
        ids = torch.full((len(prompts), longest), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for b, p in enumerate(prompts):
            ids[b, longest - len(p):] = torch.tensor(list(p))
            mask[b, longest - len(p):] = 1
        enc = {"input_ids": ids, "attention_mask": mask}
    device = target.get_input_embeddings().weight.device
    enc = {k: v.to(device) for k, v in enc.items()}
    kwargs.setdefault("do_sample", False)
    if not stop_at_eos:
        kwargs["eos_token_id"] = None
    pad_id = tokenizer.pad_token_id if tokenizer is not None else None
    if seed is not None:
        torch.manual_seed(seed)
    started = time.perf_counter()
    with torch.no_grad():
        out = target.generate(**enc, max_new_tokens=max_new_tokens, pad_token_id=pad_id, **kwargs)
    elapsed = time.perf_counter() - started
    eos = kwargs.get("eos_token_id", target.generation_config.eos_token_id) if stop_at_eos else None
    eos = set([eos] if isinstance(eos, int) else (eos or []))
    rows = []
    for row in out[:, enc["input_ids"].shape[1]:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        rows.append(row[:cut])
    return rows, elapsed
