"""Where the trainer gets the target's side of a batch: the captured aux hidden states and the
target's logits (as a TargetView). ``OnlineTarget`` runs the target on every batch (a whole copy
per process, or sharded with tensor parallelism); ``train/cache.py``'s ``CachedTarget`` reads
what ``eagle3 train capture`` wrote, with no target in memory. Both give the trainer the same
interface, so one training loop serves both."""

from __future__ import annotations

import random
from contextlib import contextmanager
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from ..decoding.capture import AuxHiddenCapture
from ..distributed import tp
from ..draft import eagle_default_aux_layers, fingerprint
from ..draft.aux_layers import target_dims
from ..errors import BadInputError
from ..preflight.loading import check_context, load_target, load_tokenizer
from .data import Example, collate, load_examples
from .ttt import TargetView, target_pass
from .vocab import build_vocab_mapping, trained_token_counts


def split_examples(examples: Sequence[Example], val_fraction: float, val_max_examples: int,
                   seed: int) -> Tuple[List[Example], List[Example]]:
    """(train, validation): a seeded shuffle, at most ``val_max_examples`` held out."""
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    n_val = min(val_max_examples, max(1, int(round(len(examples) * val_fraction))))
    n_val = n_val if len(examples) > 1 else 0
    train = [examples[i] for i in order[n_val:]]
    if not train:
        raise BadInputError("no training examples left after the validation split")
    return train, [examples[i] for i in order[:n_val]]


def vocab_mapping_for(train_set: Sequence[Example], vocab: int, draft_vocab_size: int):
    """The draft vocabulary (d2t, t2d): the most frequent trained-on tokens of the training split."""
    return build_vocab_mapping(trained_token_counts(train_set, vocab), draft_vocab_size)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A plain, whole tensor from a (possibly sharded) DTensor parameter."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


class OnlineTarget:
    """The target model itself: ``tp_size`` > 1 shards it over the ranks of a tensor-parallel
    group (transformers' plan); its captured states and logits are full width on every rank."""

    def __init__(self, path: str, dtype: torch.dtype, max_len: int, layout, device=None):
        self.path = path
        if layout.tp_size > 1:  # (transformers places the shards on the local rank's device)
            self.model = tp.load_target(path, dtype, tp_size=layout.tp_size, dp_replicate=layout.dp_size)
        else:
            self.model = load_target(path, dtype, shard=False)  # data parallel: a whole copy per process
            if device is not None:
                self.model.to(device)
        self.model.eval().requires_grad_(False)
        self.tokenizer = load_tokenizer(path)
        self.config = self.model.config
        self.num_layers, _, self.vocab = target_dims(self.config)
        if len(self.tokenizer) > self.vocab:
            raise BadInputError(f"the tokenizer has {len(self.tokenizer)} tokens but the target's vocabulary is "
                                f"{self.vocab}")
        check_context(self.model, "max_len", max_len)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.capture = None
        self.d2t = None

    @property
    def architectures(self) -> List[str]:
        return list(getattr(self.config, "architectures", None) or [])

    def default_aux_layers(self) -> List[int]:
        return list(eagle_default_aux_layers(self.num_layers))

    def load(self, data: Sequence[str], max_len: int) -> List[Example]:
        return load_examples(data, self.tokenizer, max_len, vocab_size=self.vocab)

    def embeddings(self) -> nn.Module:
        """The input embedding the draft reads: the target's own module, or under tensor
        parallelism a whole local copy (the draft runs alone on each rank, outside the
        target's collectives)."""
        emb = self.model.get_input_embeddings()
        if hasattr(emb.weight, "full_tensor"):
            return nn.Embedding.from_pretrained(full_tensor(emb.weight.detach()).clone(), freeze=True)
        return emb

    def head_rows(self, ids: torch.Tensor, dtype: Optional[torch.dtype] = torch.float32):
        """The lm_head rows of ``ids`` (in ``dtype``; None: the head's own), or None when the
        target has no output embedding."""
        head = self.model.get_output_embeddings()
        if head is None:
            return None
        rows = full_tensor(head.weight.detach())[ids]
        return rows if dtype is None else rows.to(dtype)

    def head_bias(self, ids: torch.Tensor):
        """The lm_head bias of ``ids`` in the head's dtype, or None when it has none."""
        bias = getattr(self.model.get_output_embeddings(), "bias", None)
        return None if bias is None else full_tensor(bias.detach())[ids]

    @contextmanager
    def recording_head_input(self):
        """Within the block, each forward's lm_head input (whole under tensor parallelism) is
        appended to the yielded list."""
        inputs: List[torch.Tensor] = []
        head = self.model.get_output_embeddings()
        hook = None if head is None else head.register_forward_pre_hook(
            lambda module, args: inputs.append(full_tensor(args[0]).detach()))
        try:
            yield inputs
        finally:
            if hook is not None:
                hook.remove()

    def final_norm(self):
        norm = getattr(getattr(self.model, "model", None), "norm", None)
        weight = getattr(norm, "weight", None)
        return None if weight is None else full_tensor(weight.detach()).float()

    def fingerprint(self, aux_layer_ids: Sequence[int], sequences) -> Dict[str, Any]:
        probe = fingerprint.probe_from_sequences(sequences)
        return fingerprint.record(self.model, aux_layer_ids, probe)

    def start(self, aux_layer_ids: Sequence[int], d2t: torch.Tensor) -> None:
        self.capture = AuxHiddenCapture(self.model, aux_layer_ids).attach()
        self.d2t = d2t

    def batch(self, examples: Sequence[Example], device, state_dtype: torch.dtype = torch.float32) -> tuple:
        """(input_ids, loss_mask, valid, aux states in ``state_dtype``, TargetView) of a
        right-padded batch."""
        ids, loss_mask, valid = (t.to(device) for t in collate(examples, self.pad_id))
        logits, aux = target_pass(self.model, self.capture, ids, valid, state_dtype)
        return ids, loss_mask, valid, aux, TargetView.from_logits(full_tensor(logits), self.d2t)
