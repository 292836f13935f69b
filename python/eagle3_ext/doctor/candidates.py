"""The plausible ways a draft gets fed other states or another convention than it was trained
with: the doctor measures each against the configured setup."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..draft import Eagle3DraftModel, eagle_default_aux_layers


@dataclass
class Setup:
    """A candidate setup: the layers read and the convention flags that differ from the draft's."""

    name: str
    aux_layer_ids: List[int]
    flags: Dict[str, bool] = field(default_factory=dict)

    @property
    def is_capture(self) -> bool:
        return not self.flags


def candidate_layer_sets(configured: Optional[Sequence[int]], k: int, num_layers: int) -> List[Tuple[str, List[int]]]:
    """The configured ids and the plausible capture mix-ups, each with k ids within [0, L]:
    every id shifted by one either way, the order reversed, the embedding output swapped in for
    the lowest layer, or (when it is configured) swapped out for each plausible layer, and
    EAGLE's default."""
    out: List[Tuple[str, List[int]]] = []
    if configured:
        c = list(configured)
        out += [("configured", c), ("shifted -1", [i - 1 for i in c]), ("shifted +1", [i + 1 for i in c]),
                ("reversed", c[::-1])]
        if 0 in c:
            rest = [i for i in c if i != 0]
            out.append(("embedding output removed", rest))
            out.append(("embedding removed, shifted +1", [i + 1 for i in rest]))
            for i in range(1, min(rest + [num_layers + 1])):
                out.append((f"embedding output replaced by {i}", sorted([i] + rest)))
        else:
            out.append(("embedding output added", [0] + c))
            out.append(("embedding output in place of the lowest layer", [0] + sorted(c)[1:]))
    if num_layers >= 4:
        out.append(("EAGLE default", list(eagle_default_aux_layers(num_layers))))
    seen, kept = set(), []
    for name, ids in out:
        key = tuple(ids)
        if len(ids) == k and all(0 <= i <= num_layers for i in ids) and key not in seen:
            seen.add(key)
            kept.append((name, ids))
    return kept


def flag_setups(draft: Eagle3DraftModel, ids: Sequence[int]) -> List[Setup]:
    """The draft's convention flags flipped one at a time (the ones a serving stack gets wrong
    without a word): the residual convention, the fed-back state, the final norm, and a norm
    before the fc that its weights say exists being left out."""
    cfg = draft.config
    ids = list(ids)
    out = [Setup("norm_before_residual flipped", ids, {"norm_before_residual": not cfg.norm_before_residual})]
    if cfg.final_norm:
        out.append(Setup("norm_output flipped", ids, {"norm_output": not cfg.norm_output}))
    if not cfg.norm_output:
        out.append(Setup("final_norm flipped", ids, {"final_norm": not cfg.final_norm}))
    if cfg.fc_norm:
        out.append(Setup("fc_norm ignored", ids, {"fc_norm": False}))
    if cfg.norm_before_fc:
        out.append(Setup("norm_before_fc ignored", ids, {"norm_before_fc": False}))
    return out


def variant(draft: Eagle3DraftModel, setup: Setup) -> Eagle3DraftModel:
    """A copy of ``draft`` that reads ``setup``'s layers with its flags (weights shared)."""
    model = copy.copy(draft)  # shallow: shares parameters and submodules
    model.config = copy.copy(draft.config)
    model.config.aux_layer_ids = list(setup.aux_layer_ids)
    model.config.fingerprint = None  # a deliberate variant: the capture guard has nothing to say
    for key, value in setup.flags.items():
        setattr(model.config, key, value)
    if "norm_before_residual" in setup.flags:
        layers = [copy.copy(layer) for layer in draft.layers]
        for layer in layers:
            layer.norm_before_residual = setup.flags["norm_before_residual"]
        model._modules = dict(draft._modules)
        model._modules["layers"] = type(draft.layers)(layers)
    if setup.flags.get("fc_norm") is False:
        model._modules = dict(model._modules)
        model._modules["fc_norm"] = None
    if setup.flags.get("norm_before_fc") is False:
        model._modules = dict(model._modules)
        model._modules["input_norm"] = None
    return model
