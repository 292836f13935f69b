"""The verify forward as one compiled graph over a static KV cache (``compile=True``).

Eager Hugging Face forwards spend most of a small model's time outside the arithmetic (a decode
step of the bundled target costs 5-7x its weight-read time on a 2-core CPU). Compiling the whole
tree forward with ``torch.compile`` fuses the norms, RoPE, activations and residual adds around
the GEMMs and the library's tree-attention op (which has a fake kernel, so it sits inside the
graph).

Shapes stay fixed so the graph compiles once: the target's cache is a Hugging Face
``StaticCache`` whose capacity is rounded up to ``CAPACITY_MULTIPLE`` (calls of similar length
share it), a tree is padded to one of a few sizes (``node_buckets``), and the lengths (``cache_lens``,
``tree_start``) are tensors, not Python numbers. Dynamo keeps one graph per (batch size,
tree size, capacity); a batch that shrinks as requests finish compiles once per size it passes through.
The aux-state capture hooks, attached around each call as in eager mode, are traced into the
graph. Prefill and KV compaction stay eager; Inductor's on-disk cache keeps compiled graphs
across processes.
"""

from __future__ import annotations

import time
from typing import List

import torch

CAPACITY_MULTIPLE = 512
# Graphs one compiled function may keep: a batch that shrinks as requests finish passes through
# several batch sizes, each with a few tree sizes (dynamo's default of 8 would fall back to eager).
RECOMPILE_LIMIT = 64


def round_capacity(need: int) -> int:
    """``need`` rounded up to a multiple of CAPACITY_MULTIPLE, so that calls of similar length
    share a graph."""
    return -(-need // CAPACITY_MULTIPLE) * CAPACITY_MULTIPLE


def static_capacity(longest_prompt: int, most_new: int, tree_nodes: int) -> int:
    """Cache slots for a call: the prompt, every new token, a round's tree appended at the end
    (plus a round's overshoot of the limit), rounded up so that calls share a graph."""
    return round_capacity(longest_prompt + most_new + 2 * tree_nodes + 8)


def node_buckets(num_draft_tokens: int, lookup_tokens: int) -> List[int]:
    """The tree sizes the graph is compiled for. Without lookup every tree has
    ``num_draft_tokens`` nodes; with it a round without a match has ``lookup_tokens`` fewer, so
    two more sizes keep the padding of those rounds small."""
    low = max(1, num_draft_tokens - lookup_tokens)
    return sorted({low, (low + num_draft_tokens + 1) // 2, num_draft_tokens})


class ShapeClock:
    """Runs compiled functions and times the calls that compiled: ``compile_s`` is the time the
    first call of each shape took."""

    def __init__(self):
        self._shapes = set()
        self.compile_s = 0.0

    def call(self, shape, fn, *args):
        started = time.perf_counter()
        with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
            out = fn(*args)
        if shape not in self._shapes:
            self._shapes.add(shape)
            self.compile_s += time.perf_counter() - started
        return out


class CompiledVerify(ShapeClock):
    """The target's tree forward, compiled once per shape."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self._fn = torch.compile(self._tree_forward, dynamic=False)

    def _tree_forward(self, cache, input_ids, position_ids, tree_mask, cache_lens, tree_start):
        out = self.model(input_ids=input_ids, position_ids=position_ids, cache=cache, use_cache=True,
                         tree_mask=tree_mask, cache_lens=cache_lens, tree_start=tree_start)
        return out.logits

    def new_cache(self, capacity: int):
        from transformers import StaticCache

        return StaticCache(config=self.model.config, max_cache_len=capacity)

    def __call__(self, cache, input_ids, position_ids, tree_mask, cache_lens, tree_start) -> torch.Tensor:
        shape = (tuple(input_ids.shape), cache.layers[0].max_cache_len)
        return self.call(shape, self._fn, cache, input_ids, position_ids, tree_mask, cache_lens, tree_start)
