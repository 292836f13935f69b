"""``eagle3 train capture``: run the target once and write the offline hidden-state cache that
``eagle3 train --from-cache`` reads (``train/capture_cache.py`` does the work)."""

from __future__ import annotations

import argparse
import json

from ..api.settings import MAX_SEED
from ..dtypes import DTYPES
from . import types as T


def add_capture_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, type=T.target, help="target model directory")
    p.add_argument("--data", required=True, nargs="+", type=T.readable_file,
                   help="text files or JSONL (text / chat messages / input_ids), as `eagle3 train` reads them")
    p.add_argument("--out", required=True, type=T.output_directory, help="the cache directory to write")
    p.add_argument("--aux-layers", type=T.integer(0), nargs="+",
                   help="target layers to capture, as output_hidden_states indices (default [2, L//2, L-3])")
    p.add_argument("--draft-vocab-size", type=T.integer(1),
                   help="draft vocabulary size (default min(target vocab, 32000))")
    p.add_argument("--max-len", type=T.integer(4), default=512, help="tokens per sequence")
    p.add_argument("--dtype", default="float32", choices=list(DTYPES), help="the target's dtype (and the cache's)")
    p.add_argument("--val-examples", type=T.integer(1), default=64,
                   help="at most this many sequences (10%% of the data or fewer) are held out for evaluation")
    p.add_argument("--seed", type=T.integer(0, MAX_SEED), default=0, help="the seed of the validation split")
    p.add_argument("--batch-tokens", type=T.integer(1), default=4096, help="tokens per target forward")
    p.add_argument("--head", choices=["auto", "hidden", "logits"], default="auto",
                   help="store the lm_head's input (hidden: H values per token, logits recomputed exactly) or the "
                        "draft-vocabulary logits (logits); auto picks hidden where the head is one linear map")
    p.add_argument("--shard-mb", type=T.integer(1), default=1024, help="MiB per shard file")
    p.add_argument("--tp-size", type=T.integer(1), default=1,
                   help="under torchrun: shard the target over this many ranks (the rest split the data)")
    p.add_argument("--dry-run", action="store_true", help="print the size estimate and stop")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")


def run_capture(args) -> int:
    from ..distributed import init_from_env, rank, shutdown
    from ..train.capture_cache import CaptureConfig, capture

    T.resolve_gguf_target(args)
    init_from_env()
    config = CaptureConfig(target=args.target, data=args.data, out=args.out, aux_layers=args.aux_layers,
                           draft_vocab_size=args.draft_vocab_size, max_len=args.max_len, dtype=args.dtype,
                           val_max_examples=args.val_examples, seed=args.seed, batch_tokens=args.batch_tokens,
                           head=args.head, shard_mb=args.shard_mb, tp_size=args.tp_size, dry_run=args.dry_run,
                           progress=not args.json)
    this_rank = rank()
    try:
        result = capture(config)
    except BaseException:
        shutdown(wait_for_peers=False)
        raise
    shutdown()
    if this_rank != 0:
        return 0
    if args.json:
        print(json.dumps(result))
    elif not args.dry_run:
        print(f"cache written to {args.out}: {result['examples']} examples, {result['tokens']} tokens, "
              f"{result['bytes_written'] / 2**20:.1f} MiB ({result['head']} head), {result['tokens_per_s']:.0f} "
              f"tokens/s over {result['processes']} process(es) ({result['layout']})")
    return 0
