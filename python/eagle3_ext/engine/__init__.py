"""The speculative decoding loop, one module per step: capture -> fc -> draft tree -> verify ->
accept -> compact."""

from .capture import AuxHiddenCapture, find_decoder_layers

__all__ = ["AuxHiddenCapture", "find_decoder_layers"]
