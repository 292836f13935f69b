"""The draft's own KV cache: a committed prefix per request, then uncommitted tree tokens."""

from __future__ import annotations

from typing import Callable, Hashable, List, Optional, Sequence

import torch

# allocate(name, shape, dtype) -> a zeroed tensor: where a cache's tensors come from
Allocate = Callable[[Hashable, Sequence[int], torch.dtype], torch.Tensor]


def compact_rows(t: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``t``'s rows at ``keep`` moved to its first ``len(keep)`` rows, in place; returns that view
    (the same address as ``t``). A static-address mark of ``t`` carries over to the view."""
    view = t[:keep.shape[0]].copy_(t.index_select(0, keep))
    kind = getattr(t, "_dynamo_static_input_type", None)
    if kind is not None:
        torch._dynamo.mark_static_address(view, guard=kind == "guarded")
    return view


class DraftKVCache:
    """Preallocated keys/values per draft layer, [B, capacity, Hkv, D] each.

    Request b holds ``prefix_lens[b]`` committed tokens at positions [0, prefix_lens[b]),
    followed by ``tree_len`` uncommitted tokens (the same count for every request) that a
    forward appended: draft-tree tokens or a prompt not yet committed. The layout is the one
    tree_attention reads (committed prefix, then the tree tokens right after it).

    ``allocate`` (default: new zeroed tensors) provides the tensors, e.g. a compiled generator's
    kept buffers (compiled/buffer_pool.py); requests that leave move the rest to the front in place.
    """

    def __init__(self, num_layers: int, batch_size: int, capacity: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device | str, allocate: Optional[Allocate] = None):
        if batch_size <= 0 or capacity <= 0:
            raise ValueError(f"DraftKVCache: batch_size and capacity must be positive, got "
                             f"{batch_size} and {capacity}")
        if allocate is None:
            def allocate(name, shape, dtype):
                return torch.zeros(shape, dtype=dtype, device=device)
        shape = (batch_size, capacity, num_kv_heads, head_dim)
        self.keys: List[torch.Tensor] = [allocate(("keys", i), shape, dtype) for i in range(num_layers)]
        self.values: List[torch.Tensor] = [allocate(("values", i), shape, dtype) for i in range(num_layers)]
        self.prefix_lens = allocate("prefix_lens", (batch_size,), torch.int64)
        self.tree_len = 0

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[1]

    @property
    def batch_size(self) -> int:
        return self.keys[0].shape[0]

    def check_room(self, count: int) -> None:
        """Raises unless every request has room for ``count`` more tokens (a host sync)."""
        needed = int(self.prefix_lens.max()) + self.tree_len + count
        if needed > self.capacity:
            raise ValueError(f"DraftKVCache: {needed} tokens needed but the capacity is {self.capacity}")

    def slots(self, count: int) -> torch.Tensor:
        """Positions [B, count] where the next ``count`` tokens of each request go (unchecked:
        ``check_room`` first)."""
        start = self.prefix_lens + self.tree_len
        return start[:, None] + torch.arange(count, device=start.device)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Stores k, v [B, n, Hkv, D] at ``slots`` [B, n] of ``layer``."""
        rows = torch.arange(k.shape[0], device=k.device)[:, None]
        self.keys[layer][rows, slots] = k.to(self.keys[layer].dtype)
        self.values[layer][rows, slots] = v.to(self.values[layer].dtype)

    def commit(self) -> None:
        """Makes every uncommitted token part of the prefix (after a prefill)."""
        self.prefix_lens += self.tree_len
        self.tree_len = 0

    def rollback(self) -> None:
        """Forgets the uncommitted tokens."""
        self.tree_len = 0

    def select_rows(self, keep: torch.Tensor) -> None:
        """Keeps only the requests at indices ``keep``, moved to the front of the same tensors (a
        compiled graph's cache keeps its addresses)."""
        self.keys = [compact_rows(k, keep) for k in self.keys]
        self.values = [compact_rows(v, keep) for v in self.values]
        self.prefix_lens = compact_rows(self.prefix_lens, keep)

    def keep(self, tree_indices: torch.Tensor, counts: Optional[torch.Tensor] = None) -> None:
        """Commits, per request, the uncommitted tokens at ``tree_indices`` [B, m] (in order).

        ``counts`` [B] says how many of each row are real (the rest is padding). Values are
        moved, never recomputed: token tree_indices[b, j] lands at prefix_lens[b] + j.
        """
        batch, m = tree_indices.shape
        if counts is None:
            counts = torch.full((batch,), m, dtype=torch.int64, device=tree_indices.device)
        rows = torch.arange(batch, device=tree_indices.device)[:, None]
        src = self.prefix_lens[:, None] + tree_indices
        dst = self.prefix_lens[:, None] + torch.arange(m, device=tree_indices.device)
        valid = torch.arange(m, device=tree_indices.device)[None, :] < counts[:, None]
        for buffers in (self.keys, self.values):
            for layer, buf in enumerate(buffers):
                moved = buf[rows, src]
                cur = buf[rows, dst]
                buffers[layer][rows, dst] = torch.where(valid[..., None, None], moved, cur)
        self.prefix_lens += counts.to(self.prefix_lens.dtype)
        self.tree_len = 0
