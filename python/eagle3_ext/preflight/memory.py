"""Whether a generate call fits in memory, predicted before anything is allocated.

The prediction counts what grows with the batch: the target's KV cache (every layer keeps the
whole history, prompt + new tokens + one tree), the draft's preallocated cache, the verify
logits in fp32 and the prefill's widest activation. It leaves out the weights (already
loaded) and temporaries of a few MB, so it errs low: a call it refuses would not have fit,
a call it lets through can still fail in a crowded machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from ..errors import BadInputError


GiB = 1 << 30


@dataclass
class Footprint:
    target_kv: int       # bytes
    draft_kv: int
    logits: int
    activations: int

    @property
    def total(self) -> int:
        return self.target_kv + self.draft_kv + self.logits + self.activations


def _text(config: Any) -> Any:
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def target_kv_bytes_per_token(config: Any, dtype: torch.dtype) -> int:
    """Keys and values of one token over all layers, as transformers' cache stores them."""
    config = _text(config)
    get = lambda k, d=None: getattr(config, k, None) or d  # noqa: E731
    heads = get("num_attention_heads")
    if get("kv_lora_rank"):  # MLA: the cache holds the decompressed per-head keys and values
        k_dim = get("qk_nope_head_dim", 0) + get("qk_rope_head_dim", 0)
        v_dim, kv_heads = get("v_head_dim", k_dim), heads
    else:
        kv_heads = get("num_key_value_heads", heads)
        k_dim = v_dim = get("head_dim", config.hidden_size // heads)
    item = torch.empty((), dtype=dtype).element_size()
    return config.num_hidden_layers * kv_heads * (k_dim + v_dim) * item


def predict(generator, batch: int, longest_prompt: int, most_new: int) -> Footprint:
    """The footprint of a call with ``batch`` prompts of at most ``longest_prompt`` tokens that
    add at most ``most_new`` tokens each."""
    target, draft, tree = generator.target, generator.draft, generator.tree
    t_dtype = target.get_input_embeddings().weight.dtype
    d_dtype = draft.fc.weight.dtype
    tokens = longest_prompt + most_new + tree.num_draft_tokens
    target_kv = batch * tokens * target_kv_bytes_per_token(target.config, t_dtype)
    dc = draft.config
    d_item = torch.empty((), dtype=d_dtype).element_size()
    capacity = generator.draft_cache_slots(longest_prompt, most_new)  # what Batch allocates
    draft_kv = batch * capacity * dc.num_hidden_layers * 2 * dc.num_key_value_heads * dc.head_dim * d_item
    text = _text(target.config)
    logits = batch * tree.num_draft_tokens * text.vocab_size * 4 * 3   # fp32 scores, probabilities, a copy
    width = max(text.hidden_size, getattr(text, "intermediate_size", 0) or 0)
    activations = batch * longest_prompt * width * torch.empty((), dtype=t_dtype).element_size() * 3
    return Footprint(target_kv, draft_kv, logits, activations)


def available_bytes(device: torch.device) -> Optional[int]:
    """Free memory on ``device`` (CUDA: free plus what the caching allocator holds unused; CPU:
    the kernel's MemAvailable), or None where it cannot be read."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
    return None


def check_fits(generator, batch: int, longest_prompt: int, most_new: int) -> Footprint:
    """Raises ValueError before allocation when the call cannot fit on the target's device."""
    need = predict(generator, batch, longest_prompt, most_new)
    device = generator.target.get_input_embeddings().weight.device
    free = available_bytes(device)
    if free is not None and need.total > free:
        per_request = need.total / batch
        fits = int(free // per_request)
        raise BadInputError(
            f"generate: {batch} prompts of up to {longest_prompt} tokens with max_new_tokens={most_new} need about "
            f"{need.total / GiB:.1f} GiB on {device} (KV caches {(need.target_kv + need.draft_kv) / GiB:.1f} GiB, "
            f"logits {need.logits / GiB:.1f} GiB, activations {need.activations / GiB:.1f} GiB) but "
            f"{free / GiB:.1f} GiB are free; generate at most {fits} prompts at a time or lower max_new_tokens")
    return need
