"""``compile=True`` or a ``CompileOptions``: a generator's compiled graphs, the target's verify
forward (``verify``) and the draft's side of a round (``draft``), built and
used together."""

from __future__ import annotations

from typing import Sequence

from .buffer_pool import BufferPool
from .draft import CompiledDraft
from .options import CompileOptions
from .verify import CompiledVerify, cuda_graphs


class CompiledRound:
    """The verify graph (``verify``) and the draft's graphs (``draft``) of one generator, and the
    buffers that hold both caches from one call to the next (``pool``). ``buckets``: the tree sizes
    the verify graph is built for (``node_buckets`` of the generator's tree). ``options``: the
    options given with the environment's overrides applied (CompileOptions.with_environment),
    read here, once."""

    def __init__(self, target, options: CompileOptions, buckets: Sequence[int]):
        device = target.get_input_embeddings().weight.device
        self.options = options.with_environment()
        self.pool = BufferPool(static=cuda_graphs(device, self.options))
        self.verify = CompiledVerify(target, self.pool, self.options, buckets)
        self.draft = CompiledDraft(device, self.options, self.pool)

    @property
    def compile_s(self) -> float:
        """Seconds spent compiling so far, both sides together."""
        return self.verify.compile_s + self.draft.compile_s
