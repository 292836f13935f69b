"""Benchmark eagle3.fused_aux_fc against torch.cat + F.linear, measured in the same run.

    python benchmarks/bench_fused_aux_fc.py [--device cpu|cuda] [--dtype bf16 fp32 ...]
        [--hidden 1024 4096] [--rows 1 4 16 ...] [--quick] [--out FILE.json]

Prints one table row per shape (baseline ms, op ms, speedup = baseline / op; on a GPU also
the op's GB/s and TFLOP/s against the measured copy bandwidth and bf16 matmul rate) and
writes every figure as JSON.
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
from timing import compare, device_roofline, finish_report, rotating, speed_figures  # noqa: E402

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
DEFAULT_HIDDEN = {"cpu": [1024, 4096], "cuda": [4096, 7168]}
DEFAULT_ROWS = [1, 4, 16, 64, 128, 512, 2048, 8192]
QUICK_ROWS = [1, 4, 16, 64, 256]
K = 3  # EAGLE-3 captures three layers
L2_BYTES = 64 << 20


def bench_shape(rows: int, hidden: int, dtype: torch.dtype, device: str, budget_s: float):
    elem = torch.finfo(dtype).bits // 8
    w_bytes = K * hidden * hidden * elem

    def make():
        aux = [torch.randn(rows, hidden, device=device, dtype=dtype) for _ in range(K)]
        w = torch.randn(hidden, K * hidden, device=device, dtype=dtype) * (K * hidden) ** -0.5
        return aux, w

    # On a GPU, cycle through weight copies larger than L2 together so none is served from cache.
    sets = rotating(make, 2 * L2_BYTES, w_bytes) if device == "cuda" else [make()]
    state = {"i": 0}

    def next_set():
        state["i"] = (state["i"] + 1) % len(sets)
        return sets[state["i"]]

    def run_baseline():
        aux, w = next_set()
        return reference.cat_linear(aux, w, None)

    def run_op():
        aux, w = next_set()
        return eagle3_ext.fused_aux_fc(aux, w, None)

    aux, w = sets[0]
    torch.testing.assert_close(
        eagle3_ext.fused_aux_fc(aux, w, None).float(), reference.fused_aux_fc(aux, w, None).float(),
        atol=5e-2, rtol=5e-2)
    t = compare({"cat_linear": run_baseline, "fused_aux_fc": run_op}, device, budget_s=budget_s)
    base, op = t["cat_linear"], t["fused_aux_fc"]
    flops = 2 * rows * hidden * K * hidden
    moved = w_bytes + K * rows * hidden * elem + rows * hidden * elem
    return {"rows": rows, "hidden": hidden, "k": K, "dtype": str(dtype).replace("torch.", ""),
            **speed_figures(base, op, moved, flops)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", nargs="+", choices=sorted(DTYPES), default=["bf16"])
    parser.add_argument("--hidden", nargs="+", type=int)
    parser.add_argument("--rows", nargs="+", type=int)
    parser.add_argument("--budget", type=float, default=1.5, help="seconds of timing per shape")
    parser.add_argument("--quick", action="store_true", help="few small shapes, for a first look")
    parser.add_argument("--out", help="write the JSON report here")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible")
    if any(h <= 0 for h in args.hidden or []) or any(r <= 0 for r in args.rows or []):
        parser.error("--hidden and --rows take positive integers")

    hiddens = args.hidden or ([1024] if args.quick else DEFAULT_HIDDEN[args.device])
    rows_list = args.rows or (QUICK_ROWS if args.quick else DEFAULT_ROWS)
    roofline = device_roofline(args.device)
    report = {
        "benchmark": "fused_aux_fc", "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(), "build": eagle3_ext.build_info(), "roofline": roofline,
        "results": [],
    }
    header = f"{'dtype':>5} {'H':>5} {'T':>5} {'cat+linear ms':>14} {'fused ms':>10} {'speedup':>8}"
    if roofline:
        header += f" {'GB/s':>7} {'%HBM':>5} {'TFLOP/s':>8}"
    print(header)
    for dtype_name in args.dtype:
        for hidden in hiddens:
            for rows in rows_list:
                r = bench_shape(rows, hidden, DTYPES[dtype_name], args.device, args.budget)
                report["results"].append(r)
                line = (f"{dtype_name:>5} {hidden:>5} {rows:>5} {r['baseline']['median_ms']:>14.3f} "
                        f"{r['op']['median_ms']:>10.3f} {r['speedup']:>7.2f}x")
                if roofline:
                    line += (f" {r['op_GBps']:>7.0f} {100 * r['op_GBps'] / roofline['copy_GBps']:>4.0f}%"
                             f" {r['op_TFLOPs']:>8.1f}")
                print(line, flush=True)
    finish_report(report, "cat + linear", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
