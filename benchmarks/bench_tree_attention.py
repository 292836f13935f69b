"""Benchmark eagle3.tree_attention against SDPA with a dense mask, measured in the same run.

    python benchmarks/bench_tree_attention.py [--device cpu|cuda] [--dtype bf16 ...]
        [--prefix 128 1024 ...] [--tree 8 32 64] [--batch 1 8 32] [--paged PAGE]
        [--heads HQ HKV] [--head-dim DQK [DV]] [--window W] [--quick] [--out FILE.json]

Llama-8B-like heads by default (32 q heads, 8 kv heads, D = 128); --heads 128 128 --head-dim
192 128 is DeepSeek-V3's MLA attention (values narrower than queries and keys), --window a
sliding window (the dense mask carries it too). The cache is in Hugging Face's layout
[B, Hkv, S, D]; the op reads it through a transposed view, the baseline (what HF's "sdpa"
attention runs for a tree) calls F.scaled_dot_product_attention with enable_gqa and a dense
bool mask [B, 1, N, S] built once outside the timed region (so the baseline is not charged for
building it). With --paged the op reads the same K/V from shuffled pages instead.
Prints one row per shape (baseline ms, op ms, speedup = baseline / op, the op's GB/s and
TFLOP/s, on a GPU also against the measured copy bandwidth) and writes every figure as JSON.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys

import torch

import eagle3_ext
from eagle3_ext import reference

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import compare, device_roofline, finish_report, speed_figures  # noqa: E402

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
HQ, HKV, D = 32, 8, 128
DEFAULTS = {
    "cuda": dict(prefix=[128, 1024, 4096, 16384], tree=[8, 32, 64], batch=[1, 8, 32]),
    "cpu": dict(prefix=[128, 1024, 4096], tree=[8, 32, 64], batch=[1, 8]),
}
QUICK = dict(prefix=[128, 1024], tree=[8, 32], batch=[1, 4])


def chain_tree_mask(batch: int, n: int, device: str) -> torch.Tensor:
    """A tree of chains of length 4 side by side (a typical EAGLE tree's density)."""
    i = torch.arange(n, device=device)
    same_chain = (i.view(-1, 1) // 4) == (i.view(1, -1) // 4)
    return (same_chain & (i.view(1, -1) <= i.view(-1, 1))).expand(batch, n, n).contiguous()


def bench_shape(batch, prefix, n, dtype, device, budget_s, page_size, heads=(HQ, HKV), dims=(D, D), window=0):
    (hq, hkv), (dqk, dv) = heads, dims
    s = prefix + n
    g = torch.Generator(device=device).manual_seed(0)
    k_hf = torch.randn(batch, hkv, s, dqk, device=device, dtype=dtype, generator=g)
    v_hf = torch.randn(batch, hkv, s, dv, device=device, dtype=dtype, generator=g)
    q_hf = torch.randn(batch, hq, n, dqk, device=device, dtype=dtype, generator=g)
    lens = torch.full((batch,), prefix, dtype=torch.int32, device=device)
    mask = chain_tree_mask(batch, n, device)
    dense = reference.dense_tree_mask(lens, mask, s, window)
    scale = dqk**-0.5
    q, k, v = q_hf.transpose(1, 2), k_hf.transpose(1, 2), v_hf.transpose(1, 2)

    def run_baseline():
        return reference.sdpa_dense_mask(q_hf, k_hf, v_hf, dense, scale)

    if page_size:
        blocks = -(-s // page_size)
        perm = torch.randperm(batch * blocks, generator=torch.Generator().manual_seed(0))
        table = perm.view(batch, blocks).to(device=device, dtype=torch.int32)
        pad = blocks * page_size - s

        def paged(cache):
            full = torch.nn.functional.pad(cache, (0, 0, 0, 0, 0, pad)).reshape(batch * blocks, page_size, hkv, -1)
            pages = torch.empty_like(full)
            pages[table.flatten().long()] = full
            return pages

        k_pages, v_pages = paged(k), paged(v)

        def run_op():
            return eagle3_ext.tree_attention_paged(q, k_pages, v_pages, table, lens, mask, scale, window)
    else:
        def run_op():
            return eagle3_ext.tree_attention(q, k, v, lens, mask, scale, window)

    torch.testing.assert_close(run_op().float(), run_baseline().transpose(1, 2).float(), atol=3e-2, rtol=3e-2)
    t = compare({"sdpa_dense_mask": run_baseline, "tree_attention": run_op}, device, budget_s=budget_s)
    base, op = t["sdpa_dense_mask"], t["tree_attention"]
    elem = torch.finfo(dtype).bits // 8
    keys = min(s, window + n) if window else s
    moved = (batch * keys * hkv * (dqk + dv) + batch * n * hq * (dqk + dv)) * elem
    flops = 2 * batch * hq * n * keys * (dqk + dv)
    return {
        "batch": batch, "prefix": prefix, "tree": n, "q_heads": hq, "kv_heads": hkv, "head_dim": dqk,
        "v_head_dim": dv, "window": window, "dtype": str(dtype).replace("torch.", ""), "page_size": page_size,
        **speed_figures(base, op, moved, flops),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", nargs="+", choices=sorted(DTYPES), default=["bf16"])
    parser.add_argument("--prefix", nargs="+", type=int)
    parser.add_argument("--tree", nargs="+", type=int)
    parser.add_argument("--batch", nargs="+", type=int)
    parser.add_argument("--paged", type=int, default=0, metavar="PAGE", help="read K/V from pages of this size")
    parser.add_argument("--heads", nargs=2, type=int, default=[HQ, HKV], metavar=("HQ", "HKV"))
    parser.add_argument("--head-dim", nargs="+", type=int, default=[D], metavar="D",
                        help="query/key head dim, and optionally a different value head dim (MLA: 192 128)")
    parser.add_argument("--window", type=int, default=0, help="sliding window in positions (0: none)")
    parser.add_argument("--budget", type=float, default=1.0, help="seconds of timing per shape")
    parser.add_argument("--quick", action="store_true", help="few small shapes, for a first look")
    parser.add_argument("--threads", type=int, help="CPU threads (torch.set_num_threads) for op and baseline")
    parser.add_argument("--out", help="write the JSON report here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible")
    grid = QUICK if args.quick else DEFAULTS[args.device]
    prefixes = args.prefix or grid["prefix"]
    trees = args.tree or grid["tree"]
    batches = args.batch or grid["batch"]
    if min(prefixes) < 0 or min(trees) <= 0 or min(batches) <= 0:
        parser.error("--prefix takes integers >= 0, --tree and --batch positive integers")
    if len(args.head_dim) > 2 or min(args.head_dim) <= 0 or min(args.heads) <= 0 or args.heads[0] % args.heads[1]:
        parser.error("--head-dim takes one or two positive integers; --heads HQ HKV with HQ a multiple of HKV")
    if args.window < 0:
        parser.error("--window takes an integer >= 0")
    dims = (args.head_dim[0], args.head_dim[-1])

    roofline = device_roofline(args.device)
    report = {
        "benchmark": "tree_attention", "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(), "build": eagle3_ext.build_info(), "roofline": roofline,
        "baseline": "F.scaled_dot_product_attention(enable_gqa=True) with a prebuilt dense bool mask",
        "results": [],
    }
    header = f"{'dtype':>5} {'B':>3} {'prefix':>6} {'N':>3} {'sdpa+mask ms':>13} {'tree ms':>9} {'speedup':>8} {'GB/s':>7} {'TFLOP/s':>8}"
    if roofline:
        header += f" {'%copy':>6}"
    print(header)
    for dtype_name in args.dtype:
        for batch in batches:
            for prefix in prefixes:
                for n in trees:
                    r = bench_shape(batch, prefix, n, DTYPES[dtype_name], args.device, args.budget, args.paged,
                                    tuple(args.heads), dims, args.window)
                    report["results"].append(r)
                    line = (f"{dtype_name:>5} {batch:>3} {prefix:>6} {n:>3} {r['baseline']['median_ms']:>13.3f} "
                            f"{r['op']['median_ms']:>9.3f} {r['speedup']:>7.2f}x {r['op_GBps']:>7.1f} {r['op_TFLOPs']:>8.3f}")
                    if roofline:
                        line += f" {100 * r['op_GBps'] / roofline['copy_GBps']:>5.0f}%"
                    print(line, flush=True)
    finish_report(report, "SDPA + dense mask", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
