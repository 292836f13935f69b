"""The examples a training run trained on and held out, read again after the run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

from .. import validation
from .data import load_examples
from .target_source import split_examples
from .trainer import TrainConfig


@dataclass
class TrainingSplit:
    """The examples a training run trained on, read again: the same data cut at the same length,
    the same ones held out (defaults are TrainConfig's), for what is derived from them after
    training (a smaller vocabulary, the n-gram table)."""

    target: str                 # the target's directory: only its tokenizer is read
    data: List[str]             # what the draft was trained on, as `eagle3 train --data` reads it
    max_len: int = TrainConfig.max_len
    val_examples: int = TrainConfig.val_max_examples
    seed: int = TrainConfig.seed
    val_fraction: float = TrainConfig.val_fraction

    def validate(self) -> None:
        """Raises TypeError / ValueError (FileNotFoundError for a missing path) naming the first bad field."""
        validation.existing_dir("target", self.target)
        validation.existing_files("data", self.data)
        validation.integer("max_len", self.max_len, 4)
        validation.integer("val_examples", self.val_examples, 1)
        validation.integer("seed", self.seed, 0, 2**63 - 1)
        validation.number("val_fraction", self.val_fraction, 0, 1, exclusive_minimum=True)

    def examples(self, tokenizer, vocab: int) -> Tuple[List, List]:
        """(train, validation) as the training run split them."""
        examples = load_examples(self.data, tokenizer, self.max_len, vocab)
        return split_examples(examples, self.val_fraction, self.val_examples, self.seed)
