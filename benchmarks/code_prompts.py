"""Held-out code prompts: function openings (signature, docstring, first lines) from a Python
source tree the bundled target never saw in training (its corpus is the interpreter's standard
library). By default the tree is this library's own package.

    python benchmarks/code_prompts.py [--src DIR] [--count 12] [--chars 400] --out code_prompts.jsonl
    eagle3 bench --prompts code_prompts.jsonl
"""

import argparse
import ast
import json
import os


def function_openings(src: str, count: int, chars: int):
    """``count`` openings of at least ``chars`` characters, spread evenly over the functions of
    the tree (sorted by path, then line), each cut at a line end after ``chars`` characters."""
    found = []
    for root, _, files in sorted(os.walk(src)):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(root, name)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            lines = text.splitlines(keepends=True)
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 12:
                    body = "".join(lines[node.lineno - 1:node.end_lineno])
                    cut = body.find("\n", chars)
                    if cut > 0:
                        found.append((path, node.lineno, body[:cut + 1]))
    found.sort()
    if len(found) < count:
        raise ValueError(f"{src} has {len(found)} functions long enough, fewer than --count {count}")
    step = len(found) / count
    return [found[int(i * step)][2] for i in range(count)]


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", default=os.path.join(here, "..", "python", "eagle3_ext"))
    parser.add_argument("--count", type=int, default=12)
    parser.add_argument("--chars", type=int, default=400)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with open(args.out, "w") as f:
        for prompt in function_openings(args.src, args.count, args.chars):
            f.write(json.dumps({"prompt": prompt}) + "\n")


if __name__ == "__main__":
    main()
