"""Typed wrappers and fake (meta) kernels for the torch.ops.eagle3 ops, and the kernels'
settings that are no argument of an op (the schemas match sgl-kernel's).

The schemas live in csrc/registration.cpp; the kernels in csrc/<op>/. The fake kernels
give torch.compile and FakeTensor tracing each op's output shape without running it.

Settings (csrc/common/options.h):
    CUDA validation: the CPU entries check every value they read (lengths, the mask's diagonal,
        block tables, the tree) and raise; the CUDA kernels check the same on the device and by
        default only skip what is invalid (in bounds, nothing read back: the hot path never
        waits for the device). With validation on, a CUDA entry reads their verdict back and
        raises the CPU entry's error: one synchronization per call, skipped while a CUDA graph
        is captured. It is the ``validate=`` argument of the tree and tree-attention wrappers
        (one call), or ``cuda_validation()`` (a block of this thread's calls, the engine's
        included). Default: off; ``EAGLE3_CUDA_VALIDATE=1`` turns the default on for the
        process (read once, at the first CUDA call; 0 or unset: off).
    CPU ISA: ``set_cpu_isa`` caps the vector ISA of the CPU kernels' builds; ``get_cpu_isa``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple

import torch

from . import _C  # noqa: F401  (registers the schemas read below)
from .errors import BadInputError, BadInputTypeError

_OPS = ("fused_aux_fc", "build_tree_kernel_efficient", "verify_tree_greedy", "tree_speculative_sampling_target_only",
        "tree_speculative_sampling_draft_probs", "tree_attention", "tree_attention_paged")
# (argument name, schema type) per op, read once so that the checks below stay plain Python
# (torch.compile traces them without a graph break).
_SIGNATURES: Dict[str, Tuple[Tuple[str, str], ...]] = {
    name: tuple((a.name, str(a.type)) for a in getattr(torch.ops.eagle3, name).default._schema.arguments)
    for name in _OPS}
_PYTHON_TYPES = {"Tensor": "a torch.Tensor", "List[Tensor]": "a list of torch.Tensor", "int": "an int",
                 "float": "a float", "bool": "a bool"}


def _is(kind: str, value: Any) -> bool:
    if kind == "Tensor":
        return isinstance(value, torch.Tensor)
    if kind == "List[Tensor]":
        return isinstance(value, (list, tuple)) and all(isinstance(v, torch.Tensor) for v in value)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    return True


def _call(name: str, *args: Any, validate: Optional[bool] = None):
    """torch.ops.eagle3.<name>(*args) after a TypeError naming the argument for a value of the
    wrong Python type (the dispatcher's own error is a RuntimeError quoting the whole schema);
    ``validate``: True / False: within ``cuda_validation(validate)``, None: as it is."""
    for (arg, kind), value in zip(_SIGNATURES[name], args):
        optional = kind.startswith("Optional[")
        kind = kind[len("Optional["):-1] if optional else kind
        if not (value is None and optional) and not _is(kind, value):
            expected = _PYTHON_TYPES.get(kind, kind) + (" or None" if optional else "")
            raise TypeError(f"eagle3.{name}: {arg} must be {expected}, got {type(value).__name__}")
    op = getattr(torch.ops.eagle3, name)
    if validate is None:  # (nothing more to trace under torch.compile)
        return op(*args)
    if not isinstance(validate, bool):
        raise BadInputTypeError(f"eagle3.{name}: validate must be True, False or None, got {validate!r} "
                                f"({type(validate).__name__})")
    with cuda_validation(validate):
        return op(*args)


@contextlib.contextmanager
def cuda_validation(on: bool = True) -> Iterator[None]:
    """Within the block, this thread's eagle3 op calls on CUDA read back and raise the errors
    their kernels find in the tensors' values (``on``), or not (module docstring): the calls of
    the wrappers without ``validate=`` and of ``torch.ops.eagle3.*``, a generator's included
    (not a CUDA graph's replays: nothing is read back while one is captured). The setting
    before the block comes back after it."""
    if not isinstance(on, bool):
        raise BadInputTypeError(f"cuda_validation: on must be True or False, got {on!r} ({type(on).__name__})")
    previous = _C.set_cuda_validation(on)
    try:
        yield
    finally:
        _C.set_cuda_validation(previous)


CPU_ISAS = ("generic", "avx2", "avx512")


def set_cpu_isa(isa: Optional[str]) -> None:
    """Caps the vector ISA of the CPU kernels' builds, for the whole process, from the next call.

    Each CPU kernel built for several ISAs runs the widest this CPU has, at most ``isa``:
    tree_attention's AVX-512, AVX2 + FMA or portable build ("generic"); fused_aux_fc's
    streaming kernel for few rows in its AVX-512 or AVX2 build, or for "generic" ATen's GEMMs
    only. A cap above what the CPU has changes nothing.

    Args:
        isa: "avx512", "avx2", "generic", or None (the default): no cap. Before any call the cap
            is ``EAGLE3_CPU_ISA``'s value when that is set (read once, at the first CPU kernel
            call or ``get_cpu_isa``; another name than the three raises a ValueError then).
    """
    expected = f"set_cpu_isa: isa must be one of {', '.join(map(repr, CPU_ISAS))} or None, got {isa!r}"
    if isa is not None and not isinstance(isa, str):
        raise BadInputTypeError(f"{expected} ({type(isa).__name__})")
    if isa is not None and isa not in CPU_ISAS:
        raise BadInputError(expected)
    _C.set_cpu_isa(isa)


def get_cpu_isa() -> Optional[str]:
    """The cap ``set_cpu_isa`` set ("avx512", "avx2", "generic"), or None for none."""
    return _C.get_cpu_isa()


def fused_aux_fc(
    aux_hidden: Sequence[torch.Tensor],
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Project the captured target hidden states without concatenating them.

    Computes ``cat(aux_hidden, -1) @ weight.T (+ bias)`` with fp32 accumulation.

    Args:
        aux_hidden: k >= 1 tensors ``[..., H]`` of one shape, dtype (float32, float16 or
            bfloat16) and device: the target hidden states captured for the draft.
        weight: ``[H_out, k * H]``, the draft's fc weight.
        bias: ``[H_out]`` or None.

    Returns:
        ``[..., H_out]`` in the input dtype.

    Raises:
        ValueError: naming the argument and the numbers when the shapes disagree, most
        importantly when ``k * H != weight.size(1)``: the captured layers are not the ones
        the draft was trained on. TypeError: for a wrong dtype or a non-tensor argument.
    """
    aux = list(aux_hidden) if isinstance(aux_hidden, (list, tuple)) else aux_hidden
    _check_one_device(aux, weight, bias)
    return _call("fused_aux_fc", aux, weight, bias)


def _check_one_device(aux: Any, weight: Any, bias: Any) -> None:
    """fused_aux_fc's device checks (the C++ entries make the same) before the dispatcher sees
    the call: it would hand a mix of CPU and CUDA tensors to the CUDA kernel, and on an H200
    (torch 2.11) such a call crashed the process instead of reaching the kernel's check."""
    if not isinstance(aux, list) or not aux or not all(isinstance(t, torch.Tensor) for t in aux):
        return  # _call names the argument of the wrong type
    first = aux[0].device
    for i, t in enumerate(aux[1:], 1):
        if t.device != first:
            raise ValueError(f"eagle3.fused_aux_fc: aux_hidden[{i}] is on {t.device} but aux_hidden[0] is on "
                             f"{first}; they must be on one device")
    for name, t in (("weight", weight), ("bias", bias)):
        if isinstance(t, torch.Tensor) and t.device != first:
            raise ValueError(f"eagle3.fused_aux_fc: {name} is on {t.device} but aux_hidden is on {first}; they "
                             "must be on the same device")


@torch.library.register_fake("eagle3::fused_aux_fc")
def _fused_aux_fc_fake(aux_hidden, weight, bias):
    # The dispatcher sends a mix of meta and CPU tensors here: the same device check as the real
    # kernels, or the call would return an empty CPU tensor.
    _check_one_device(list(aux_hidden), weight, bias)
    first = aux_hidden[0]
    torch._check_value(
        weight.dim() == 2 and weight.size(1) == len(aux_hidden) * first.size(-1),
        lambda: (
            f"eagle3.fused_aux_fc: got {len(aux_hidden)} aux hidden states of width "
            f"{first.size(-1)} but weight has shape {tuple(weight.shape)}"
        ),
    )
    return first.new_empty((*first.shape[:-1], weight.size(0)))


# The gradients (plain GEMMs per segment) are registered in C++ (csrc/fused_aux_fc/autograd.cpp)
# so that calls without autograd never pass through Python.


# --- Tree building and verification (sgl-kernel compatible; all outputs are in place) ------


def build_tree_kernel_efficient(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int = 0,
    *,
    validate: Optional[bool] = None,
) -> None:
    """Build one EAGLE-2 draft tree per request, writing every output in place.

    Node 0 is the root (the last verified token); node i >= 1 is draft candidate
    ``selected_index[b, i - 1]``, whose parent is the root when ``candidate // topk == 0`` and
    otherwise the node holding candidate ``parent_list[b, candidate // topk]``.

    Args:
        parent_list: int64 ``[bs, topk * (depth - 1) + 1]`` (0 columns allowed for depth 1).
        selected_index: int64 ``[bs, N - 1]`` with ``N = draft_token_num``.
        verified_seq_len: int64 ``[bs]``, prefix length of each request.
        tree_mask: written. Mode 0: bool ``[sum(seq_len) * N + bs * N * N]``, one
            ``[N, seq_len + N]`` row-major block per request (prefix columns untouched).
            Mode 1: bool ``[bs * N * N]``. Mode 2: ``bs * N`` bit-packed rows of 1/2/4 bytes
            for N <= 8/16/32 (bit j = node j visible, bit 0 the root, little-endian).
        positions: written, int64 ``[bs * N]`` = seq_len + depth of the node.
        retrive_index, retrive_next_token, retrive_next_sibling: written, int64 ``[bs, N]``:
            ``b * N + i``, first child, next sibling (ascending node order, -1 for none).
        validate: on CUDA, read back what the kernel found in the values and raise it
            (``cuda_validation``; a synchronization). None (the default): off, unless
            ``EAGLE3_CUDA_VALIDATE=1``. The CPU entry always raises.

    Raises:
        ValueError: for wrong shapes or sizes, and for an invalid tree (a node whose parent is
        not among the selected nodes), naming the request and the node. TypeError: for a
        wrong dtype or a non-tensor argument. On CUDA the invalid-tree check raises only with
        validation (otherwise the request stops, nothing is read back).
    """
    _call(
        "build_tree_kernel_efficient",
        parent_list, selected_index, verified_seq_len, tree_mask, positions, retrive_index,
        retrive_next_token, retrive_next_sibling, topk, depth, draft_token_num, tree_mask_mode,
        validate=validate,
    )


def verify_tree_greedy(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
    *,
    validate: Optional[bool] = None,
) -> None:
    """Greedy tree verification, writing predicts, accept_index and accept_token_num in place.

    Args:
        predicts: int32 ``[bs * N]``, pre-filled with -1; at each accepted node (root
            included) receives the target's next token there, the last one being the bonus.
        accept_index: int32 ``[bs, S]`` pre-filled with -1; receives the root's global index,
            then each accepted node's. At most ``S - 1`` draft tokens are accepted.
        accept_token_num: int32 ``[bs]``; accepted draft tokens (neither root nor bonus).
        candidates, retrive_index, retrive_next_token, retrive_next_sibling: int64 ``[bs, N]``.
        target_predict: int64 ``[bs, N]``, the target's argmax at every node.
        validate: on CUDA, read back what the kernel found in the values and raise it
            (``cuda_validation``; a synchronization). None (the default): off, unless
            ``EAGLE3_CUDA_VALIDATE=1``. The CPU entry always raises.
    """
    _call(
        "verify_tree_greedy",
        predicts, accept_index, accept_token_num, candidates, retrive_index,
        retrive_next_token, retrive_next_sibling, target_predict, validate=validate,
    )


def tree_speculative_sampling_target_only(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
    *,
    validate: Optional[bool] = None,
) -> None:
    """Lossless tree verification by recursive rejection sampling, in place.

    At each accepted node the children are tried in sibling order with one coin
    (``uniform_samples[b, node]``): child k is accepted when the coin is <= the sum of the
    target probabilities of children 1..k divided by ``threshold_acc``, or its own probability
    is >= ``threshold_single``. A rejected child's target probability is written into
    ``draft_probs`` at the parent's row; the final token is drawn with
    ``uniform_samples_for_final_sampling[b]`` from ``relu(target - draft)`` at the last
    accepted node (the full target distribution after ``S - 1`` accepted tokens).
    With both thresholds 1.0 the emitted tokens follow the target distribution exactly.

    Args:
        predicts, accept_index, accept_token_num, candidates, retrive_*: as verify_tree_greedy.
        uniform_samples: float32 ``[bs, N]``; uniform_samples_for_final_sampling: float32 ``[bs]``.
        target_probs: float32 ``[bs, N, V]``, the target's distribution at every node.
        draft_probs: float32 ``[bs, N, V]``, zeros on entry; written.
        threshold_single, threshold_acc: in [0, 1]; 1.0 for exact (lossless) sampling.
        deterministic: a reproducible reduction order on CUDA (CPU is always deterministic).
        validate: on CUDA, read back what the kernel found in the values and raise it
            (``cuda_validation``; a synchronization). None (the default): off, unless
            ``EAGLE3_CUDA_VALIDATE=1``. The CPU entry always raises.
    """
    _call(
        "tree_speculative_sampling_target_only",
        predicts, accept_index, accept_token_num, candidates, retrive_index,
        retrive_next_token, retrive_next_sibling, uniform_samples,
        uniform_samples_for_final_sampling, target_probs, draft_probs, threshold_single,
        threshold_acc, deterministic, validate=validate,
    )


def tree_speculative_sampling_draft_probs(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    deterministic: bool = True,
    *,
    validate: Optional[bool] = None,
) -> None:
    """Lossless tree verification with the draft's probabilities (SpecInfer / EAGLE), in place.

    The children of node i must have been drawn i.i.d. (with replacement) from
    ``draft_probs[b, i]``. At the last accepted node, with target ``p`` and draft ``q``, the
    children are tried in sibling order: child node ``j`` with token ``x = candidates[b, j]`` is
    accepted when its own coin ``uniform_samples[b, j]`` is ``< p'(x) / q(x)``, with ``p'``
    starting as ``p``; a rejection sets ``p' = normalize(relu(p' - q))`` and tries the next
    sibling (``q`` unchanged). After an accepted child the walk descends; when no child is
    accepted, or after ``S - 1`` accepted
    tokens, the final token is drawn with ``uniform_samples_for_final_sampling[b]`` from ``p'``
    at the last accepted node. The emitted tokens follow the target distribution exactly,
    whatever the draft (q with zeros where p has mass, q = p, q one-hot). There are no
    thresholds: nothing trades exactness for acceptance. Children drawn without replacement
    (distinct siblings) would need q renormalized without each rejected token; this op keeps q.

    Args:
        predicts, accept_index, accept_token_num, candidates, retrive_*: as verify_tree_greedy.
        uniform_samples: float32 ``[bs, N]``, the coin of each child node (column 0 unused).
        uniform_samples_for_final_sampling: float32 ``[bs]``.
        target_probs: float32 ``[bs, N, V]``, the target's distribution at every node (rows
            summing to 1).
        draft_probs: float32 ``[bs, N, V]``, read only: row i is the distribution node i's
            children were drawn from.
        deterministic: a reproducible reduction order on CUDA (CPU is always deterministic).
        validate: on CUDA, read back what the kernel found in the values and raise it
            (``cuda_validation``; a synchronization). None (the default): off, unless
            ``EAGLE3_CUDA_VALIDATE=1``. The CPU entry always raises.
    """
    _call(
        "tree_speculative_sampling_draft_probs",
        predicts, accept_index, accept_token_num, candidates, retrive_index,
        retrive_next_token, retrive_next_sibling, uniform_samples,
        uniform_samples_for_final_sampling, target_probs, draft_probs, deterministic, validate=validate,
    )


# Mutating ops return nothing: their fake kernels only check what can be checked on shapes.


@torch.library.register_fake("eagle3::build_tree_kernel_efficient")
def _build_tree_kernel_efficient_fake(
    parent_list, selected_index, verified_seq_len, tree_mask, positions, retrive_index,
    retrive_next_token, retrive_next_sibling, topk, depth, draft_token_num, tree_mask_mode,
):
    torch._check_value(
        tree_mask_mode in (0, 1, 2),
        lambda: f"eagle3.build_tree_kernel_efficient: tree_mask_mode must be 0, 1 or 2, got {tree_mask_mode}",
    )
    return None


@torch.library.register_fake("eagle3::verify_tree_greedy")
def _verify_tree_greedy_fake(
    predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
    retrive_next_sibling, target_predict,
):
    return None


@torch.library.register_fake("eagle3::tree_speculative_sampling_target_only")
def _tree_speculative_sampling_target_only_fake(
    predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
    retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs,
    draft_probs, threshold_single, threshold_acc, deterministic,
):
    torch._check_value(
        0.0 <= threshold_single <= 1.0 and 0.0 <= threshold_acc <= 1.0,
        lambda: "eagle3.tree_speculative_sampling_target_only: thresholds must be in [0, 1]",
    )
    return None


@torch.library.register_fake("eagle3::tree_speculative_sampling_draft_probs")
def _tree_speculative_sampling_draft_probs_fake(
    predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
    retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs,
    draft_probs, deterministic,
):
    torch._check_value(
        tuple(draft_probs.shape) == tuple(target_probs.shape),
        lambda: (
            "eagle3.tree_speculative_sampling_draft_probs: draft_probs must have the shape of "
            f"target_probs {tuple(target_probs.shape)}, got {tuple(draft_probs.shape)}"
        ),
    )
    return None


def tree_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    tree_mask: torch.Tensor,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
    tree_start: Optional[torch.Tensor] = None,
    *,
    validate: Optional[bool] = None,
) -> torch.Tensor:
    """Attention of N draft-tree tokens against their KV prefix and their tree ancestors.

    Query i of request b attends cache positions ``[0, cache_lens[b])`` (the committed prefix)
    and the tree positions ``cache_lens[b] + j`` with ``tree_mask[b, i, j]``. Softmax in fp32.

    Args:
        q: ``[B, N, Hq, Dqk]`` queries of the tree tokens (float32, float16 or bfloat16).
        k_cache: ``[B, S_max, Hkv, Dqk]``; v_cache: ``[B, S_max, Hkv, Dv]`` (Dv may differ, as
            in MLA), q's dtype, with the tree tokens' K/V already written at
            ``cache_lens[b] .. cache_lens[b] + N - 1``. Strided views are read in place (e.g.
            Hugging Face's ``[B, Hkv, S, D]`` cache ``.transpose(1, 2)``); unit stride along the
            head dim. ``Hq % Hkv == 0`` (grouped-query attention).
        cache_lens: int32 or int64 ``[B]``, prefix length per request.
        tree_mask: bool ``[B, N, N]``, ancestors and self; the diagonal must be set (a padding
            row sets only its diagonal).
        scale: softmax scale, usually ``Dqk ** -0.5``.
        window: 0, or a sliding window of W positions. Tree token i sits at position
            ``cache_lens[b] + d_i``, d_i its depth (the tree tokens it sees, minus one); it sees
            only keys at positions above its own minus W (transformers' ``sliding_window``).
        softcap: 0, or c > 0: logits ``c * tanh(scale * q.k / c)`` (Gemma 2).
        sinks: ``[Hq]`` per-head sink logits (GPT-OSS): one more term of each softmax
            denominator, with no value; or None.
        tree_start: int32 / int64 ``[B]``: the tree tokens' K/V sit at slots
            ``tree_start[b] + j`` (>= cache_lens[b]) instead of right after the prefix, so
            requests of different lengths can share one append offset; their positions are
            unchanged. None: ``cache_lens``.
        validate: on CUDA, read back what the kernel found in the values and raise it
            (``cuda_validation``; a synchronization). None (the default): off, unless
            ``EAGLE3_CUDA_VALIDATE=1``. The CPU entry always raises.

    Returns:
        ``[B, N, Hq, Dv]`` in q's dtype.

    Raises:
        ValueError: naming the argument and the numbers for wrong shapes, devices, a mask row
        without its diagonal, ``cache_lens[b] + N > S_max``, a negative window or soft-cap.
        TypeError: for a wrong dtype or an argument of the wrong Python type. On CUDA the
        checks of tensor values (lengths, mask diagonal) raise only with validation;
        otherwise an invalid request's rows come out zero and nothing is read back.
    """
    return _call("tree_attention", q, k_cache, v_cache, cache_lens, tree_mask, scale, window, softcap, sinks,
                 tree_start, validate=validate)


