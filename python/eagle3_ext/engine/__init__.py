"""The speculative generator: ``SpeculativeGenerator`` and its options, the round it runs (drafting,
lookup, the target's verify forward and commit, tree verification in ``eagle3_ext.tree``), the
compile backends and the bench tools. docs/generation.md maps the modules."""

from ..capture import AuxHiddenCapture, find_decoder_layers
from .compile_options import CompileOptions
from .config import SamplingConfig, TreeConfig
from .generator import CaptureMismatchError, SpeculativeGenerateOutput, SpeculativeGenerator
from .stats import GenerationStats

__all__ = ["AuxHiddenCapture", "CaptureMismatchError", "CompileOptions", "GenerationStats", "SamplingConfig",
           "SpeculativeGenerateOutput", "SpeculativeGenerator", "TreeConfig", "find_decoder_layers"]
