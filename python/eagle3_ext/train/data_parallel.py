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
"""

from __future__ import annotations

from typing import Iterable, List, Sequence, TypeVar

import torch
import torch.distributed as dist

from ..distributed import tp

T = TypeVar("T")


class DataParallel:
    """The current process group seen as data-parallel ranks (one rank outside torchrun)."""

    def __init__(self):
        self.rank = tp.rank()
        self.world = tp.world_size()

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def local(self, batch: Sequence[T]) -> List[T]:
        """This rank's examples of a global batch."""
        return list(batch[self.rank::self.world]) if self.enabled else list(batch)

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over the ranks, in place (returned for chaining)."""
        if self.enabled:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
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
        dist.all_reduce(has_grad, op=dist.ReduceOp.SUM)
        params = [p for p, n in zip(params, has_grad.tolist()) if n]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
            offset += n

    def broadcast_module(self, module: torch.nn.Module) -> None:
        """Rank 0's parameters and buffers on every rank (one starting point for the replicas)."""
        if self.enabled:
            for tensor in module.state_dict().values():
                dist.broadcast(tensor, src=0)

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()
