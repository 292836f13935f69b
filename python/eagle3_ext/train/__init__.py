"""Training EAGLE-3 draft heads: data, vocabulary mapping, training-time test, trainer."""

from .capture_cache import CaptureConfig, capture
from .lookup_ngrams import NgramsConfig, count_lookup_ngrams
from .regenerate import RegenerateConfig, regenerate
from .shrink_vocab import ShrinkVocabConfig, shrink_vocab
from .trainer import TrainConfig, TrainResult, Trainer, train
from .training_split import TrainingSplit
from .ttt import expected_acceptance_length, ttt_forward
from .vocab import build_vocab_mapping, shrink_draft_vocab

__all__ = ["CaptureConfig", "NgramsConfig", "RegenerateConfig", "ShrinkVocabConfig", "TrainConfig", "TrainResult",
           "Trainer", "TrainingSplit", "build_vocab_mapping", "capture", "count_lookup_ngrams",
           "expected_acceptance_length", "regenerate", "shrink_draft_vocab", "shrink_vocab", "train", "ttt_forward"]
