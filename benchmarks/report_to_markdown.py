"""Turn a benchmark JSON report into a Markdown table for docs/benchmarks.md.

    python benchmarks/report_to_markdown.py REPORT.json [REPORT.json ...]

Reads reports of eagle3_bench (the native binary) and of the Python benchmarks
(bench_fused_aux_fc.py, bench_tree_attention.py, bench_tree_ops.py, bench_generator.py,
gpu_check.sh's gpu_report.json) and prints one table per report.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, List


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    if isinstance(value, dict) and "median_ms" in value:
        return _fmt(value["median_ms"])
    if isinstance(value, dict) and "median" in value:
        return _fmt(value["median"])
    return str(value)


def table(rows: List[Dict[str, Any]]) -> str:
    """A Markdown table over the keys of the rows (nested timings shown by their median)."""
    if not rows:
        return "(no results)\n"
    keys: List[str] = []
    for row in rows:
        for key, value in row.items():
            if key not in keys and not isinstance(value, (list, dict)) or (isinstance(value, dict) and
                                                                           ("median_ms" in value or "median" in value)):
                if key not in keys:
                    keys.append(key)
    lines = ["| " + " | ".join(keys) + " |", "| " + " | ".join("---" for _ in keys) + " |"]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row.get(k, "")) for k in keys) + " |")
    return "\n".join(lines) + "\n"


def render(report: Dict[str, Any]) -> str:
    if "benchmarks" in report:  # gpu_check.sh's combined report
        parts = [f"CUDA tests exit code: {report.get('cuda_tests_exit_code')}\n"]
        for name, sub in report["benchmarks"].items():
            parts.append(f"### {name}\n\n" + render(sub))
        return "\n".join(parts)
    title = report.get("benchmark", "benchmark")
    head = f"**{title}** on {report.get('device', '?')}"
    if report.get("roofline"):
        roof = report["roofline"]
        head += f" (measured copy {roof.get('copy_GBps', 0):.0f} GB/s, bf16 matmul {roof.get('bf16_matmul_TFLOPs', 0):.0f} TFLOP/s)"
    return head + "\n\n" + table(report.get("results", []))


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    for path in args:
        with open(path) as f:
            print(render(json.load(f)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
