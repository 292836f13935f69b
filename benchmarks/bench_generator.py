"""End-to-end CPU benchmark of the speculative generator on a small model.

    python benchmarks/bench_generator.py [--target DIR --draft DIR] [--max-new-tokens N]
        [--prompts N] [--out FILE.json]

Without --target/--draft it builds a small random Llama target (the tests' tiny-model recipe,
scaled up) and trains its EAGLE-3 draft for a few dozen steps first, so the acceptance is
modest; with a real pair it measures that pair. For each tree configuration it reports tokens/s
against plain Hugging Face greedy generate measured in the same run (interleaved), the
acceptance length, whether the outputs are identical, and the per-step time breakdown (draft,
tree build, verify forward, accept, compaction, other) as fractions of the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

CONFIGS = {"chain4": dict(depth=4, topk=1, num_draft_tokens=5), "tree4x2n8": dict(depth=4, topk=2, num_draft_tokens=8),
           "tree5x4n16": dict(depth=5, topk=4, num_draft_tokens=16)}


def small_pair(workdir: str):
    from tiny_models import corpus, make_target
    from eagle3_ext.train import TrainConfig, train

    make_target(os.path.join(workdir, "target"), layers=8, hidden=256)
    with open(os.path.join(workdir, "data.txt"), "w") as f:
        f.write(corpus(600, seed=1))
    train(TrainConfig(target=os.path.join(workdir, "target"), data=[os.path.join(workdir, "data.txt")],
                      out=os.path.join(workdir, "draft"), ttt_steps=3, epochs=10, lr=3e-3, warmup_steps=5,
                      batch_tokens=1024, max_len=128, eval_every=1000, progress=False, max_steps=60,
                      export_specforge=False))
    return os.path.join(workdir, "target"), os.path.join(workdir, "draft")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--prompts", type=int, default=4, help="prompts, each generated at batch 1")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    if (args.target is None) != (args.draft is None):
        parser.error("give both --target and --draft, or neither")

    from eagle3_ext.api import GenerationStats, SpeculativeGenerator, TreeConfig
    from eagle3_ext.bench.baseline import hf_generate
    from eagle3_ext.bench.generate_job import load_pair

    workdir = tempfile.mkdtemp()
    target_dir, draft_dir = (args.target, args.draft) if args.target else small_pair(workdir)
    target, draft, tok = load_pair(target_dir, draft_dir, "float32")
    from tiny_models import corpus
    prompts = [line for line in corpus(args.prompts, seed=7).splitlines()][: args.prompts]

    def hf(prompt):
        rows, seconds = hf_generate(target, tok, [prompt], args.max_new_tokens, stop_at_eos=False)
        return rows[0], seconds

    report = {"benchmark": "generator", "target": target_dir, "threads": torch.get_num_threads(),
              "max_new_tokens": args.max_new_tokens, "prompts": len(prompts), "results": []}
    print(f"{'config':>11} {'tok/s':>7} {'HF tok/s':>8} {'speedup':>7} {'accept':>6} {'same':>5} "
          f"{'draft':>6} {'build':>6} {'verify':>6} {'accept':>6} {'compact':>7} {'other':>6}")
    for name, shape in CONFIGS.items():
        gen = SpeculativeGenerator(target, draft, TreeConfig(**shape), tokenizer=tok)
        gen.generate(prompts[0], max_new_tokens=8, eos_token_id=[])  # warm-up
        hf_time, identical, runs = 0.0, True, []
        for prompt in prompts:  # interleaved: each prompt runs both ways back to back
            ref, t_hf = hf(prompt)
            out = gen.generate(prompt, max_new_tokens=args.max_new_tokens, eos_token_id=[], return_dict_in_generate=True)
            identical &= out.new_tokens[0] == ref
            hf_time += t_hf
            runs.append(out.stats)
        s = GenerationStats.combine(runs)
        parts = {"draft": s.draft_time_s, "tree_build": s.tree_build_time_s, "verify": s.verify_time_s,
                 "accept": s.accept_time_s, "compact": s.compact_time_s, "other": s.other_time_s}
        r = {"config": name, **shape, "tokens_per_s": s.tokens_per_s, "hf_tokens_per_s": s.new_tokens / hf_time,
             "speedup": hf_time / s.total_time_s, "acceptance_length": s.acceptance_length, "identical": identical,
             "breakdown": {k: v / s.total_time_s for k, v in parts.items()}}
        report["results"].append(r)
        b = r["breakdown"]
        print(f"{name:>11} {r['tokens_per_s']:>7.1f} {r['hf_tokens_per_s']:>8.1f} {r['speedup']:>6.2f}x "
              f"{r['acceptance_length']:>6.2f} {str(identical):>5} {b['draft']:>6.0%} {b['tree_build']:>6.0%} "
              f"{b['verify']:>6.0%} {b['accept']:>6.0%} {b['compact']:>7.0%} {b['other']:>6.0%}", flush=True)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {args.out}")
    return 0 if all(r["identical"] for r in report["results"]) else 1


if __name__ == "__main__":
    sys.exit(main())
