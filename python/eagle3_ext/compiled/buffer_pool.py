"""Cache buffers that a compiled generator keeps from one call to the next.

A compiled graph takes its KV caches as inputs and writes them in place. A CUDA graph replays
its kernels on the addresses it was recorded with, so a new cache per ``generate`` call would
mean a new recording per call, each holding its own memory. Instead a compiled generator keeps
one buffer per cache tensor (per name and dtype) sized for the largest batch it has seen, and
hands out its first rows; a batch that shrinks as requests finish moves its rows to the front
in place (``draft.cache.compact_rows``). Every call of the same batch size and capacity then
sees the same addresses. On CPU the buffers save an allocation per call.

One generator runs one call at a time on its buffers (``BufferPool.lease``).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Dict, Hashable, Iterator, Sequence

import torch


class BufferPool:
    """Zeroed views of kept buffers (module docstring). ``static``: mark every view as a static
    address (what CUDA graphs need to replay on a buffer that a graph writes in place)."""

    def __init__(self, static: bool = False):
        self.static = static
        self._buffers: Dict[Hashable, torch.Tensor] = {}
        self._lock = threading.Lock()

    def rows(self, name: Hashable, shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A zeroed tensor of ``shape`` whose first dimension is the batch: the first rows of
        the buffer kept for (``name``, ``dtype``, ``device``), which grows when a larger batch
        asks for it. Other inner dimensions (another cache capacity) replace it: one buffer per
        name bounds the memory held, and a call of another capacity compiles (and on CUDA
        records) graphs of its own anyway. A 0-d ``shape`` is one tensor kept as it is."""
        shape = tuple(shape)
        device = torch.device(device)
        key = (name, dtype, device)
        buf = self._buffers.get(key)
        if buf is None or buf.shape[1:] != shape[1:] or buf.dim() != len(shape) or (shape and buf.shape[0] < shape[0]):
            self._buffers.pop(key, None)   # freed before its successor is allocated
            buf = torch.zeros(shape, dtype=dtype, device=device)
            self._buffers[key] = buf
        view = buf[:shape[0]] if shape else buf.view(())
        view.zero_()
        if self.static:
            torch._dynamo.mark_static_address(view)
        return view

    def adopt(self, name: Hashable, t: torch.Tensor) -> torch.Tensor:
        """``t``'s values in the kept buffer for its shape (``rows``), which is returned."""
        return self.rows(name, t.shape, t.dtype, t.device).copy_(t)

    @property
    def nbytes(self) -> int:
        """Bytes held by the kept buffers."""
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    @contextmanager
    def lease(self) -> Iterator[None]:
        """Holds the buffers for one call; a second call while one runs (another thread, or a
        streamer that calls back into ``generate``) is an error, not two calls on one buffer."""
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("generate is already running on this generator: with compile=True a generator "
                               "keeps one set of cache buffers, so it runs one call at a time (build one generator "
                               "per thread)")
        try:
            yield
        finally:
            self._lock.release()
