"""What a round should cost on this machine if every forward ran at the hardware's limit: the
roofline estimate of r (round time in plain decode steps) that ``eagle3 bench`` prints beside
the measured one.

A forward over T tokens costs max(weight bytes / memory bandwidth, 2 * weight elements * T /
matmul rate): at the few tokens of a decode or a verify, reading the weights decides. The
bandwidth and the matmul rate are measured here, in the same run, with the target's dtype (its
products in float32 where the CPU has no native GEMM for it: the hardware's limit there is the
float32 units', linear.py).
Left out, as small next to the weights at these lengths: the KV cache reads, the attention
FLOPs and embedding lookups (a row each). The gap between the measured r and this one is the
framework's overhead.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Dict

import torch

from ..api.config import TreeConfig
from ..linear import gemm_dtype, onednn_float32, onednn_linear

BANDWIDTH_BYTES = 256 << 20  # larger than any last-level cache, so every read streams from memory
# The matrix-vector read's row length. A sum alone can fall short of what the memory gives: on a
# 2-core AVX-512 VM it read 20-22 GB/s where a product over the same bytes, the read a decode
# step's linears make, read 28-30 GB/s (docs/perf_notes.md).
GEMV_COLUMNS = 1024
MATMUL_SIZE = 1024


@dataclass
class MachineRates:
    bandwidth_gb_s: float  # memory read bandwidth, GB/s
    matmul_gflop_s: float  # dense matmul rate in the measured dtype, GFLOP/s

    def forward_s(self, weight_bytes: int, weight_elements: int, tokens: int) -> float:
        """The roofline time of one forward over ``tokens`` tokens."""
        return max(weight_bytes / (self.bandwidth_gb_s * 1e9),
                   2.0 * weight_elements * tokens / (self.matmul_gflop_s * 1e9))


def _best_of(fn, repeats: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def read_bandwidth(device: str = "cpu") -> float:
    """Memory read bandwidth in GB/s: the faster of two reads of the same 256 MB of float32, a sum
    and a matrix-vector product, each best of five."""
    big = torch.ones(BANDWIDTH_BYTES // 4, dtype=torch.float32, device=device)
    matrix, vector = big.view(-1, GEMV_COLUMNS), torch.ones(GEMV_COLUMNS, device=device)
    read_s = min(_best_of(lambda: big.sum().item()), _best_of(lambda: torch.mv(matrix, vector)[0].item()))
    return BANDWIDTH_BYTES / read_s / 1e9


def measure_machine(dtype: torch.dtype, device: str = "cpu") -> MachineRates:
    """Memory bandwidth (``read_bandwidth``) and matmul rate (1024^3 in ``dtype``, or in float32
    where ``gemm_dtype`` says so, best of five). Where the library multiplies float32 through
    oneDNN (``onednn_float32``: ATen's GEMM reached about half of oneDNN's rate on an AMD CPU) the
    rate is the faster of the two."""
    bandwidth = read_bandwidth(device)
    gemm = gemm_dtype(device, dtype)
    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device=device).to(gemm)
    mm_s = _best_of(lambda: (a @ a)[0, 0].item())
    if torch.device(device).type == "cpu" and gemm == torch.float32 and onednn_float32():
        mm_s = min(mm_s, _best_of(lambda: onednn_linear(a, a, None)[0, 0].item()))
    return MachineRates(bandwidth, 2.0 * MATMUL_SIZE ** 3 / mm_s / 1e9)


def weights_read(model: torch.nn.Module) -> Dict[str, int]:
    """{"bytes", "elements"} of the weights one forward reads in full: every parameter once (tied
    ones once), less the embedding tables that are only looked up (a row per token)."""
    lookup_only = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    output = getattr(model, "get_output_embeddings", lambda: None)()
    if output is not None:
        lookup_only.discard(id(output.weight))  # tied: the output projection reads the whole table
    seen, total_bytes, total_elements = set(), 0, 0
    for p in model.parameters():
        if id(p) in seen or id(p) in lookup_only:
            continue
        seen.add(id(p))
        total_bytes += p.numel() * p.element_size()
        total_elements += p.numel()
    return {"bytes": total_bytes, "elements": total_elements}


def estimate_round_cost(target: torch.nn.Module, draft: torch.nn.Module, tree: TreeConfig,
                        rates: MachineRates, batch: int = 1) -> Dict[str, float]:
    """The roofline r of one round of ``tree`` at ``batch``: one draft forward over the accepted
    pairs (about the acceptance length: taken as the depth, the upper end), depth - 1 draft
    steps over topk nodes, and a verify over the tree's nodes, in units of one decode forward."""
    t, d = weights_read(target), weights_read(draft)
    decode = rates.forward_s(t["bytes"], t["elements"], batch)
    verify = rates.forward_s(t["bytes"], t["elements"], batch * tree.num_draft_tokens)
    draft_s = (rates.forward_s(d["bytes"], d["elements"], batch * tree.depth)
               + (tree.depth - 1) * rates.forward_s(d["bytes"], d["elements"], batch * tree.topk))
    return {"r": (verify + draft_s) / decode, "verify": verify / decode, "draft": draft_s / decode,
            "decode_step_ms": decode * 1e3, "draft_step_ms": rates.forward_s(d["bytes"], d["elements"], batch) * 1e3}
