"""``eagle3 train ngrams``: the n-gram table hybrid drafting reads beside a draft
(``draft/lookup_corpus.py``), counted over the data the draft was trained on.

Only the training split is counted (the same split ``eagle3 train`` held out for validation is
left out), so the held-out conversations stay unseen by the table as by the draft's weights.
The table is written into the draft's directory, where ``Eagle3DraftModel.from_pretrained``
finds it; every later ``save_pretrained`` of that draft writes it again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict

from .. import validation
from ..draft import lookup_corpus
from ..draft.lookup_corpus import LookupCorpus
from ..draft import Eagle3DraftModel
from ..errors import BadInputError
from ..preflight.loading import check_draft_dir, check_target_dir, load_tokenizer
from .training_split import TrainingSplit


@dataclass(kw_only=True)
class NgramsConfig(TrainingSplit):
    draft: str                  # the draft's directory: the table is written into it
    max_ngram: int = 4          # the longest context
    min_count: int = 2          # contexts seen fewer times before a trained token are left out

    def validate(self) -> None:
        """Raises TypeError / ValueError (FileNotFoundError for a missing path) naming the first bad field."""
        validation.existing_dir("draft", self.draft)
        super().validate()
        validation.integer("max_ngram", self.max_ngram, lookup_corpus.MIN_NGRAM, lookup_corpus.MAX_NGRAM)
        validation.integer("min_count", self.min_count, 1)


def count_lookup_ngrams(config: NgramsConfig) -> Dict[str, Any]:
    """Counts the table, writes it to ``<draft>/lookup_ngrams.safetensors`` and returns its size
    and how often it proposes the right next token on the held-out split."""
    config.validate()
    check_draft_dir(config.draft)
    check_target_dir(config.target)
    vocab = Eagle3DraftModel.from_pretrained(config.draft).config.vocab_size
    tokenizer = load_tokenizer(config.target)
    if len(tokenizer) > vocab:
        raise BadInputError(f"target {config.target}: its tokenizer has {len(tokenizer)} tokens but the draft "
                            f"covers a vocabulary of {vocab}: the draft was trained for another target")
    train, val = config.examples(tokenizer, vocab)
    table = LookupCorpus.count(train, vocab, config.max_ngram, config.min_count)
    path = os.path.join(config.draft, lookup_corpus.FILE_NAME)
    table.save(path)
    return {"out": path, "contexts": len(table), "bytes": os.path.getsize(path),
            "contexts_per_n": {n: len(t) for n, t in sorted(table.table.items())},
            "train_examples": len(train), "val_examples": len(val), **held_out_hits(table, val)}


def held_out_hits(table: LookupCorpus, examples) -> Dict[str, float]:
    """Over the held-out trained tokens: the share where the table knows a context before the
    token, and the share where its first proposal is the token."""
    known = right = total = 0
    for example in examples:
        ids, trained = example.input_ids.tolist(), example.loss_mask.tolist()
        for i in range(1, len(ids)):
            if not trained[i]:
                continue
            total += 1
            chain, _, _ = table.propose(ids[max(0, i - table.max_ngram):i], 1)  # all propose reads
            known += bool(chain)
            right += bool(chain) and chain[0] == ids[i]
    return {"held_out_known": known / total if total else 0.0, "held_out_right": right / total if total else 0.0}
