"""The verify forward as one compiled graph over a static KV cache (``compile=True`` or a
``CompileOptions``, compiled/options.py).

Eager Hugging Face forwards spend most of a small model's time outside the arithmetic: a decode
step of a small target costs several times its weight-read time on CPU. Compiling the whole
tree forward with ``torch.compile`` fuses the norms, RoPE, activations and residual adds around
the GEMMs and the library's tree-attention op (which has a fake kernel, so it sits inside the
graph).

Shapes stay fixed so the graph compiles once: the target's cache is a Hugging Face
``StaticCache`` whose capacity is rounded up to ``CAPACITY_MULTIPLE`` (calls of similar length
share it), a tree is padded to one of a few sizes (``node_buckets``), and the lengths
(``cache_lens``, ``tree_start``) are tensors, not Python numbers. Dynamo keeps one graph per
(batch size, tree size, capacity); a batch that shrinks as requests finish compiles once per
size it passes through. The aux-state capture hooks, attached around each call as in eager mode,
are traced into the graph. Prefill and KV compaction stay eager.

On CPU the graphs are built with the weights frozen into them, linears of one input
concatenated, their GEMMs autotuned and a C++ wrapper (``inductor_settings``; ``autotune`` and
``cpp_wrapper`` of CompileOptions): Inductor's C++
GEMM template packs a frozen weight once, which pays for the GEMMs of a few rows a tree makes,
and launching a graph's kernels from C++ saves Python's per-kernel launch cost, which shows on a
draft step's small kernels (docs/perf_notes.md has the measurements). Frozen weights are
constants: a compiled generator does not see later in-place changes to its models' weights
(build a new generator after changing them).

A half-precision target's projections (a tree's 1-16 rows) run through the library's streaming
kernel instead (``RoutedLinears``, traced into the graph), as the draft's do: the graph is then
at least as fast and holds no oneDNN-packed weight, which Inductor's on-disk cache cannot store:
a second process loads the verify graph instead of compiling it. A float32 target keeps the
packed GEMMs (the streaming kernel made its verify slower there); its verify is built ahead of
time instead (CompileOptions'
``packages``), as an AOTInductor package on disk that stores the packed weights
(compiled/packages.py): a later process with
the same weights, shapes and settings loads it instead of compiling it again. A forward
``torch.export`` cannot trace is compiled with ``torch.compile``, with a warning.

On CUDA the graphs run as CUDA graphs (Inductor's ``triton.cudagraphs``, what
``mode="reduce-overhead"`` turns on; CompileOptions' ``cuda_graphs=False`` turns it off): a round's
kernels are replayed from a recording rather than launched one by one. A recording replays on the
addresses it was made with, so the caches are a generator's kept buffers, the same from one call
to the next (compiled/buffer_pool.py), marked as static addresses, and every output of a graph is
copied out before the next graph can overwrite it.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Dict, List, Sequence, Tuple

import torch

from ..decoding.capture import AuxHiddenCapture
from ..decoding.verify_forward import TargetOutput, TreeInputs, VerifyForward, tree_forward
from ..linear import HALF, RoutedLinears
from .buffer_pool import BufferPool
from .options import CompileOptions
from .packages import NoPackage, PackagedVerify

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


def cuda_graphs(device: torch.device, options: CompileOptions) -> bool:
    """Whether the compiled graphs on ``device`` run as CUDA graphs (module docstring)."""
    return device.type == "cuda" and options.cuda_graphs


def autotunes(options: CompileOptions) -> bool:
    """Whether the CPU graphs autotune their GEMMs: ``options.autotune``, or where it is None,
    whether this CPU lacks AVX-512. On a 2-core AVX2 VM Inductor's GEMM template over a frozen
    weight ran a 6-row MLP twice as fast as ATen; on an AVX-512 VM it gained nothing (SmolLM2's
    compiled verify 8% slower, three alternating runs) and the compile took 165 s against 107 s
    (docs/benchmarks.md)."""
    if options.autotune is not None:
        return options.autotune
    return torch.backends.cpu.get_cpu_capability() != "AVX512"


def inductor_settings(device: torch.device, options: CompileOptions) -> Dict[str, object]:
    """Inductor settings of the compiled graphs on ``device`` (module docstring). Freezing needs
    the calls to run without autograd, as generation does. Without autotuning (``autotunes``)
    the graphs keep ATen's GEMMs (compiles several times faster; slower graphs on AVX2);
    ``cpp_wrapper=False`` keeps Inductor's Python wrapper (compiles faster, calls slower). On CUDA: CUDA graphs
    (``cuda_graphs``), otherwise Inductor's defaults."""
    if device.type == "cuda":
        return {"triton.cudagraphs": True} if cuda_graphs(device, options) else {}
    if device.type != "cpu":
        return {}
    # Linears that read the same input (a float32 target's q, k and v; gate and up) become one
    # GEMM over weights concatenated at freezing: fewer, wider GEMMs, a faster verify in
    # alternating runs (docs/perf_notes.md).
    settings: Dict[str, object] = {"freezing": True, "cpp.enable_concat_linear": True}
    if autotunes(options):
        # (the two last keep Inductor's autotuning reports off stderr)
        settings.update(max_autotune=True, max_autotune_gemm_backends="CPP,ATEN", autotune_num_choices_displayed=0,
                        max_autotune_report_choices_stats=False)
    if options.cpp_wrapper:
        # A graph's kernels launched from C++ rather than from Python: a draft step or a verify
        # forward runs some 20-60 small kernels, and Python's launch cost per kernel is a
        # measurable part of a step on a small model.
        settings["cpp_wrapper"] = True
    return settings


