"""Training EAGLE-3 draft heads: data, vocabulary mapping, training-time test, trainer."""

from .capture_cache import CaptureConfig, capture
from .regenerate import RegenerateConfig, regenerate
from .shrink_vocab import ShrinkVocabConfig, shrink_vocab
from .trainer import TrainConfig, TrainResult, Trainer, train
from .ttt import expected_acceptance_length, ttt_forward
from .vocab import build_vocab_mapping, shrink_draft_vocab

__all__ = ["CaptureConfig", "RegenerateConfig", "ShrinkVocabConfig", "TrainConfig", "TrainResult", "Trainer",
           "build_vocab_mapping", "capture", "expected_acceptance_length", "regenerate", "shrink_draft_vocab",
           "shrink_vocab", "train", "ttt_forward"]
