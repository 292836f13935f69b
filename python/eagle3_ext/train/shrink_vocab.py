"""``eagle3 train shrink-vocab``: a trained draft with a smaller vocabulary, without training again.

The draft's lm_head is most of what a draft step reads (SmolLM2's draft: 9.4M of 14.5M weights at
16384 tokens), while the rare tokens at the tail of a large draft vocabulary are seldom what the
draft proposes correctly. Cutting the vocabulary to the most frequent tokens of the data it was
trained on keeps every kept token's logit, so the cost in acceptance is measured, not guessed
(``eagle3 bench`` on the two drafts), and the draft's steps get cheaper.

The tokens are counted as ``eagle3 train`` counts them for its own vocabulary: the loss-masked
tokens of the training split (the same validation split: ``val_examples``, ``seed``), so a draft
trained at a larger size and shrunk gets the vocabulary a run at the smaller size would have
chosen. The report gives the share of those tokens, and of the held-out split's, inside the
vocabulary before and after.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict

import torch

from .. import validation
from ..draft import Eagle3DraftModel
from ..errors import BadInputError
from ..preflight.loading import check_draft_dir, check_target_dir, load_tokenizer
from .training_split import TrainingSplit
from .vocab import shrink_draft_vocab, trained_token_counts


@dataclass(kw_only=True)
class ShrinkVocabConfig(TrainingSplit):
    draft: str                  # the trained draft's directory
    draft_vocab_size: int
    out: str

    def validate(self) -> None:
        """Raises TypeError / ValueError (FileNotFoundError for a missing path) naming the first
        bad field. The draft vocabulary size is checked against the draft once it is loaded."""
        validation.existing_dir("draft", self.draft)
        super().validate()
        validation.integer("draft_vocab_size", self.draft_vocab_size, 1)
        validation.output_dir("out", self.out)


def _coverage(counts: torch.Tensor, t2d: torch.Tensor) -> float:
    total = int(counts.sum())
    return float(counts[t2d].sum()) / total if total else 0.0


def shrink_vocab(config: ShrinkVocabConfig) -> Dict[str, Any]:
    """Writes the shrunk draft to ``config.out`` (in the draft's dtype and format) and returns
    the sizes and coverages."""
    config.validate()
    check_draft_dir(config.draft)
    check_target_dir(config.target)
    draft = Eagle3DraftModel.from_pretrained(config.draft)
    vocab = draft.t2d.numel()
    tokenizer = load_tokenizer(config.target)
    if len(tokenizer) > vocab:
        raise BadInputError(f"target {config.target}: its tokenizer has {len(tokenizer)} tokens but the "
                            f"draft's vocabulary map covers {vocab}: the draft was trained for another target")
    train, val = config.examples(tokenizer, vocab)
    counts, val_counts = trained_token_counts(train, vocab), trained_token_counts(val, vocab)
    before = draft.config.draft_vocab_size
    coverage_before = (_coverage(counts, draft.t2d), _coverage(val_counts, draft.t2d))
    head_bytes_before = draft.lm_head.weight.nbytes
    shrink_draft_vocab(draft, counts, config.draft_vocab_size)
    draft.save_pretrained(config.out)
    return {"out": config.out, "draft_vocab_size": [before, config.draft_vocab_size],
            "train_coverage": [coverage_before[0], _coverage(counts, draft.t2d)],
            "val_coverage": [coverage_before[1], _coverage(val_counts, draft.t2d)],
            "lm_head_mib": [head_bytes_before / 2**20, draft.lm_head.weight.nbytes / 2**20],
            "train_examples": len(train), "val_examples": len(val)}
