"""Pure-PyTorch definitions of what every eagle3 op computes.

These are the ground truth that the tests compare the C++ and CUDA kernels against and the
baselines that the benchmarks time. They favour clarity over speed.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F


def fused_aux_fc(
    aux_hidden: Sequence[torch.Tensor], weight: torch.Tensor, bias: Optional[torch.Tensor]
) -> torch.Tensor:
    """cat(aux_hidden, -1) @ weight.T (+ bias), computed in fp32, returned in the input dtype."""
    x = torch.cat(list(aux_hidden), dim=-1)
    out = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    return out.to(aux_hidden[0].dtype)


def cat_linear(
    aux_hidden: Sequence[torch.Tensor], weight: torch.Tensor, bias: Optional[torch.Tensor]
) -> torch.Tensor:
    """The unfused baseline an engine would otherwise run: torch.cat + F.linear in the input dtype."""
    return F.linear(torch.cat(list(aux_hidden), dim=-1), weight, bias)
