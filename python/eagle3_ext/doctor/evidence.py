"""Paired per-token evidence: is one way of feeding the draft better than another, with what
confidence.

Every candidate is measured on the same tokens, so the comparison is paired: per token, the
difference of the two candidates' losses (or top-1 hits). Neighbouring tokens are correlated,
so the standard error is taken over blocks of ``BLOCK_TOKENS`` consecutive scored tokens of a
sequence rather than over single tokens (a per-token standard error would overstate the
confidence).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Sequence

import torch

BLOCK_TOKENS = 16
Z_DECISIVE = 3.0   # |z| at or above this decides a comparison


@dataclass
class PairedDifference:
    mean: float     # mean per-token difference
    se: float       # its standard error (over blocks)
    tokens: int
    blocks: int

    @property
    def z(self) -> float:
        if self.se > 0:
            return self.mean / self.se
        return 0.0 if self.mean == 0 else math.copysign(float("inf"), self.mean)

    def tokens_to_decide(self) -> int:
        """About how many scored tokens would put |z| at Z_DECISIVE if the mean held."""
        z = abs(self.z)
        if z >= Z_DECISIVE:
            return self.tokens
        if z < 1e-3:
            return self.tokens * 1_000_000
        return int(math.ceil(self.tokens * (Z_DECISIVE / z) ** 2))


def paired_difference(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> PairedDifference:
    """Mean of a - b over per-sequence token values (1-D tensors of equal lengths, pairwise),
    with a block standard error."""
    block_means: List[float] = []
    total, count = 0.0, 0
    for xa, xb in zip(a, b):
        d = (xa.double() - xb.double())
        total += float(d.sum())
        count += d.numel()
        for start in range(0, d.numel(), BLOCK_TOKENS):
            block_means.append(float(d[start:start + BLOCK_TOKENS].mean()))
    if count == 0:
        return PairedDifference(0.0, 0.0, 0, 0)
    n = len(block_means)
    if n < 2:
        return PairedDifference(total / count, float("inf"), count, n)
    blocks = torch.tensor(block_means, dtype=torch.float64)
    return PairedDifference(total / count, float(blocks.std() / math.sqrt(n)), count, n)
