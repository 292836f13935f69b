"""``eagle3 train ngrams``: the flags of NgramsConfig and its report (``train/lookup_ngrams.py``
does the work)."""

from __future__ import annotations

import json

from ..draft import lookup_corpus
from ..train.lookup_ngrams import NgramsConfig, count_lookup_ngrams
from . import types as T
from .common import add_split_arguments, split_of


def add_ngrams_arguments(p) -> None:
    p.add_argument("--draft", required=True, type=T.directory,
                   help=f"the draft's directory; the table is written into it as {lookup_corpus.FILE_NAME}")
    add_split_arguments(p, NgramsConfig)
    p.add_argument("--max-ngram", type=T.integer(lookup_corpus.MIN_NGRAM, lookup_corpus.MAX_NGRAM),
                   default=NgramsConfig.max_ngram, help="the longest context counted")
    p.add_argument("--min-count", type=T.integer(1), default=NgramsConfig.min_count,
                   help="leave out contexts seen fewer times")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")


def run_ngrams(args) -> int:
    T.resolve_gguf_target(args)
    result = count_lookup_ngrams(NgramsConfig(draft=args.draft, max_ngram=args.max_ngram, min_count=args.min_count,
                                              **split_of(args)))
    if args.json:
        print(json.dumps(result))
    else:
        print(f"n-gram table written to {result['out']}: {result['contexts']} contexts, "
              f"{result['bytes'] / 2**20:.1f} MiB; on the held-out split it knows a context before "
              f"{100 * result['held_out_known']:.1f}% of the trained tokens and proposes the right one for "
              f"{100 * result['held_out_right']:.1f}%")
    return 0
