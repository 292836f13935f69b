"""A draft's n-gram table: what the target wrote next after each frequent context of the
draft's training data.

Prompt lookup (``decoding/lookup.py``) copies from the request's own tokens, so it finds
nothing in an answer that does not repeat its prompt. The target's responses in the draft's
training data repeat each other instead ("Here's a Python function that ...", the shape of a
docstring, a list's numbering), and a short table of their most frequent continuations
predicts those spans at the cost of a dictionary lookup. With ``TreeConfig(lookup_corpus=True)``
hybrid drafting takes a chain from this table where prompt lookup has no match of at least two
tokens (``NgramLookup``).

The table maps each context of ``MIN_NGRAM`` .. ``max_ngram`` tokens seen at least
``min_count`` times before a trained (loss-masked) token to that token's most frequent
successor and its share of the context's count. It is stored beside the draft's weights as
``lookup_ngrams.safetensors`` and loads with the draft; it is tied to the target's tokenizer
(``vocab_size`` is recorded and checked), not to the draft's weights.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from typing import Dict, Iterable, List, Sequence, Tuple

import torch

from .. import validation
from ..errors import BadInputError

FILE_NAME = "lookup_ngrams.safetensors"
FORMAT_VERSION = 1
METADATA_KEY = "eagle3_ext.lookup_corpus"
# A one-token context predicts little (every token has some most frequent successor), so the
# table starts at two.
MIN_NGRAM = 2
MAX_NGRAM = 8


class LookupCorpus:
    """``table[n]`` maps an n-token context to (the next token, its share of the context's count)."""

    def __init__(self, table: Dict[int, Dict[Tuple[int, ...], Tuple[int, float]]], vocab_size: int, min_count: int):
        self.table = table
        self.vocab_size = vocab_size
        self.min_count = min_count
        self.max_ngram = max(table, default=MIN_NGRAM - 1)

    def __len__(self) -> int:
        return sum(len(t) for t in self.table.values())

    # --- building ----------------------------------------------------------------------------
    @classmethod
    def count(cls, examples: Iterable, vocab_size: int, max_ngram: int = 4, min_count: int = 2) -> "LookupCorpus":
        """The table of ``examples`` (each with ``input_ids`` and a bool ``loss_mask``, as
        ``train.data`` makes them): for every trained token, its contexts of MIN_NGRAM ..
        ``max_ngram`` tokens (any tokens, the prompt's included) count it as their successor."""
        validation.integer("vocab_size", vocab_size, 1)
        validation.integer("max_ngram", max_ngram, MIN_NGRAM, MAX_NGRAM)
        validation.integer("min_count", min_count, 1)
        counts: Dict[int, Dict[Tuple[int, ...], Counter]] = {n: defaultdict(Counter)
                                                             for n in range(MIN_NGRAM, max_ngram + 1)}
        for example in examples:
            ids = example.input_ids.tolist()
            trained = example.loss_mask.tolist()
            for i in range(MIN_NGRAM, len(ids)):
                if not trained[i]:
                    continue
                for n in range(MIN_NGRAM, min(max_ngram, i) + 1):
                    counts[n][tuple(ids[i - n:i])][ids[i]] += 1
        table = {}
        for n, contexts in counts.items():
            kept = {}
            for context, successors in contexts.items():
                total = sum(successors.values())
                if total >= min_count:
                    # most_common breaks ties by first occurrence: the table is the same on every run.
                    token, hits = successors.most_common(1)[0]
                    kept[context] = (token, hits / total)
            table[n] = kept
        return cls(table, vocab_size, min_count)

    # --- lookup ------------------------------------------------------------------------------
    def propose(self, tokens: Sequence[int], max_tokens: int) -> Tuple[List[int], List[float], int]:
        """A greedy continuation of ``tokens``, up to ``max_tokens`` long: each step takes the
        successor of the longest context the table knows. Returns (chain, the estimated
        probability that each chain prefix is accepted, the length of the first step's context;
        0 and empty lists when the table knows no context of the tokens)."""
        context = list(tokens[-self.max_ngram:]) if self.max_ngram >= MIN_NGRAM else []
        chain: List[int] = []
        scores: List[float] = []
        first = 0
        p = 1.0
        while len(chain) < max_tokens:
            for n in range(min(self.max_ngram, len(context)), MIN_NGRAM - 1, -1):
                hit = self.table[n].get(tuple(context[-n:]))
                if hit is not None:
                    break
            else:
                break
            token, share = hit
            first = first or n
            p *= share
            chain.append(token)
            scores.append(p)
            context.append(token)
        return chain, scores, first

    # --- files -------------------------------------------------------------------------------
    def save(self, path: str) -> None:
        """Writes the table as safetensors: per n, ``context.{n}`` [M, n] int32, ``next.{n}``
        [M] int32 and ``share.{n}`` [M] float32, contexts in sorted order (a table saves to the
        same bytes every time)."""
        from safetensors.torch import save_file
        tensors = {}
        for n, entries in self.table.items():
            keys = sorted(entries)
            tensors[f"context.{n}"] = torch.tensor(keys, dtype=torch.int32).view(len(keys), n)
            tensors[f"next.{n}"] = torch.tensor([entries[k][0] for k in keys], dtype=torch.int32)
            tensors[f"share.{n}"] = torch.tensor([entries[k][1] for k in keys], dtype=torch.float32)
        # One metadata entry: safetensors writes several in no fixed order.
        header = {"version": FORMAT_VERSION, "vocab_size": self.vocab_size, "min_count": self.min_count,
                  "ngrams": sorted(self.table)}
        save_file(tensors, path, metadata={METADATA_KEY: json.dumps(header, sort_keys=True)})

    @classmethod
    def load(cls, path: str) -> "LookupCorpus":
        """Reads a table ``save`` wrote; another file is an error naming it."""
        from safetensors import safe_open
        try:
            with safe_open(path, framework="pt") as f:
                metadata = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except Exception as e:  # safetensors raises its own error types for a damaged file
            raise BadInputError(f"{path}: not a readable safetensors file ({e})") from None
        try:
            header = json.loads(metadata.get(METADATA_KEY, "null"))
        except ValueError:
            header = None
        if not isinstance(header, dict) or header.get("version") != FORMAT_VERSION:
            raise BadInputError(f"{path}: not an n-gram table ({METADATA_KEY} version {FORMAT_VERSION} "
                                f"metadata expected, got {metadata})")
        try:
            vocab_size, min_count = int(header["vocab_size"]), int(header["min_count"])
            ngrams = header["ngrams"]
            if ngrams != list(range(MIN_NGRAM, MIN_NGRAM + len(ngrams))) or len(ngrams) > MAX_NGRAM - MIN_NGRAM + 1:
                raise ValueError(f"context lengths {ngrams}, expected {MIN_NGRAM}, {MIN_NGRAM + 1}, ... at most "
                                 f"{MAX_NGRAM}")
            table = {}
            for n in ngrams:
                contexts, successors, shares = (tensors[f"{kind}.{n}"] for kind in ("context", "next", "share"))
                if contexts.dim() != 2 or contexts.shape[1] != n or not (
                        len(contexts) == len(successors) == len(shares)):
                    raise ValueError(f"the tensors of n={n} disagree in shape")
                table[int(n)] = dict(zip(map(tuple, contexts.tolist()), zip(successors.tolist(), shares.tolist())))
        except (KeyError, ValueError, TypeError) as e:
            raise BadInputError(f"{path}: a damaged n-gram table ({e})") from None
        return cls(table, vocab_size, min_count)

    def check_vocab(self, vocab_size: int, where: str) -> None:
        """A table counted with another tokenizer would propose other tokens' ids."""
        if self.vocab_size != vocab_size:
            raise BadInputError(f"{where}: the n-gram table ({FILE_NAME}) was counted over a vocabulary of "
                                f"{self.vocab_size} tokens, the target has {vocab_size}: it belongs to another "
                                "target; count it again with `eagle3 train ngrams`")


def load_beside(directory: str):
    """The table stored in a draft directory, or None where it has none."""
    path = os.path.join(directory, FILE_NAME)
    return LookupCorpus.load(path) if os.path.isfile(path) else None
