"""Greedy acceptance of several drafts for one target, per prompt category, the drafts taking turns.

    python benchmarks/compare_drafts.py DRAFT [DRAFT ...] [--target DIR] [--prompts FILE.jsonl]
        [--tree 5,1,6 5,1,6,10 ...] [--max-new-tokens 96] [--out FILE.json]

Which of two drafts to ship is a question of acceptance, and acceptance moves by a few percent
between training runs: both drafts run on the same target in one process, each prompt through
every draft in turn, so the comparison carries no machine noise (greedy tokens do not depend on
timing). For each tree and draft it reports the verify rounds summed over the prompts and, per
category, new tokens over rounds; every output is checked against the target's own greedy
decoding (Hugging Face generate), and a difference is an error.

Defaults: the SmolLM2 target (``eagle3_ext.models.pair("smollm2")``) and its 40 held-out evaluation
prompts (chat template on), float32 target, each draft in the dtype it was saved in, eager rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

import torch

EVAL_PROMPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "eagle3_ext", "models",
                            "smollm2", "eval_prompts.jsonl")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", help="target directory [SmolLM2-135M-Instruct, converted]")
    parser.add_argument("drafts", nargs="+", metavar="DRAFT", help="draft directories")
    parser.add_argument("--prompts", default=EVAL_PROMPTS, help="JSONL of {\"prompt\", \"category\"}")
    parser.add_argument("--tree", nargs="+", default=["5,1,6", "5,1,6,10", "5,2,12,10"],
                        help="trees as eagle3 bench --tree takes them")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--dtype", default="float32", help="the target's dtype")
    parser.add_argument("--out", help="write the report here as JSON too")
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eagle3_ext.api import SpeculativeGenerator
    from eagle3_ext.api.inputs import chat_prompt
    from eagle3_ext.bench.baseline import hf_generate
    from eagle3_ext.cli.bench import _parse_trees
    from eagle3_ext.draft import Eagle3DraftModel
    from eagle3_ext.models import pair
    from eagle3_ext.prompts import load_categorized_prompts

    target_dir = args.target or pair("smollm2", args.dtype)[0]
    trees = _parse_trees(args.tree)
    prompts, categories = load_categorized_prompts(args.prompts)
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=getattr(torch, args.dtype)).eval()
    drafts = [Eagle3DraftModel.from_pretrained(path, target.config) for path in args.drafts]
    generators = {(name, d): SpeculativeGenerator(target, draft, tree, tokenizer=tokenizer)
                  for name, tree in trees.items() for d, draft in enumerate(drafts)}

    rounds = defaultdict(int)                              # (tree, draft) -> verify rounds
    per_category = defaultdict(lambda: [0, 0])             # (tree, draft, category) -> [new tokens, rounds]
    for i, (prompt, category) in enumerate(zip(prompts, categories)):
        text = chat_prompt(prompt, tokenizer)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        (plain,), _ = hf_generate(target, tokenizer, [ids], args.max_new_tokens)
        order = list(range(len(drafts)))
        if i % 2:
            order.reverse()  # neither draft always runs first
        for name in trees:
            for d in order:
                out = generators[name, d].generate([ids], max_new_tokens=args.max_new_tokens,
                                                   return_dict_in_generate=True)
                if out.new_tokens[0] != plain:
                    raise SystemExit(f"prompt {i + 1}, {name}, {args.drafts[d]}: the output differs from the "
                                     "target's greedy decoding")
                rounds[name, d] += out.stats.request_rounds
                cell = per_category[name, d, category]
                cell[0] += len(out.new_tokens[0])
                cell[1] += out.stats.request_rounds
        print(f"prompt {i + 1}/{len(prompts)} done", file=sys.stderr, flush=True)

    report = {"target": args.target, "dtype": args.dtype, "max_new_tokens": args.max_new_tokens,
              "prompts": args.prompts, "threads": torch.get_num_threads(), "results": []}
    ordered_categories = list(dict.fromkeys(categories))
    print(f"| tree | draft | rounds | {' | '.join(ordered_categories)} |")
    print(f"| --- | --- | --- | {' | '.join('---' for _ in ordered_categories)} |")
    for name in trees:
        for d, path in enumerate(args.drafts):
            lengths = {c: per_category[name, d, c][0] / max(1, per_category[name, d, c][1])
                       for c in ordered_categories}
            report["results"].append({"tree": name, "draft": path, "rounds": rounds[name, d],
                                      "acceptance_length": lengths, "identical": True})
            print(f"| {name} | {path} | {rounds[name, d]} | "
                  f"{' | '.join(f'{lengths[c]:.3f}' for c in ordered_categories)} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
