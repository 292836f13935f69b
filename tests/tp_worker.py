"""Run under torchrun by tests/test_tp.py: speculative and plain greedy decoding of a tiny target
sharded across the ranks, plus seeded sampling; each rank writes what it produced."""

import json
import sys
import time

import torch

from eagle3_ext.distributed import init_from_env, load_target, rank, shutdown
from eagle3_ext.draft import Eagle3DraftModel
from eagle3_ext.api import SpeculativeGenerator, TreeConfig
from eagle3_ext.bench.baseline import hf_generate

PROMPTS = ["def print return", "class value key item index count", "for while if else"]


def main(out_dir: str, target_dir: str, draft_dir: str, mode: str) -> None:
    init_from_env(timeout_s=8.0 if mode == "hang" else 120.0)
    try:
        run(out_dir, target_dir, draft_dir, mode)
    except BaseException:
        shutdown(wait_for_peers=False)
        raise
    shutdown()


def run(out_dir: str, target_dir: str, draft_dir: str, mode: str) -> None:
    from transformers import AutoTokenizer

    if mode == "hang" and rank() == 1:
        time.sleep(600)  # a rank that never reaches the first collective
    tok = AutoTokenizer.from_pretrained(target_dir)
    target = load_target(target_dir, torch.float32).eval()
    draft = Eagle3DraftModel.from_pretrained(draft_dir, target_config=target.config)
    gen = SpeculativeGenerator(target, draft, TreeConfig(depth=3, topk=2, num_draft_tokens=6), tokenizer=tok,
                               check_ranks=True)
    spec = gen.generate(PROMPTS, max_new_tokens=16, eos_token_id=[], return_dict_in_generate=True)
    sampled = gen.generate(PROMPTS, max_new_tokens=16, eos_token_id=[], do_sample=True, temperature=0.8, top_k=20,
                           seed=123, return_dict_in_generate=True)
    plain, _ = hf_generate(target, tok, PROMPTS, 16, stop_at_eos=False)
    with open(f"{out_dir}/rank{rank()}.json", "w") as f:
        json.dump({"spec": spec.new_tokens, "plain": plain, "sampled": sampled.new_tokens,
                   "acceptance_length": spec.stats.acceptance_length,
                   "weight_type": type(target.model.layers[0].self_attn.q_proj.weight).__name__}, f)


if __name__ == "__main__":
    main(*sys.argv[1:5])
