"""The user API: ``SpeculativeGenerator`` (``generator``) with Hugging Face's ``generate`` contract,
its options (``config``: the tree and sampling; ``settings``: one call's resolved settings), the
inputs it takes (``inputs``), stopping (``stopping``), logits processors at every tree node
(``processors``), what it measured (``stats``) and the ``custom_generate`` entry for
``model.generate`` (``custom_generate``). The round it runs is ``eagle3_ext.decoding``; its
compiled graphs ``eagle3_ext.compiled``."""

from ..compiled.options import CompileOptions
from ..decoding.capture import AuxHiddenCapture, find_decoder_layers
from .config import SamplingConfig, TreeConfig
from .generator import CaptureMismatchError, SpeculativeGenerateOutput, SpeculativeGenerator
from .stats import GenerationStats

__all__ = ["AuxHiddenCapture", "CaptureMismatchError", "CompileOptions", "GenerationStats", "SamplingConfig",
           "SpeculativeGenerateOutput", "SpeculativeGenerator", "TreeConfig", "find_decoder_layers"]
