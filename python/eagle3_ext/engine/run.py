"""``eagle3 generate``: load a target and its draft, generate, optionally compare with plain
Hugging Face decoding measured in the same run."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Dict, Optional

import torch

from ..dtypes import DTYPES, check_dtype_name
from .config import TreeConfig

logger = logging.getLogger(__name__)

DEFAULT_PROMPT = "def fibonacci(n):\n"


@dataclass
class GenerateRequest:
    target: Optional[str] = None
    draft: Optional[str] = None
    prompt: Optional[str] = None
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    depth: Optional[int] = None
    topk: Optional[int] = None
    num_draft_tokens: Optional[int] = None
    chain: bool = False
    attention: str = "tree"
    seed: int = 0
    baseline: bool = False
    dtype: str = "float32"
    draft_dtype: Optional[str] = None   # None: as the draft was saved
    check_ranks: bool = False
    strict_capture: bool = True         # the capture guard raises (False: warns)

    def tree(self) -> TreeConfig:
        if self.chain:
            if self.topk not in (None, 1):
                raise ValueError(f"--chain drafts with topk 1, got --topk {self.topk}")
            return TreeConfig.chain(self.depth or 5)
        default = TreeConfig()
        return TreeConfig(depth=self.depth or default.depth, topk=self.topk or default.topk,
                          num_draft_tokens=self.num_draft_tokens or default.num_draft_tokens)


def resolve_models(target: Optional[str], draft: Optional[str]):
    if (target is None) != (draft is None):
        raise ValueError("give both --target and --draft, or neither for the bundled pair")
    if target is None:
        from ..models import bundled_paths
        return bundled_paths()
    return target, draft


def load_pair(target_dir: str, draft_dir: str, dtype: str, draft_dtype: Optional[str] = None):
    """Target in ``dtype``; the draft in ``draft_dtype`` (None: as saved). The draft's dtype
    changes only how well it guesses, never the output: the target's numbers decide."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..draft import Eagle3DraftModel

    from ..distributed import tp

    check_dtype_name("dtype", dtype)
    check_dtype_name("draft_dtype", draft_dtype)
    torch_dtype = DTYPES[dtype]
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    if tp.is_distributed():
        target = tp.load_target(target_dir, torch_dtype).eval()
    else:
        target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch_dtype).eval()
    draft = Eagle3DraftModel.from_pretrained(draft_dir, target_config=target.config)
    if draft_dtype is not None:
        draft = draft.to(DTYPES[draft_dtype])
    return target, draft, tokenizer


def run_generate(req: GenerateRequest, progress: bool = True) -> Dict[str, Any]:
    from ..distributed import tp
    from .generator import SpeculativeGenerator

    target_dir, draft_dir = resolve_models(req.target, req.draft)
    target, draft, tokenizer = load_pair(target_dir, draft_dir, req.dtype, req.draft_dtype)
    gen = SpeculativeGenerator(target, draft, req.tree(), tokenizer=tokenizer, attention=req.attention,
                               check_ranks=req.check_ranks or None, strict=req.strict_capture)
    prompt = req.prompt if req.prompt is not None else DEFAULT_PROMPT
    streamer = None
    if progress and tp.rank() == 0:
        from transformers import TextStreamer
        streamer = TextStreamer(tokenizer, skip_prompt=False)  # the prompt, then the completion
    # A short warm-up so one-time costs (allocator, first kernel calls) hit neither side.
    gen.generate(prompt, max_new_tokens=4, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                 seed=req.seed)
    out = gen.generate(prompt, max_new_tokens=req.max_new_tokens, temperature=req.temperature, top_p=req.top_p,
                       top_k=req.top_k, seed=req.seed, streamer=streamer)
    stats = out.stats
    report: Dict[str, Any] = {
        "prompt": prompt, "text": out.text[0], "tokens": out.sequences[0], "new_tokens": stats.new_tokens,
        "target_forwards": stats.target_forwards, "acceptance_length": stats.acceptance_length,
        "depth_acceptance": stats.depth_acceptance, "tokens_per_s": stats.tokens_per_s,
        "draft_time_s": stats.draft_time_s, "verify_time_s": stats.verify_time_s, "time_s": stats.total_time_s,
        "tree": {"depth": gen.tree.depth, "topk": gen.tree.topk, "num_draft_tokens": gen.tree.num_draft_tokens},
        "finish_reason": out.finish_reasons[0], "target": target_dir, "draft": draft_dir,
        "world_size": tp.world_size(),
        "attention": gen.attention_path,
        "attention_reason": ("every layer runs eagle3.tree_attention (windows, soft-caps, sinks and MLA included)"
                             if gen.attention_path == "tree" else "--attention sdpa was asked for: the model's own "
                             "attention with a 4D mask per layer type"),
        "capture_check": None if gen.capture_check is None else {
            "ok": gen.capture_check.ok, "message": gen.capture_check.describe(),
            "time_s": gen.capture_check.time_s},
    }
    if req.baseline:
        report.update(baseline(target, tokenizer, prompt, req, out.sequences[0], stats.total_time_s))
    return report


def baseline(target, tokenizer, prompt: str, req: GenerateRequest, tokens, spec_time_s: float) -> Dict[str, Any]:
    """Plain Hugging Face generate with the same settings, timed the same way."""
    enc = tokenizer(prompt, return_tensors="pt")
    kwargs: Dict[str, Any] = dict(max_new_tokens=len(tokens), pad_token_id=tokenizer.pad_token_id)
    if req.temperature > 0:
        kwargs.update(do_sample=True, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k)
        torch.manual_seed(req.seed)
    else:
        kwargs.update(do_sample=False)
    target.set_attn_implementation("sdpa")
    target.generate(**enc, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id)  # warm-up
    started = time.perf_counter()
    with torch.no_grad():
        ref = target.generate(**enc, **kwargs)
    elapsed = time.perf_counter() - started
    new = ref[0, enc["input_ids"].shape[1]:].tolist()
    result: Dict[str, Any] = {"baseline_tokens_per_s": len(new) / elapsed, "baseline_time_s": elapsed,
                              "speedup": elapsed / spec_time_s * len(tokens) / max(1, len(new))}
    result["identical"] = (new[: len(tokens)] == tokens) if req.temperature == 0 else None
    return result
