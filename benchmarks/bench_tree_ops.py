"""Benchmark the tree ops against the Python reference and a batched pure-PyTorch version.

    python benchmarks/bench_tree_ops.py [--device cpu|cuda] [--bs 1 8 64 256] [--n 8 32 64]
        [--vocab 32000 128256] [--quick] [--out FILE.json]

For every (bs, N, vocab): build_tree_kernel_efficient (op vs reference loops),
verify_tree_greedy and tree_speculative_sampling_target_only (op vs reference loops vs the
batched tensor-op baseline). The loop reference is slow, so it is timed on at most
--reference-bs requests and scaled to bs (marked "reference_scaled"). On a GPU the sampling
op is also compared with the time to read target_probs once at the measured copy bandwidth.
Prints a table and writes every figure as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

import torch

import eagle3_ext
from eagle3_ext import reference
from eagle3_ext.decoding import tree

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import compare, device_roofline  # noqa: E402

DEFAULT_BS = [1, 8, 64, 256]
DEFAULT_N = [8, 32, 64]
DEFAULT_VOCAB = [32000, 128256]
# (topk, depth) per tree size: the shapes EAGLE-3 deployments use.
TREE_SHAPES = {8: (4, 4), 32: (8, 6), 64: (8, 8)}


def tree_shape(n: int):
    return TREE_SHAPES.get(n, (8, max(2, n.bit_length())))


def make_case(bs: int, n: int, vocab: int, device: str, seed: int = 0):
    """A realistic tree (EAGLE-2 steps from random draft distributions) and target outputs."""
    topk, depth = tree_shape(n)
    g = torch.Generator().manual_seed(seed)
    steps, scores = [], None
    for step in range(depth):
        rows = bs if step == 0 else bs * topk
        p, t = torch.topk(torch.softmax(torch.randn(rows, 256, generator=g) * 2, -1), topk, dim=-1)
        _, scores, _, info = tree.expand_frontier(step, p, t, scores)
        steps.append(info)
    t = tree.build_draft_tree(torch.zeros(bs, dtype=torch.long), torch.full((bs,), 100), steps, n)
    logits = torch.randn(bs, n, vocab, device=device)
    logits[..., :256] += 4  # the draft's tokens are likely under the target too
    target_probs = torch.softmax(logits, -1)
    del logits
    return dict(
        steps=steps, tree=t, topk=topk, depth=depth,
        candidates=t.draft_tokens.to(device),
        lists=[x.to(device) for x in (t.retrive_index, t.retrive_next_token, t.retrive_next_sibling)],
        target_predict=target_probs.argmax(-1),
        target_probs=target_probs,
        # Reused across runs: a run writes the target's value at its rejected tokens, the same
        # ones every time (same coins), so reuse changes no result and times no fill.
        draft_probs=torch.zeros_like(target_probs),
        coins=torch.rand(bs, n, device=device), final_coins=torch.rand(bs, device=device),
    )


def build_inputs(case, bs, n, device):
    steps = case["steps"]
    scores = torch.cat([s.scores.flatten(1) for s in steps], dim=1)
    selected = torch.sort(torch.topk(scores, n - 1, dim=-1).indices).values
    parents = torch.cat([s.parents for s in steps[:-1]], dim=1).long()
    seq_lens = torch.full((bs,), 100, dtype=torch.long)

    inputs = [x.to(device) for x in (parents, selected, seq_lens)]
    mask = torch.ones(bs * n * n, dtype=torch.bool, device=device)
    outs = [torch.full((bs, n), -1, dtype=torch.long, device=device) for _ in range(3)]
    positions = torch.empty(bs * n, dtype=torch.long, device=device)
    return _runner(lambda rows: (*(x[:rows] for x in inputs), mask[: rows * n * n], positions[: rows * n],
                                 *(x[:rows] for x in outs), case["topk"], case["depth"], n, 1))


def verify_runner(case, bs, n, device, sampling: bool):
    depth = case["depth"]
    predicts = torch.full((bs * n,), -1, dtype=torch.int32, device=device)
    accept_index = torch.full((bs, depth + 1), -1, dtype=torch.int32, device=device)
    accept_num = torch.zeros(bs, dtype=torch.int32, device=device)

    def args(rows):
        common = (predicts[: rows * n], accept_index[:rows], accept_num[:rows], case["candidates"][:rows],
                  *(x[:rows] for x in case["lists"]))
        if not sampling:
            return (*common, case["target_predict"][:rows])
        return (*common, case["coins"][:rows], case["final_coins"][:rows], case["target_probs"][:rows],
                case["draft_probs"][:rows], 1.0, 1.0, True)

    return _runner(args)


def _runner(make_args):
    """run(fn, rows) calls fn on the first `rows` requests. Outputs are allocated and sliced once
    per row count, so that only the call is timed."""
    cache = {}

    def run(fn, rows):
        if rows not in cache:
            cache[rows] = make_args(rows)
        fn(*cache[rows])

    return run


def time_op(name, run, op, baselines, bs, ref_bs, device, budget):
    fns = {"op": lambda: run(op, bs)}
    for label, fn in baselines.items():
        rows = ref_bs if label == "reference" else bs
        fns[label] = (lambda f=fn, r=rows: run(f, r))
    t = compare(fns, device, budget_s=budget, min_runs=2, max_runs=20)
    out = {"op": t["op"].as_dict()}
    for label in baselines:
        scale = bs / ref_bs if label == "reference" else 1.0
        ms = t[label].median_s * scale
        out[label] = {**t[label].as_dict(), "scaled_median_ms": ms * 1e3}
        out[f"speedup_vs_{label}"] = ms / t["op"].median_s
    out["reference_scaled"] = ref_bs < bs
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--bs", nargs="+", type=int)
    parser.add_argument("--n", nargs="+", type=int)
    parser.add_argument("--vocab", nargs="+", type=int)
    parser.add_argument("--reference-bs", type=int, default=4, help="requests the loop reference is timed on")
    parser.add_argument("--max-gb", type=float, default=None,
                        help="skip shapes whose target_probs exceed this (default 2 on CPU, 40 on CUDA)")
    parser.add_argument("--budget", type=float, default=0.5, help="seconds of timing per op and shape")
    parser.add_argument("--quick", action="store_true", help="bs 1 8, N 8 32, vocab 32000")
    parser.add_argument("--threads", type=int, help="CPU threads (torch.set_num_threads)")
    parser.add_argument("--out", help="write the JSON report here")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible")
    if args.threads:
        torch.set_num_threads(args.threads)
    bss = args.bs or ([1, 8] if args.quick else DEFAULT_BS)
    ns = args.n or ([8, 32] if args.quick else DEFAULT_N)
    vocabs = args.vocab or ([32000] if args.quick else DEFAULT_VOCAB)
    max_bytes = (args.max_gb or (40.0 if args.device == "cuda" else 2.0)) * 2**30
    roofline = device_roofline(args.device)
    report = {
        "benchmark": "tree_ops", "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(), "build": eagle3_ext.build_info(), "roofline": roofline,
        "results": [],
    }
    print(f"{'op':>9} {'bs':>4} {'N':>3} {'vocab':>6} {'op ms':>9} {'ref ms':>10} {'batched ms':>10} "
          f"{'x ref':>8} {'x batched':>9}")
    for vocab in vocabs:
        for n in ns:
            for bs in bss:
                if bs * n * vocab * 4 > max_bytes:
                    print(f"skip bs={bs} N={n} vocab={vocab}: target_probs over {max_bytes / 2**30:.0f} GB")
                    continue
                case = make_case(bs, n, vocab, args.device)
                ref_bs = min(bs, args.reference_bs)
                row = {"bs": bs, "n": n, "vocab": vocab, "topk": case["topk"], "depth": case["depth"]}
                if vocab == vocabs[0]:  # the build and greedy ops do not read the vocabulary
                    row["build"] = time_op("build", build_inputs(case, bs, n, args.device),
                                           torch.ops.eagle3.build_tree_kernel_efficient.default,
                                           {"reference": reference.build_tree_kernel_efficient},
                                           bs, ref_bs, args.device, args.budget)
                    row["greedy"] = time_op("greedy", verify_runner(case, bs, n, args.device, False),
                                            torch.ops.eagle3.verify_tree_greedy.default,
                                            {"reference": reference.verify_tree_greedy,
                                             "batched": reference.verify_tree_greedy_batched},
                                            bs, ref_bs, args.device, args.budget)
                row["sampling"] = time_op("sampling", verify_runner(case, bs, n, args.device, True),
                                          torch.ops.eagle3.tree_speculative_sampling_target_only.default,
                                          {"reference": reference.tree_speculative_sampling_target_only,
                                           "batched": reference.tree_speculative_sampling_batched},
                                          bs, ref_bs, args.device, args.budget)
                if roofline:
                    read_s = bs * n * vocab * 4 / (roofline["copy_GBps"] * 1e9)
                    row["sampling"]["read_target_probs_once_ms"] = read_s * 1e3
                    row["sampling"]["vs_read_once"] = row["sampling"]["op"]["median_ms"] / (read_s * 1e3)
                report["results"].append(row)
                for name in ("build", "greedy", "sampling"):
                    if name not in row:
                        continue
                    r = row[name]
                    batched = r.get("batched", {}).get("scaled_median_ms", float("nan"))
                    print(f"{name:>9} {bs:>4} {n:>3} {vocab:>6} {r['op']['median_ms']:>9.3f} "
                          f"{r['reference']['scaled_median_ms']:>10.2f} {batched:>10.3f} "
                          f"{r['speedup_vs_reference']:>7.0f}x {r.get('speedup_vs_batched', float('nan')):>8.1f}x",
                          flush=True)
                del case
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
