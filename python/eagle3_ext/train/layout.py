"""How ``eagle3 train`` lays its processes out: the target sharded over ``tp_size`` ranks
(tensor parallelism, transformers' plan) and the draft replicated over the rest (data
parallelism).

World rank r is tensor-parallel rank ``r % tp_size`` of data-parallel replica ``r // tp_size``,
the layout transformers' device mesh (pp, dp_replicate, fsdp, tp) gives the target: the ranks
of one TP group are neighbours (one node, fast links) and hold the same examples; a DP group
holds the ranks with the same TP rank, one per replica, and sums the draft's gradients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch.distributed as dist

from ..distributed import tp
from ..errors import BadInputError


@dataclass
class TrainLayout:
    tp_size: int = 1
    dp_size: int = 1
    rank: int = 0                  # in the world
    dp_group: Optional[object] = None  # this rank's data-parallel process group (None: the world)

    @property
    def world(self) -> int:
        return self.tp_size * self.dp_size

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp_size

    @property
    def dp_rank(self) -> int:
        return self.rank // self.tp_size

    def describe(self) -> str:
        return f"TP {self.tp_size} x DP {self.dp_size}"


def make_layout(tp_size: int = 1) -> TrainLayout:
    """The layout of the current process group (one process outside torchrun). Every rank must
    call this, in the same order, since it creates the data-parallel groups."""
    world, rank = tp.world_size(), tp.rank()
    if tp_size < 1 or world % tp_size:
        raise BadInputError(f"tp_size must divide the number of processes ({world}), got {tp_size}")
    dp_size = world // tp_size
    if tp_size == 1:
        return TrainLayout(1, dp_size, rank, None)
    group = None
    for t in range(tp_size):  # new_group is collective: every rank creates every group
        members = list(range(t, world, tp_size))
        made = dist.new_group(members)
        if rank in members:
            group = made
    return TrainLayout(tp_size, dp_size, rank, group)
