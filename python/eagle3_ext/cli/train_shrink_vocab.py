"""``eagle3 train shrink-vocab``: the flags of ShrinkVocabConfig and its report
(``train/shrink_vocab.py`` does the work)."""

from __future__ import annotations

import json

from ..train.shrink_vocab import ShrinkVocabConfig, shrink_vocab
from . import types as T
from .common import add_split_arguments, split_of


def add_shrink_vocab_arguments(p) -> None:
    p.add_argument("--draft", required=True, type=T.directory, help="the trained draft's directory")
    add_split_arguments(p, ShrinkVocabConfig)
    p.add_argument("--draft-vocab-size", required=True, type=T.integer(1),
                   help="the new draft vocabulary size (at most the draft's own)")
    p.add_argument("--out", required=True, type=T.output_directory, help="the directory to write the draft to")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")


def run_shrink_vocab(args) -> int:
    T.resolve_gguf_target(args)
    result = shrink_vocab(ShrinkVocabConfig(draft=args.draft, draft_vocab_size=args.draft_vocab_size, out=args.out,
                                            **split_of(args)))
    if args.json:
        print(json.dumps(result))
    else:
        (n0, n1), (t0, t1), (v0, v1) = (result["draft_vocab_size"], result["train_coverage"],
                                        result["val_coverage"])
        print(f"draft written to {result['out']}: vocabulary {n0} -> {n1}, lm_head "
              f"{result['lm_head_mib'][0]:.1f} -> {result['lm_head_mib'][1]:.1f} MiB; trained tokens inside it "
              f"{100 * t0:.2f}% -> {100 * t1:.2f}%, held-out {100 * v0:.2f}% -> {100 * v1:.2f}%")
    return 0
