"""Converts a Hugging Face Llama-family checkpoint to an f32 GGUF file for llama.cpp.

    python benchmarks/convert_to_gguf.py TARGET_DIR OUT.gguf

The converter itself is ``eagle3_ext.peers.gguf_export`` (``eagle3 bench`` uses it for its
llama.cpp row); this is its command line.
"""

import argparse
import sys

from eagle3_ext.peers.gguf_export import export_gguf


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("target", help="Hugging Face model directory (config.json, safetensors, tokenizer.json)")
    p.add_argument("out", help="the GGUF file to write")
    args = p.parse_args(argv)
    try:
        print(export_gguf(args.target, args.out))
    except (ValueError, OSError) as e:
        print(f"convert_to_gguf: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
