"""``eagle3 train regenerate``: the flags of RegenerateConfig and the report of a run (the
library's ``train/regenerate.py`` does the work)."""

from __future__ import annotations

import json

from ..api.settings import MAX_SEED
from ..dtypes import DTYPES
from ..train.regenerate import RegenerateConfig
from . import types as T


def add_regenerate_arguments(parser) -> None:
    """The flags of ``eagle3 train regenerate`` on ``parser`` (an argparse parser)."""
    parser.add_argument("--target", required=True, type=T.target, metavar="DIR",
                        help="target model directory (AutoModelForCausalLM + a tokenizer with a chat template)")
    parser.add_argument("--data", required=True, nargs="+", type=T.readable_file, metavar="FILE",
                        help="JSONL files of {\"messages\": [...]} records (\"text\" / \"input_ids\" records pass "
                             "through unchanged)")
    parser.add_argument("--out", required=True, type=T.text, metavar="FILE",
                        help="output .jsonl file, appended to while running (under torchrun: FILE.part-RANK, merged "
                             "by rank 0); rerunning the same command continues it")
    parser.add_argument("--draft", type=T.directory, metavar="DIR",
                        help="an EAGLE-3 draft for the target: speculative generation, the same text sooner")
    parser.add_argument("--max-new-tokens", type=T.integer(1), metavar="N", default=RegenerateConfig.max_new_tokens,
                        help="tokens per assistant turn at most")
    parser.add_argument("--batch-size", type=T.integer(1), metavar="B", default=RegenerateConfig.batch_size,
                        help="conversations generated together (per process)")
    parser.add_argument("--temperature", type=T.number(0), metavar="T", default=RegenerateConfig.temperature,
                        help="0 = greedy")
    parser.add_argument("--top-p", type=T.number(0, 1, exclusive_minimum=True), metavar="P",
                        default=RegenerateConfig.top_p, help="sampling only; 1 = off")
    parser.add_argument("--top-k", type=T.integer(0), metavar="K", default=RegenerateConfig.top_k,
                        help="sampling only; 0 = off")
    parser.add_argument("--seed", type=T.integer(0, MAX_SEED), metavar="S", default=RegenerateConfig.seed,
                        help="sampling only")
    parser.add_argument("--dtype", default=RegenerateConfig.dtype, choices=list(DTYPES),
                        help="the target's dtype")
    parser.add_argument("--device", type=T.text, metavar="DEVICE",
                        help="cpu, cuda, cuda:1, ... (default: this process's GPU if there is one, else the CPU)")
    parser.add_argument("--json", action="store_true", help="print the counts as one JSON object")


def run_regenerate(args) -> int:
    """Runs ``eagle3 train regenerate`` with parsed ``args``; exceptions (a BadInput for bad input,
    KeyboardInterrupt, faults) propagate to the caller, which reports them."""
    from ..distributed import init_from_env, rank, shutdown
    from ..train.regenerate import regenerate

    T.resolve_gguf_target(args)
    init_from_env()  # under torchrun: data-parallel ranks (a no-op otherwise)
    config = RegenerateConfig(target=args.target, data=args.data, out=args.out, draft=args.draft,
                              max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                              temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                              dtype=args.dtype, device=args.device, progress=not args.json)
    this_rank = rank()
    try:
        result = regenerate(config)
    finally:
        # Without a barrier on every path: the ranks finish their shares at different times, and
        # one waiting for the slowest could pass the process group's timeout.
        shutdown(wait_for_peers=False)
    if this_rank != 0:  # only rank 0 reports
        return 0
    if args.json:
        print(json.dumps(result))
    elif result["resumed_from"] == result["conversations"]:
        print(f"{result['out']} already holds all {result['conversations']} conversations; nothing to do")
    else:
        resumed = f" ({result['resumed_from']} were already written)" if result["resumed_from"] else ""
        print(f"{result['out']}: {result['conversations']} conversations{resumed}; this run wrote "
              f"{result['regenerated']} with {result['turns_regenerated']} regenerated turns, "
              f"{result['tokens_generated']} tokens at {result['tokens_per_s']:.1f} tokens/s over "
              f"{result['world_size']} process(es)")
    return 0
