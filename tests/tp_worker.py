"""Run under torchrun by tests/test_tp.py: speculative and plain greedy decoding of a tiny target
sharded across the ranks, plus seeded sampling; each rank writes what it produced."""

import json
import sys
import time

import torch

from eagle3_ext.distributed import init_from_env, load_target, rank, shutdown
from eagle3_ext.draft import Eagle3DraftModel
from eagle3_ext.engine import SpeculativeGenerator, TreeConfig

PROMPTS = ["def print return", "class value key item index count", "for while if else"]


def main(out_dir: str, target_dir: str, draft_dir: str, mode: str) -> None:
    from transformers import AutoTokenizer

    init_from_env(timeout_s=8.0 if mode == "hang" else 120.0)
    if mode == "hang" and rank() == 1:
        time.sleep(600)  # a rank that never reaches the first collective
    tok = AutoTokenizer.from_pretrained(target_dir)
    target = load_target(target_dir, torch.float32).eval()
    draft = Eagle3DraftModel.from_pretrained(draft_dir, target_config=target.config)
    gen = SpeculativeGenerator(target, draft, TreeConfig(depth=3, topk=2, num_draft_tokens=6), tokenizer=tok,
                               check_ranks=True)
    spec = gen.generate(PROMPTS, max_new_tokens=16, eos_token_id=[])
    sampled = gen.generate(PROMPTS, max_new_tokens=16, eos_token_id=[], temperature=0.8, top_k=20, seed=123)
    target.set_attn_implementation("sdpa")
    enc = tok(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    ref = target.generate(**enc, max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=tok.pad_token_id)
    plain = [row[enc["input_ids"].shape[1]:].tolist() for row in ref]
    with open(f"{out_dir}/rank{rank()}.json", "w") as f:
        json.dump({"spec": spec.sequences, "plain": plain, "sampled": sampled.sequences,
                   "acceptance_length": spec.stats.acceptance_length,
                   "weight_type": type(target.model.layers[0].self_attn.q_proj.weight).__name__}, f)
    shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:5])
