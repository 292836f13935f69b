"""The offline training cache: what ``eagle3 train capture`` writes and ``eagle3 train
--from-cache`` reads, so a draft trains any number of epochs with no target in memory.

Layout of a cache directory:

- ``manifest.json``: the options the cache was captured with (they fix the examples, the
  validation split, the aux layers and the draft vocabulary), the target's name, shapes and
  fingerprint, and one entry per example: split, shard file, key, length.
- ``target_config/``: the target's config (the draft is shaped from it).
- ``target_parts.safetensors``: the few target weights the draft needs: the input embedding,
  the lm_head rows of the draft vocabulary and the final norm, with d2t / t2d.
- ``shard-*.safetensors``: per example ``KEY.input_ids`` [T], ``KEY.loss_mask`` [T],
  ``KEY.aux`` [k, T, H] (the captured states, in the target's dtype), ``KEY.top`` [T] (the
  target's top token over its whole vocabulary) and either ``KEY.head_in`` [T, H] (the lm_head's
  input: the draft-vocabulary logits are recomputed from it exactly, at H values per token) or
  ``KEY.draft_logits`` [T, Vd] fp32 (for heads that are more than one linear map, e.g. logit
  soft-capping).
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Sequence, Tuple

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

from ..dtypes import DTYPES
from ..errors import BadInputError
from .data import Example
from .ttt import TargetView

FORMAT = "eagle3-train-cache"
VERSION = 1
MANIFEST = "manifest.json"
PARTS = "target_parts.safetensors"
CONFIG_DIR = "target_config"

# What a cache fixes; TrainConfig fields of the same name must agree with it.
CAPTURE_FIELDS = ("aux_layers", "draft_vocab_size", "max_len", "dtype", "val_fraction", "val_max_examples")


def bytes_per_token(num_aux: int, hidden: int, draft_vocab: int, dtype_bytes: int, head: str) -> int:
    """Cache bytes per token: the aux states, the head's input or the draft-vocabulary logits,
    the token, its mask and the target's top token."""
    head_bytes = hidden * dtype_bytes if head == "hidden" else draft_vocab * 4
    return num_aux * hidden * dtype_bytes + head_bytes + 8 + 1 + 8


