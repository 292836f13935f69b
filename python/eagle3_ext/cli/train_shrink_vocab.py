"""``eagle3 train shrink-vocab``: the flags of ShrinkVocabConfig and its report
(``train/shrink_vocab.py`` does the work)."""

from __future__ import annotations

import json

from ..api.settings import MAX_SEED
from ..train.shrink_vocab import ShrinkVocabConfig, shrink_vocab
from ..train.training_split import TrainingSplit
from . import types as T


def add_split_arguments(p, defaults=TrainingSplit) -> None:
    """The flags that name the training run's data and split (TrainingSplit)."""
    p.add_argument("--target", required=True, type=T.target,
                   help="the target's directory or .gguf file (its tokenizer reads the data)")
    p.add_argument("--data", required=True, nargs="+", type=T.readable_file,
                   help="what the draft was trained on, as given to `eagle3 train --data`")
    p.add_argument("--max-len", type=T.integer(4), default=defaults.max_len,
                   help="as the training run's --max-len")
    p.add_argument("--val-examples", type=T.integer(1), default=defaults.val_examples,
                   help="as the training run's held-out split (at most this many sequences, 10%% of the data)")
    p.add_argument("--seed", type=T.integer(0, MAX_SEED), default=defaults.seed,
                   help="as the training run's --seed")


def split_of(args) -> dict:
    """TrainingSplit's fields from the flags add_split_arguments added."""
    return dict(target=args.target, data=args.data, max_len=args.max_len, val_examples=args.val_examples,
                seed=args.seed)


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
