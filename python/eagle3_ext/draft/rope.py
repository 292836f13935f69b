"""Rotary position embedding for the draft, including Llama-3 and linear rope scaling."""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import torch


def rope_inv_freq(head_dim: int, theta: float, scaling: Optional[Dict[str, Any]]) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2] (fp32), scaled as ``scaling`` says."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if rope_type == "linear":
        inv_freq = inv_freq / float(scaling["factor"])
    elif rope_type == "llama3":
        factor = float(scaling["factor"])
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_context = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        # Long wavelengths are slowed by `factor`, short ones kept, the band between blended.
        scaled = torch.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
        smooth = (old_context / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_context / high) & (wavelen <= old_context / low)
        inv_freq = torch.where(medium, blended, scaled)
    return inv_freq.float()


def rope_cos_sin(inv_freq: torch.Tensor, position_ids: torch.Tensor,
                 dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [B, T, head_dim] for positions [B, T] (rotate-half layout)."""
    freqs = position_ids.to(torch.float32)[..., None] * inv_freq.to(position_ids.device)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, heads, head_dim] rotated by cos/sin [B, T, head_dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, :, None, :] + rotated * sin[:, :, None, :]
