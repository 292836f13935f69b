"""Training EAGLE-3 draft heads: data, vocabulary mapping, training-time test, trainer."""

from .trainer import TrainConfig, Trainer, TrainResult, train
from .ttt import expected_acceptance_length, ttt_forward
from .vocab import build_vocab_mapping

__all__ = ["TrainConfig", "TrainResult", "Trainer", "build_vocab_mapping", "expected_acceptance_length",
           "train", "ttt_forward"]