def read_manifest(cache: str) -> Dict[str, Any]:
    path = os.path.join(cache, MANIFEST)
    if not os.path.isfile(path):
        raise BadInputError(f"from_cache {cache} is not a training cache: it has no {MANIFEST} (write one with "
                            "`eagle3 train capture`)")
    with open(path) as f:
        try:
            manifest = json.load(f)
        except json.JSONDecodeError as e:
            raise BadInputError(f"from_cache: {path} is not valid JSON ({e.msg})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BadInputError(f"from_cache: {path} is not an {FORMAT} manifest")
    if manifest.get("version") != VERSION:
        raise BadInputError(f"from_cache: {path} is version {manifest.get('version')}, this library reads version "
                            f"{VERSION}; capture it again")
    missing = [name for name in {e["shard"] for e in manifest["examples"]} | {PARTS}
               if not os.path.isfile(os.path.join(cache, name))]
    if missing:
        raise BadInputError(f"from_cache {cache}: files listed in the manifest are missing: {sorted(missing)}")
    return manifest


class CachedTarget:
    """The target's side of training read from a cache (see the module docstring)."""

    def __init__(self, cache: str):
        from transformers import AutoConfig

        self.path = cache
        self.manifest = read_manifest(cache)
        m = self.manifest
        self.config = AutoConfig.from_pretrained(os.path.join(cache, CONFIG_DIR))
        self.parts = load_file(os.path.join(cache, PARTS))
        self.dtype = DTYPES[m["dtype"]]
        self.vocab, self.num_layers, self.pad_id = m["vocab_size"], m["num_hidden_layers"], m["pad_id"]
        self.architectures = list(m.get("architectures") or [])
        self._shards: Dict[str, Any] = {}

    @property
    def target_name(self) -> str:
        return self.manifest["target"]

    def default_aux_layers(self) -> List[int]:
        return list(self.manifest["aux_layer_ids"])

    def split(self) -> Tuple[List[Example], List[Example]]:
        """(train, validation) examples in the order capture wrote them (the trainer's order)."""
        train, val = [], []
        for entry in self.manifest["examples"]:
            tensors = self._read(entry["shard"], entry["key"], ("input_ids", "loss_mask"))
            example = Example(tensors[0].long(), tensors[1].bool(), cached=(entry["shard"], entry["key"]))
            (train if entry["split"] == "train" else val).append(example)
        return train, val

    def embeddings(self) -> nn.Module:
        return nn.Embedding.from_pretrained(self.parts["embed"], freeze=True)

    def vocab_mapping(self) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.parts["d2t"], self.parts["t2d"].bool()

    def head_rows(self, ids: torch.Tensor):
        rows = self.parts.get("head_rows")
        return None if rows is None else rows.float()

    def final_norm(self):
        norm = self.parts.get("final_norm")
        return None if norm is None else norm.float()

    def fingerprint(self, aux_layer_ids: Sequence[int], sequences) -> Dict[str, Any]:
        return self.manifest["fingerprint"]

    def start(self, aux_layer_ids: Sequence[int], d2t: torch.Tensor) -> None:
        if list(aux_layer_ids) != list(self.manifest["aux_layer_ids"]):
            raise BadInputError(f"the draft reads aux layers {list(aux_layer_ids)} but the cache {self.path} holds "
                                f"layers {self.manifest['aux_layer_ids']}")
        if not torch.equal(d2t.cpu(), self.parts["d2t"]):
            raise BadInputError(f"the draft's vocabulary (d2t) differs from the one the cache {self.path} was captured "
                                "with; train from the same cache it started with")

    def _read(self, shard: str, key: str, names: Sequence[str]) -> List[torch.Tensor]:
        handle = self._shards.get(shard)
        if handle is None:
            handle = self._shards[shard] = safe_open(os.path.join(self.path, shard), framework="pt")
        return [handle.get_tensor(f"{key}.{name}") for name in names]

    def batch(self, examples: Sequence[Example], device) -> tuple:
        """What OnlineTarget.batch returns, read from the cache and right-padded."""
        head = self.manifest["head"]
        b, t = len(examples), max(e.input_ids.numel() for e in examples)
        k, hidden = len(self.manifest["aux_layer_ids"]), self.manifest["hidden_size"]
        ids = torch.full((b, t), self.pad_id, dtype=torch.int64)
        loss_mask = torch.zeros(b, t, dtype=torch.bool)
        valid = torch.zeros(b, t, dtype=torch.bool)
        aux = torch.zeros(k, b, t, hidden, dtype=self.dtype)
        top = torch.zeros(b, t, dtype=torch.int64)
        width = hidden if head == "hidden" else self.parts["d2t"].numel()
        head_values = torch.zeros(b, t, width, dtype=self.dtype if head == "hidden" else torch.float32)
        for i, e in enumerate(examples):
            n = e.input_ids.numel()
            a, tp, h = self._read(*e.cached, ("aux", "top", "head_in" if head == "hidden" else "draft_logits"))
            ids[i, :n], loss_mask[i, :n], valid[i, :n] = e.input_ids, e.loss_mask, True
            aux[:, i, :n], top[i, :n], head_values[i, :n] = a, tp, h
        if head == "hidden":
            # The lm_head restricted to the draft vocabulary, in the target's dtype as online.
            rows = self.parts["head_rows"].to(device)
            bias = self.parts.get("head_bias")
            draft_logits = F.linear(head_values.to(device), rows, None if bias is None else bias.to(device)).float()
        else:
            draft_logits = head_values.to(device)
        view = TargetView(top=top.to(device), draft_logits=draft_logits)
        return (ids.to(device), loss_mask.to(device), valid.to(device), [x.to(device).float() for x in aux.unbind(0)],
                view)
