"""Training EAGLE-3 draft heads: data, vocabulary mapping, training-time test, trainer."""

from .capture_cache import CaptureConfig, capture
from .regenerate import RegenerateConfig, regenerate
from .trainer import TrainConfig, TrainResult, Trainer, train
from .ttt import expected_acceptance_length, ttt_forward
from .vocab import build_vocab_mapping

__all__ = ["CaptureConfig", "RegenerateConfig", "TrainConfig", "TrainResult", "Trainer", "build_vocab_mapping",
           "capture", "expected_acceptance_length", "regenerate", "train", "ttt_forward"]
