"""Capture of the target hidden states an EAGLE-3 draft reads, through forward hooks.

Index i (internal convention) is the input of decoder layer i, i.e. the embedding output for
i = 0 and the output of decoder layer i - 1 otherwise; index L (the number of layers) is the
raw output of the last decoder layer, before the final norm. Hooks cost nothing beyond the
tensors kept, unlike output_hidden_states, which keeps every layer.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import torch
from torch import nn

from ..errors import BadInputError


def find_decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layer list of a Hugging Face causal LM, or a clear error."""
    candidates = []
    inner = getattr(model, "model", None)
    if inner is not None:
        candidates.append(getattr(inner, "layers", None))
        candidates.append(getattr(getattr(inner, "language_model", None), "layers", None))
    if hasattr(model, "get_decoder"):
        try:
            candidates.append(getattr(model.get_decoder(), "layers", None))
        except (AttributeError, NotImplementedError):
            pass
    for layers in candidates:
        if isinstance(layers, nn.ModuleList) and len(layers) > 0:
            return layers
    raise BadInputError(
        f"unsupported architecture {type(model).__name__}: eagle3_ext captures aux hidden states with hooks on "
        "the decoder layers at model.model.layers (or get_decoder().layers), and this model has no such list")


class AuxHiddenCapture:
    """Hooks on ``model``'s decoder layers that keep the hidden states at ``aux_layer_ids``.

    Use as a context manager around target forwards; ``take()`` returns the captured states of
    the last forward, [B, T, H] each, in the order of ``aux_layer_ids``.
    """

    def __init__(self, model: nn.Module, aux_layer_ids: Sequence[int]):
        self.layers = find_decoder_layers(model)
        num_layers = len(self.layers)
        bad = [i for i in aux_layer_ids if not 0 <= int(i) <= num_layers]
        if bad:
            raise BadInputError(f"aux layer ids {list(aux_layer_ids)} include {bad}, outside [0, {num_layers}] for "
                                f"a target with {num_layers} decoder layers")
        self.ids = [int(i) for i in aux_layer_ids]
        self.num_layers = num_layers
        self._states: Dict[int, torch.Tensor] = {}
        self._handles: List[torch.utils.hooks.RemovableHandle] = []

    def _store(self, index: int, value) -> None:
        self._states[index] = value[0] if isinstance(value, (tuple, list)) else value

    def attach(self) -> "AuxHiddenCapture":
        if self._handles:
            return self
        for index in sorted(set(self.ids)):
            if index < self.num_layers:
                def pre_hook(module, args, kwargs, index=index):
                    self._store(index, args[0] if args else kwargs["hidden_states"])
                self._handles.append(self.layers[index].register_forward_pre_hook(pre_hook, with_kwargs=True))
            else:
                def hook(module, args, output, index=index):
                    self._store(index, output)
                self._handles.append(self.layers[index - 1].register_forward_hook(hook))
        return self

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._states.clear()

    def take(self) -> List[torch.Tensor]:
        missing = [i for i in self.ids if i not in self._states]
        if missing:
            raise RuntimeError(f"aux hidden states {missing} were not captured: no target forward ran with the "
                               "capture attached")
        states = [self._states[i] for i in self.ids]
        self._states.clear()
        return states

    def __enter__(self) -> "AuxHiddenCapture":
        return self.attach()

    def __exit__(self, *exc) -> None:
        self.detach()
