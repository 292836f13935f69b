"""The per-row state of the requests still running in a batch, as one object with one ``select``.

Row r of every tensor here (the target's KV cache and committed lengths, the draft's KV cache, the
draft's pending inputs, the roots) belongs to request ``active[r]``. Finished requests leave the
batch through ``select``, which re-indexes all of them together, so that no piece can fall out of
step with the others. Compiled rounds shrink the batch to powers of two only: the rows left over
hold copies of running requests (``mirror``), whose outputs are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

import torch

from .drafting import DraftInputs
from .target import TargetRunner


@dataclass
class Rows:
    active: List[int]                          # the request of each row
    target: TargetRunner                       # the target's KV cache and committed lengths (seq_lens)
    draft_cache: Any = None                    # the draft's KV cache (eager or compiled), set by the prefill
    inputs: Optional[DraftInputs] = None       # the (feature, token) pairs the draft commits next round
    roots: Optional[torch.Tensor] = None       # [B] each row's last accepted token
    mirror: List[bool] = field(default_factory=list)   # whether a row copies another (its outputs dropped)
    mirror_mask: Optional[torch.Tensor] = None  # ``mirror`` as a bool tensor, while any row is one

    def __post_init__(self):
        if not self.mirror:
            self.mirror = [False] * len(self.active)

    def __len__(self) -> int:
        return len(self.active)

    @property
    def seq_lens(self) -> torch.Tensor:
        """[B] committed tokens per row (in both KV caches)."""
        return self.target.seq_lens

    @property
    def real(self) -> List[int]:
        """The rows that are not mirrors."""
        return [row for row in range(len(self)) if not self.mirror[row]]

    def select(self, keep: List[int], mirror: List[bool]) -> None:
        """Keeps rows ``keep`` (in that order; a row may repeat), ``mirror[i]`` saying whether the
        i-th kept row is a mirror."""
        rows = torch.tensor(keep, device=self.roots.device)
        self.target.select_rows(rows)
        self.draft_cache.select_rows(rows)
        self.inputs = DraftInputs(*(x.index_select(0, rows) for x in
                                    (self.inputs.features, self.inputs.tokens, self.inputs.positions,
                                     self.inputs.counts)))
        self.roots = self.roots.index_select(0, rows)
        self.active = [self.active[row] for row in keep]
        self.mirror = list(mirror)
        self.mirror_mask = torch.tensor(self.mirror, device=rows.device) if any(self.mirror) else None
