"""``eagle3 bench``: speed against what one would use instead, in the same run (``bench/suite.py``
does the work)."""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import BadInputError
from ..models import SMOLLM2_EVAL_PROMPTS
from . import types as T
from .common import add_dtype_options, add_models, resolve_pair


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="speed against plain HF generate and HF prompt lookup decoding")
    add_models(p)
    p.add_argument("--prompts", type=T.readable_file,
                   help="JSONL ({\"prompt\": ...}) or text file (blank-line separated prompts); "
                        "default: the evaluation set of the pair (the bundled one without --pair)")
    p.add_argument("--num-prompts", type=T.integer(1), help="use only the first N prompts (e.g. to keep a sweep short)")
    p.add_argument("--max-new-tokens", type=T.integer(1), default=128)
    p.add_argument("--batch-sizes", type=T.integer(1), nargs="+", default=[1, 4])
    p.add_argument("--tree", nargs="+", metavar="DEPTH,TOPK,NODES[,LOOKUP[,corpus]][,sampled]",
                   help="tree configurations to run, LOOKUP the lookup_tokens (default 0; ',corpus' after it: "
                        "also from the draft's n-gram table); ',sampled' draws a chain's tokens from the draft when "
                        "sampling (default: chain5, 5,4,16, chain5 with lookup 10 "
                        "and 5,2,16,10)")
    p.add_argument("--sweep", action="store_true",
                   help="try a grid of depth / topk / num_draft_tokens / lookup at batch 1")
    p.add_argument("--temperature", type=T.number(0), nargs="+", default=[0.0], metavar="T",
                   help="a run per temperature, 0 = greedy (default: greedy only); T > 0 samples, against plain HF "
                        "sampling with the same settings, and reports each configuration's acceptance bound")
    p.add_argument("--top-p", type=T.number(0, 1, exclusive_minimum=True), default=1.0,
                   help="top-p of the sampled runs (1 = off)")
    p.add_argument("--top-k", type=T.integer(0), default=0, help="top-k of the sampled runs (0 = off)")
    p.add_argument("--out", type=T.output_directory, default="bench-results/e2e",
                   help="directory for bench.json, bench.md, bench.png")
    add_dtype_options(p)
    p.add_argument("--no-compiled-baseline", action="store_true",
                   help="leave out HF generate with a static cache and torch.compile (it compiles first)")
    p.add_argument("--compile", action="store_true",
                   help="also run every configuration with its verify forward and draft loop compiled, "
                        "as NAME+compiled")
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="ask each prompt as a user turn of the target's chat template (default: when the "
                        "tokenizer has one)")
    p.add_argument("--no-llama-cpp", action="store_true",
                   help="leave out llama.cpp's rows (run where llama.cpp is built by benchmarks/build_llama_cpp.sh: "
                        "plain f32, bf16, with this draft, and the target's own GGUF; else plain decoding through "
                        "llama-cpp-python where it is installed)")
    p.add_argument("--llama-cpp-dir", type=T.directory, default=None,
                   help="the llama.cpp build to measure (default: the build script's folder)")
    p.add_argument("--by-category", action="store_true",
                   help="run each category of the prompt file (its JSONL \"category\" fields) as a prompt set of its "
                        "own, every method measured on it, and add a table per category")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")


def _parse_trees(specs):
    from ..api.config import TreeConfig

    trees = {}
    for spec in specs:
        try:
            parts = spec.split(",")
            flag = parts[-1] if parts[-1] in ("sampled", "corpus") else None
            values = [int(x) for x in (parts[:-1] if flag else parts)]
            if len(values) not in (3, 4) or (flag == "corpus" and len(values) != 4):
                raise ValueError
        except ValueError:
            raise BadInputError(f"--tree takes DEPTH,TOPK,NODES or DEPTH,TOPK,NODES,LOOKUP_TOKENS, optionally "
                                f"followed by ,sampled (or after LOOKUP_TOKENS by ,corpus), got {spec!r}") from None
        tree = TreeConfig(*values[:3], lookup_tokens=values[3] if len(values) == 4 else 0, sampled=flag == "sampled",
                          lookup_corpus=flag == "corpus")
        trees[tree.name] = tree
    return trees


def run(args) -> int:
    from ..api import CompileOptions
    from ..bench.suite import SAMPLED_DEFAULT, BenchConfig, run_bench, run_sweep, sweep_configs
    from ..prompts import load_categorized_prompts, load_prompts

    resolve_pair(args)
    if args.pair == "smollm2" and args.prompts is None:  # its own held-out set, in four categories
        args.prompts = SMOLLM2_EVAL_PROMPTS
    if args.by_category and args.prompts is None:
        raise BadInputError("--by-category needs --prompts (a JSONL file whose lines have a \"category\") or "
                            "--pair smollm2")
    prompts = categories = None
    if args.by_category:
        prompts, categories = load_categorized_prompts(args.prompts)
    elif args.prompts:
        prompts = load_prompts(args.prompts)
    cfg = BenchConfig(target=args.target, draft=args.draft, max_new_tokens=args.max_new_tokens,
                      batch_sizes=args.batch_sizes, out=args.out, dtype=args.dtype, draft_dtype=args.draft_dtype,
                      num_prompts=args.num_prompts, compiled_baseline=not args.no_compiled_baseline,
                      llama_cpp=not args.no_llama_cpp, llama_cpp_dir=args.llama_cpp_dir,
                      compile=CompileOptions() if args.compile else False,
                      chat=args.chat,
                      prompts=prompts, categories=categories,
                      temperatures=args.temperature, top_p=args.top_p, top_k=args.top_k)
    if args.tree:
        cfg.configs = _parse_trees(args.tree)
    elif args.sweep:
        cfg.configs = sweep_configs()
    elif any(t > 0 for t in args.temperature):
        cfg.configs[SAMPLED_DEFAULT.name] = SAMPLED_DEFAULT
    report = run_sweep(cfg, progress=not args.json) if args.sweep else run_bench(cfg, progress=not args.json)
    if args.json:
        print(json.dumps(report))
    else:
        from ..bench.suite import markdown
        print(markdown(report))
        if args.sweep:
            best = report["best"]
            print(f"fastest on this machine: {best['method']} ({best['tokens_per_s']:.1f} tokens/s, speedup "
                  f"{best['speedup']:.2f}x)")
        print(f"wrote {args.out}/bench.json, bench.md, bench.png", file=sys.stderr)
    return 0
