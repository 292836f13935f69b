"""The speculative decoding loop, one module per step: capture -> fc -> draft tree -> verify ->
accept -> compact."""

from .capture import AuxHiddenCapture, find_decoder_layers
from .compile_options import CompileOptions
from .config import SamplingConfig, TreeConfig
from .generator import CaptureMismatchError, SpeculativeGenerateOutput, SpeculativeGenerator
from .stats import GenerationStats

__all__ = ["AuxHiddenCapture", "CaptureMismatchError", "CompileOptions", "GenerationStats", "SamplingConfig",
           "SpeculativeGenerateOutput", "SpeculativeGenerator", "TreeConfig", "find_decoder_layers"]