def tree_attention_paged(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    block_table: torch.Tensor,
    cache_lens: torch.Tensor,
    tree_mask: torch.Tensor,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
    tree_start: Optional[torch.Tensor] = None,
    *,
    validate: Optional[bool] = None,
) -> torch.Tensor:
    """tree_attention over a paged KV cache.

    Args:
        k_pages: ``[P, page_size, Hkv, Dqk]``; v_pages: ``[P, page_size, Hkv, Dv]`` physical
            pages.
        block_table: int32 ``[B, max_blocks]``; cache position s of request b is row
            ``s % page_size`` of page ``block_table[b, s // page_size]``. It must cover
            ``cache_lens[b] + N`` positions.
        q, cache_lens, tree_mask, scale, window, softcap, sinks, tree_start, validate: as in
            :func:`tree_attention`.

    Returns:
        ``[B, N, Hq, Dv]`` in q's dtype.
    """
    return _call("tree_attention_paged", q, k_pages, v_pages, block_table, cache_lens, tree_mask, scale,
                 window, softcap, sinks, tree_start, validate=validate)


def _tree_attention_fake_checks(op, q, k, v, tree_mask):
    torch._check_value(q.dim() == 4 and k.dim() == 4 and v.dim() == 4,
                       lambda: f"eagle3.{op}: q and the cache must be 4-D")
    torch._check_value(
        k.size(2) > 0 and q.size(2) % k.size(2) == 0,
        lambda: f"eagle3.{op}: q has {q.size(2)} heads, not a multiple of {k.size(2)} kv heads",
    )
    torch._check_value(k.size(3) == q.size(3), lambda: f"eagle3.{op}: k has head_dim {k.size(3)} but q has {q.size(3)}")
    torch._check_value(
        tuple(tree_mask.shape) == (q.size(0), q.size(1), q.size(1)),
        lambda: f"eagle3.{op}: tree_mask must have shape [B, N, N], got {tuple(tree_mask.shape)}",
    )
    return q.new_empty(q.shape[:3] + (v.size(3),))


@torch.library.register_fake("eagle3::tree_attention")
def _tree_attention_fake(q, k_cache, v_cache, cache_lens, tree_mask, scale, window=0, softcap=0.0, sinks=None,
                         tree_start=None):
    return _tree_attention_fake_checks("tree_attention", q, k_cache, v_cache, tree_mask)


@torch.library.register_fake("eagle3::tree_attention_paged")
def _tree_attention_paged_fake(q, k_pages, v_pages, block_table, cache_lens, tree_mask, scale, window=0,
                               softcap=0.0, sinks=None, tree_start=None):
    return _tree_attention_fake_checks("tree_attention_paged", q, k_pages, v_pages, tree_mask)