class ShapeClock:
    """Runs compiled functions (with ``inductor_settings`` for ``device`` and ``options``) and
    times the calls that compiled: ``compile_s`` is the time the first call of each key took.

    A key names everything Dynamo's guards check on a call of that function through this
    clock (shapes, the tree, the sampling settings; the models are this clock's own). Its
    first call evaluates every guard and compiles if need be; a later call of a key already
    run evaluates only the guards that tell the function's graphs apart (Dynamo's
    ``skip_guard_eval_unsafe``): the full set costs a sizeable fraction of a millisecond, a
    few percent of a round, and a round makes two calls (the draft side, the verify)."""

    def __init__(self, device: torch.device, options: CompileOptions):
        device = torch.device(device)
        self._keys = set()
        self._settings = inductor_settings(device, options)
        # A CUDA graph's outputs live in memory that the next graph to run may reuse.
        self._copy_outputs = cuda_graphs(device, options)
        self.compile_s = 0.0

    def call(self, key, fn, *args):
        if key in self._keys:
            with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
                out = fn(*args)
        else:
            with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT), \
                    torch._inductor.config.patch(self._settings):
                out = self.timed(key, fn, *args)
        return self.copy_out(out)

    def timed(self, key, fn, *args):
        """``fn(*args)``, counted in ``compile_s`` if it is the first call of ``key``."""
        if key in self._keys:
            return fn(*args)
        started = time.perf_counter()
        out = fn(*args)
        self._keys.add(key)
        self.compile_s += time.perf_counter() - started
        return out

    def copy_out(self, out):
        """``out`` (tensors, in lists, tuples or dataclasses) copied out of a CUDA graph's memory
        (module docstring); as it is elsewhere."""
        return _copied(out) if self._copy_outputs else out


def _copied(out):
    if isinstance(out, torch.Tensor):
        return out.clone()
    if dataclasses.is_dataclass(out) and not isinstance(out, type):
        return dataclasses.replace(out, **{f.name: _copied(getattr(out, f.name))
                                           for f in dataclasses.fields(out) if f.init})
    if isinstance(out, (list, tuple)):
        items = [_copied(x) for x in out]
        return type(out)(*items) if hasattr(out, "_fields") else type(out)(items)
    return out


def packaged(weight: torch.Tensor, options: CompileOptions) -> bool:
    """Whether a target with this embedding weight runs its verify as AOTInductor packages
    (compiled/packages.py): float32 on CPU, with ``options.packages``."""
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and options.packages


def verify_on_disk(model, options: CompileOptions, tree, aux_ids: Sequence[int], batch: int, prompt_tokens: int,
                   new_tokens: int) -> bool:
    """Whether compiling ``model``'s verify for a call of ``batch`` prompts of at most
    ``prompt_tokens`` tokens and ``new_tokens`` new tokens with ``tree`` (a TreeConfig) would load
    it from disk rather than build it: a float32 target on CPU (``packaged``) whose AOTInductor
    package for that batch size, cache capacity and one of the tree's sizes an earlier compiled
    call stored. Other targets compile with ``torch.compile``, whose cache is not asked: False."""
    weight = model.get_input_embeddings().weight
    options = options.with_environment()
    if not packaged(weight, options):
        return False
    packages = PackagedVerify(model, inductor_settings(weight.device, options), options.package_dir)
    capacity = static_capacity(prompt_tokens, new_tokens, tree.num_draft_tokens)
    return any(packages.path(((batch, size), capacity), aux_ids).exists()
               for size in node_buckets(tree.num_draft_tokens, tree.lookup_tokens))


