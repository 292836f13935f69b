"""The draft's side of a round as compiled graphs (``compile=True`` or a ``CompileOptions``).

A draft step of a small head is a handful of GEMVs and some twenty small ops; in eager mode the
ops' dispatch costs as much as the arithmetic. Compiled, a round's whole draft side is one graph
per (batch size, pairs size, tree shape, sampling, cache capacity): ``extend`` (committing the
last round's accepted pairs) and the depth - 1 step loop after it (forward, top-k or sampled
draw, frontier expansion, the gathers that feed the next step). No Python runs per step, nothing
syncs with the host, and a round makes one call: a compiled call has a cost of its own
(Dynamo's cache lookup, the wrapper's inputs), comparable to a small draft step's arithmetic.
The pairs are padded to one of two sizes: padding pairs come after the real ones, so the causal
mask hides them from the real ones, and ``keep`` commits only the real ones. The first round
(the prompt's pairs) extends eagerly, then runs the step loop's own graph. The draft cache's
capacity is rounded up (``draft_capacity``) so that calls of similar length share the graphs.
"""

from __future__ import annotations

from typing import List, Optional

import torch

from ..api.config import TreeConfig
from ..decoding.drafting import (DraftInputs, DraftSampler, draft_cache_capacity, draft_steps, extend_and_steps,
                                 extend_eager)
from ..decoding.tree import DraftStep
from ..draft import Eagle3DraftModel
from ..draft.cache import DraftKVCache
from .buffer_pool import BufferPool
from .options import CompileOptions
from .verify import ShapeClock, round_capacity


def draft_capacity(tree: TreeConfig, longest_prompt: int, most_new: int) -> int:
    """The compiled draft cache's capacity: ``draft_cache_capacity`` rounded up to 512 slots."""
    return round_capacity(draft_cache_capacity(tree, longest_prompt, most_new))


def pairs_sizes(tree: TreeConfig) -> List[int]:
    """The sizes ``extend``'s pairs are padded to. A round commits an accepted path and the bonus
    token: at most depth + 1 pairs from the draft's tree, more when a lookup chain longer than
    the depth was accepted (a size of its own, so that draft rounds do not pay for it)."""
    return sorted({tree.depth + 1, max(tree.depth, tree.lookup_tokens) + 1})


def pad_pairs(inputs: DraftInputs, size: int) -> DraftInputs:
    """``inputs`` with ``size`` pairs per request; the padding repeats the last column (its
    outputs are never read and ``counts`` excludes it)."""
    pad = size - inputs.tokens.shape[1]
    if pad == 0:
        return inputs

    def grow(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, x[:, -1:].expand(x.shape[0], pad, *x.shape[2:])], dim=1)

    return DraftInputs(grow(inputs.features), grow(inputs.tokens), grow(inputs.positions), inputs.counts)


class CompiledDraft(ShapeClock):
    """``extend_and_steps`` and ``draft_steps`` compiled once per shape (module docstring) with
    ``options``; ``pool``: the generator's kept buffers, which hold the draft cache
    (``new_cache``)."""

    def __init__(self, device: torch.device, options: CompileOptions, pool: Optional[BufferPool] = None):
        super().__init__(device, options)
        self.pool = pool if pool is not None else BufferPool()
        self._round = torch.compile(extend_and_steps, dynamic=False)
        self._steps = torch.compile(draft_steps, dynamic=False)

    def new_cache(self, draft: Eagle3DraftModel, batch_size: int, capacity: int) -> DraftKVCache:
        """The draft's cache for a call, in the kept buffers (the addresses of the last call of
        this batch size and capacity)."""
        w = draft.fc.weight

        def allocate(name, shape, dtype):
            return self.pool.rows(("draft", name), shape, dtype, w.device)

        return draft.new_cache(batch_size, capacity, allocate=allocate)

    def round(self, draft: Eagle3DraftModel, cache: DraftKVCache, inputs: DraftInputs, seq_lens: torch.Tensor,
              tree: TreeConfig, sampler: Optional[DraftSampler]) -> List[DraftStep]:
        """``extend_and_steps`` as one graph (module docstring): commits ``inputs``' pairs and
        returns the round's draft candidates; the tree tokens stay uncommitted in ``cache``."""
        n = inputs.tokens.shape[1]
        size = next((s for s in pairs_sizes(tree) if s >= n), None)
        if size is None:  # the prompt's pairs, once per call
            root_logits, root_hidden = extend_eager(draft, cache, inputs)
            return self.steps(draft, cache, root_logits, root_hidden, seq_lens, tree, sampler)
        cache.check_room(size + (tree.depth - 1) * tree.topk)
        key = ("round", cache.batch_size, size, tree, None if sampler is None else sampler.sampling, cache.capacity)
        steps = self.call(key, self._round, draft, cache, pad_pairs(inputs, size), seq_lens, tree, sampler)
        return self._copy_draws(steps, sampler)

    def steps(self, draft: Eagle3DraftModel, cache: DraftKVCache, root_logits: torch.Tensor,
              root_hidden: torch.Tensor, seq_lens: torch.Tensor, tree: TreeConfig,
              sampler: Optional[DraftSampler]):
        cache.check_room((tree.depth - 1) * tree.topk)
        key = ("steps", cache.batch_size, tree, None if sampler is None else sampler.sampling, cache.capacity)
        steps = self.call(key, self._steps, draft, cache, root_logits, root_hidden, seq_lens, tree, sampler)
        return self._copy_draws(steps, sampler)

    def _copy_draws(self, steps: List[DraftStep], sampler: Optional[DraftSampler]) -> List[DraftStep]:
        if sampler is not None:  # the rows the graph appended, read after the verify
            sampler.rows = self.copy_out(sampler.rows)
        return steps
