"""EAGLE-3 draft head, its checkpoint formats and the aux-layer convention."""

from . import fingerprint
from .aux_layers import (AuxLayerResolution, check_aux_layers, eagle_default_aux_layers,
                         resolve_aux_layer_ids)
from .cache import DraftKVCache
from .config import Eagle3DraftConfig
from .model import Eagle3DraftModel, Eagle3DraftOutput

__all__ = [
    "AuxLayerResolution", "DraftKVCache", "Eagle3DraftConfig", "Eagle3DraftModel", "Eagle3DraftOutput",
    "check_aux_layers", "eagle_default_aux_layers", "fingerprint", "resolve_aux_layer_ids",
]
