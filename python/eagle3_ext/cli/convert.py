"""``eagle3 convert``: a .gguf target as a Hugging Face model directory."""

from __future__ import annotations

import json

from ..dtypes import DTYPES
from . import types as T


def add_parser(sub) -> None:
    p = sub.add_parser("convert", help="convert a .gguf target into a Hugging Face model directory")
    p.add_argument("gguf", type=T.readable_file, help="the .gguf file")
    p.add_argument("out", help="the directory to write (must not exist)")
    p.add_argument("--dtype", default="float32", choices=list(DTYPES), help="dtype of the written weights")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")


def run(args) -> int:
    from ..models.gguf_target import convert

    out = convert(args.gguf, args.out, args.dtype)
    print(json.dumps({"out": out, "dtype": args.dtype}) if args.json else f"wrote {out}")
    return 0
