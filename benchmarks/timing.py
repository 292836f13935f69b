"""Timing helpers shared by the Python benchmarks.

Baseline and op are measured in the same run and interleaved (baseline, op, baseline, op,
...), so that drift on a shared, noisy machine hits both alike; the figure reported is the
ratio of medians.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch


@dataclass
class Timing:
    median_s: float
    min_s: float
    max_s: float
    runs: int

    def as_dict(self) -> Dict[str, float]:
        return {"median_ms": self.median_s * 1e3, "min_ms": self.min_s * 1e3,
                "max_ms": self.max_s * 1e3, "runs": self.runs}


def _time_once(fn: Callable[[], object], device: str) -> float:
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def compare(fns: Dict[str, Callable[[], object]], device: str, budget_s: float = 2.0,
            min_runs: int = 3, max_runs: int = 50, warmup: int = 1) -> Dict[str, Timing]:
    """Times each function in `fns`, interleaved, within about `budget_s` seconds in all."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    if device == "cuda":
        torch.cuda.synchronize()
    samples: Dict[str, List[float]] = {name: [] for name in fns}
    started = time.perf_counter()
    for i in range(max_runs):
        for name, fn in fns.items():
            samples[name].append(_time_once(fn, device))
        if i + 1 >= min_runs and time.perf_counter() - started > budget_s:
            break
    return {name: Timing(statistics.median(s), min(s), max(s), len(s)) for name, s in samples.items()}


def speed_figures(base: Timing, op: Timing, moved_bytes: float, flops: float) -> Dict[str, object]:
    """The figures every op benchmark reports for one shape: both timings, the speedup of the
    op over the baseline, and the op's (and baseline's) achieved bandwidth and FLOP rate."""
    return {"baseline": base.as_dict(), "op": op.as_dict(), "speedup": base.median_s / op.median_s,
            "op_GBps": moved_bytes / op.median_s / 1e9, "op_TFLOPs": flops / op.median_s / 1e12,
            "baseline_GBps": moved_bytes / base.median_s / 1e9}


def device_roofline(device: str) -> Dict[str, float]:
    """Measured copy bandwidth (GB/s, bytes read + written) and bf16 matmul rate (TFLOP/s)."""
    if device != "cuda":
        return {}
    n_bytes = 2 << 30
    src = torch.empty(n_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy = compare({"copy": lambda: dst.copy_(src)}, "cuda", budget_s=0.5)["copy"]
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm = compare({"mm": lambda: a @ b}, "cuda", budget_s=1.0)["mm"]
    del src, dst, a, b
    torch.cuda.empty_cache()
    return {"copy_GBps": 2 * n_bytes / copy.median_s / 1e9,
            "bf16_matmul_TFLOPs": 2 * 8192**3 / mm.median_s / 1e12}


def rotating(make: Callable[[], object], total_bytes: int, bytes_each: int, cap: int = 8) -> List[object]:
    """Several copies of an input set so that weights cycle through more memory than L2 holds."""
    count = max(1, min(cap, -(-total_bytes // max(1, bytes_each))))
    return [make() for _ in range(count)]


def finish_report(report: Dict[str, object], baseline_name: str, out: Optional[str]) -> None:
    """Prints the worst speedup of report["results"] over `baseline_name`; writes the JSON to `out`."""
    worst = min(r["speedup"] for r in report["results"])
    print(f"worst speedup over {baseline_name}: {worst:.2f}x")
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {out}")