class CompiledVerify(ShapeClock, VerifyForward):
    """The target's tree forward, compiled once per shape: a graph of ``torch.compile``, or for a
    float32 target on CPU an AOTInductor package stored on disk (``packaged``)."""

    def __init__(self, model, pool: BufferPool, options: CompileOptions, buckets: Sequence[int]):
        weight = model.get_input_embeddings().weight
        super().__init__(weight.device, options)
        self.model = model
        self.pool = pool
        self.buckets = sorted(buckets)
        self._fn = torch.compile(self._tree_forward, dynamic=False)
        self.packages = (PackagedVerify(model, self._settings, options.package_dir) if packaged(weight, options)
                         else None)

    def _tree_forward(self, cache, input_ids, position_ids, tree_mask, cache_lens, tree_start):
        with RoutedLinears(stream=HALF):  # (module docstring)
            return tree_forward(self.model, cache, input_ids, position_ids, tree_mask, cache_lens, tree_start)

    def new_cache(self, capacity: int):
        """A StaticCache of ``capacity`` slots whose every layer keeps the full history, as the
        eager path's cache does (decoding/target.py): a sliding-window layer's cache would keep
        only the window and drop the positions that a rejected round falls back to."""
        from transformers import StaticCache
        from transformers.cache_utils import StaticLayer, StaticSlidingWindowLayer

        cache = StaticCache(config=self.model.config, max_cache_len=capacity)
        cache.layers = [StaticLayer(max_cache_len=capacity) if isinstance(layer, StaticSlidingWindowLayer) else layer
                        for layer in cache.layers]
        return cache

    def fill(self, cache, prefill) -> None:
        """Writes a prefill's cache (a DynamicCache) into ``cache`` (``new_cache``), whose tensors
        then live in the kept buffers (``adopt``)."""
        for layer, source in zip(cache.layers, prefill.layers):
            layer.update(source.keys, source.values)
        self.adopt(cache)

    def adopt(self, cache) -> None:
        """Moves the cache's tensors into the kept buffers (compiled/buffer_pool.py); call once they
        exist (after the prefill). A StaticCache marks the tensors it allocates as static
        addresses; the kept buffers carry such a mark only for CUDA graphs: on CPU Dynamo would
        lift a marked tensor as a parameter, which a frozen graph binds at compile time (the next
        call's cache would not be written)."""
        for i, layer in enumerate(cache.layers):
            for name in ("keys", "values", "cumulative_length"):
                setattr(layer, name, self.pool.adopt(("target", i, name), getattr(layer, name)))

    def __call__(self, capture: AuxHiddenCapture, cache, tree: TreeInputs) -> TargetOutput:
        """The logits and ``capture``'s aux states of the tree forward; writes ``cache``. The tree is
        padded to its node bucket (hybrid drafting makes trees of varying size): a padding node
        sees only itself and nobody sees it; its outputs are cut off and its cache slots, past
        the real tree, are dropped by ``TargetRunner.commit``."""
        tokens, positions, tree_mask = tree.tokens, tree.positions, tree.tree_mask
        b, n = tokens.shape
        size = next(s for s in self.buckets if s >= n)
        pad = size - n
        if pad > 0:
            tokens = torch.cat([tokens, tokens.new_zeros(b, pad)], dim=1)
            positions = torch.cat([positions, positions[:, :1].expand(b, pad)], dim=1)
            mask = torch.zeros(b, size, size, dtype=torch.bool, device=tree_mask.device)
            mask[:, :n, :n] = tree_mask
            mask[:, n:, n:] = torch.eye(pad, dtype=torch.bool, device=tree_mask.device)
            tree_mask = mask
        with torch.no_grad():
            logits, aux = self._padded(capture, cache, tokens, positions, tree_mask, tree.cache_lens, tree.tree_start)
        return TargetOutput(logits[:, :n], [a[:, :n] for a in aux])

    def _padded(self, capture, cache, *args) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        """``args``: tokens, positions, tree_mask, cache_lens, tree_start of a tree of a bucket's size."""
        key = (tuple(args[0].shape), cache.layers[0].max_cache_len)
        if self.packages is not None:
            try:
                return self.timed(key, self.packages, capture, cache, *args)
            except NoPackage as e:
                warnings.warn(f"no AOTInductor package of the float32 verify forward of {type(self.model).__name__} "
                              f"({e}); it is compiled with torch.compile instead, in every process", stacklevel=3)
                self.packages = None
        with capture:   # the hooks are traced into the graph
            logits = self.call(key, self._fn, cache, *args)
            aux = capture.take()
        return logits, self.copy_out(aux)
