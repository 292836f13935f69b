"""Data parallelism for ``eagle3 train`` under torchrun (gloo on CPU, NCCL on CUDA).

Every rank holds the whole target and a replica of the draft, and reads the same global batches
as a single process would (the same shuffles, the same batch boundaries). Rank r takes the
examples ``r, r + W, ...`` of each batch. The per-step loss normalisers (how many positions each
TTT step scores) are summed over the ranks before the loss is formed, so each rank's loss is its
share of the single-process loss. The gradients are then summed, not averaged: the sum of the
shares' gradients is the single-process gradient. Clipping and AdamW see the same gradient on
every rank, so the replicas stay equal step after step. Global batch size, learning rate and
schedule do not depend on the world size, and a checkpoint written at one world size resumes at
any other.

A rank with no example in a batch (fewer examples than ranks) still joins every collective,
with zero counts and zero gradients.

With the target under tensor parallelism (train/layout.py) the data-parallel ranks are the
replicas, one group per TP rank: the ranks of a TP group hold the same examples, compute the
same draft gradients, and each sums them with its counterparts in the other replicas.
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Sequence, TypeVar

import torch
import torch.distributed as dist

from ..distributed import tp
from .layout import TrainLayout

T = TypeVar("T")


class DataParallel:
    """The data-parallel ranks of ``layout`` (default: every process of the current group is
    one; one rank outside torchrun). ``rank`` and ``world`` count replicas; ``is_main`` is world
    rank 0, the one process that writes files."""

    def __init__(self, layout: Optional[TrainLayout] = None):
        layout = layout or TrainLayout(1, tp.world_size(), tp.rank(), None)
        self.rank = layout.dp_rank
        self.world = layout.dp_size
        self.group = layout.dp_group
        self.is_main = layout.rank == 0
        self.processes = layout.world

    @property
    def enabled(self) -> bool:
        return self.world > 1

    def local(self, batch: Sequence[T]) -> List[T]:
        """This rank's examples of a global batch."""
        return list(batch[self.rank::self.world]) if self.enabled else list(batch)

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over the ranks, in place (returned for chaining)."""
        if self.enabled:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
        return tensor

    def sum_gradients(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Sums every parameter's gradient over the ranks in one flat all-reduce. A parameter
        without a gradient on this rank contributes zeros and gets the sum; one without a
        gradient on every rank keeps none, so the optimizer skips it as a single process would."""
        if not self.enabled:
            return
        params = [p for p in params if p.requires_grad]
        if not params:
            return
        has_grad = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=params[0].device)
        dist.all_reduce(has_grad, op=dist.ReduceOp.SUM, group=self.group)
        params = [p for p, n in zip(params, has_grad.tolist()) if n]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
            offset += n

    def broadcast_module(self, module: torch.nn.Module) -> None:
        """World rank 0's parameters and buffers on every process (one starting point)."""
        if self.processes > 1:
            for tensor in module.state_dict().values():
                dist.broadcast(tensor, src=0)

    def barrier(self) -> None:
        """Every process of the world (not only the replicas) waits here."""
        if self.processes > 1:
            dist.barrier()
