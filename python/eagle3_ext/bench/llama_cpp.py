"""The llama.cpp rows of ``eagle3 bench`` (batch 1, greedy), from a source build of llama.cpp
(``peers/llama_cpp_build.py``, made by benchmarks/build_llama_cpp.sh):

- ``llama_cpp``: the target converted to f32 by llama.cpp's own converter, plain decoding;
- ``llama_cpp_bf16``: the same in bf16;
- ``llama_cpp_eagle3``: the f32 target with this run's draft, converted to llama.cpp's EAGLE-3
  format unchanged, chain drafting (llama.cpp has no trees), without a confidence cut-off
  (``--spec-draft-p-min 0``, llama.cpp's default): the fastest of the ``draft_max``
  (``--spec-draft-n-max``) values, one server each, every value kept in ``sweep``. Its
  ``cross_check`` entry, a chain of ``CROSS_CHECK_DEPTH``, compares in acceptance with this
  library's chain of the same depth: a check of the draft and of the capture convention;
- ``llama_cpp_<type>``: the target's own GGUF file as given (SmolLM2's is Q4_1), another
  precision, reported apart. Where its server fails, it runs again with weight repacking off
  (``repack: False`` in the row, the first failure in ``repacked_run``): on a CPU with AMX this
  llama.cpp repacked the Q4_1 weights for its AMX kernels and died of SIGSEGV on the first product.

Every row decodes the token ids the other rows decode, with the bench's thread count. A row whose
server fails (exits, a crash included, or stops answering) is left out with the reason, the
others still run: llama.cpp built for this CPU's ISA has crashed on a quantized file there.
``identical`` (the new tokens equal Hugging Face's greedy ones) is checked for the f32 rows only;
other precisions report None. The acceptance length of a drafted row is tokens per target
forward: n / (n - accepted), each round emitting its accepted drafts and one token of its own.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, List, Optional, Sequence

from ..models.gguf_target import file_sha256
from ..models.smollm2_source import shipped_gguf
from ..peers.llama_cpp_build import LlamaCppBuild, convert_draft, convert_target, gguf_fields
from ..peers.llama_cpp_server import Completion, LlamaServer, ServerFailed

DRAFT_MAX = (1, 2, 3, 5)  # --spec-draft-n-max values tried for the llama_cpp_eagle3 row
CROSS_CHECK_DEPTH = 5     # the chain compared with this library's chain of the same depth
P_MIN = 0.0               # --spec-draft-p-min: no confidence cut-off (llama.cpp's default)


def _decode(server: LlamaServer, ids: List[List[int]], max_new_tokens: int) -> List[Completion]:
    server.complete(ids[0], 4)  # warm-up: the first request pays one-off allocations
    return [server.complete(p, max_new_tokens) for p in ids]


def _row(method: str, done: List[Completion], base_rate: float, base_outputs: Optional[List[List[int]]],
         **extra) -> Dict[str, Any]:
    tokens = sum(len(c.tokens) for c in done)
    seconds = sum(c.seconds for c in done)
    accepted = sum(c.accepted for c in done)
    rate = tokens / seconds
    row = {"method": method, "tokens_per_s": rate, "speedup": rate / base_rate,
           "acceptance_length": tokens / max(1, tokens - accepted),
           "identical": None if base_outputs is None else [c.tokens for c in done] == base_outputs, **extra}
    if any(c.drafted for c in done):
        row["drafted"] = sum(c.drafted for c in done)
        row["accepted"] = accepted
    return row


def source_gguf(target: Optional[str], target_dir: str) -> Optional[str]:
    """The GGUF file the target came from: ``target`` itself when it is one, else SmolLM2's shipped
    file when the converted directory records that file's content hash."""
    if target is not None and target.endswith(".gguf"):
        return target
    provenance = os.path.join(target_dir, "eagle3_gguf.json")
    if not os.path.isfile(provenance):
        return None
    with open(provenance) as f:
        sha256 = json.load(f).get("sha256")
    try:
        shipped = shipped_gguf()
    except OSError:
        return None
    return shipped if file_sha256(shipped) == sha256 else None


def _failure(e: ServerFailed) -> str:
    """One line for a row left out: the failure and the last line of the server's log."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0].rstrip(":") + (f"; its log ended: {lines[-1]}" if len(lines) > 1 else "")


def llama_cpp_rows(build: LlamaCppBuild, target_dir: str, draft_dir: str, draft, ids: List[List[int]],
                   max_new_tokens: int, base_outputs: List[List[int]], base_rate: float, threads: int,
                   gguf: Optional[str] = None, draft_max: Sequence[int] = DRAFT_MAX, progress: bool = True,
                   left_out: Optional[Dict[str, str]] = None) -> Dict[str, Dict[str, Any]]:
    """The rows above for batch-1 prompts ``ids``; speedups against ``base_rate`` (plain Hugging
    Face generate's tokens/s in the same run). A row whose server fails goes to ``left_out``
    (row name: why) instead."""
    context = max(len(p) for p in ids) + max_new_tokens + 16
    common = {"threads": threads, "llama_cpp": build.describe()}
    say = (lambda text: print(text, file=sys.stderr, flush=True)) if progress else (lambda text: None)
    failed = left_out if left_out is not None else {}

    def served(name: str, model: str, outputs: Optional[List[List[int]]], key: Optional[str] = None,
               **server_options) -> Optional[Dict]:
        try:
            with LlamaServer(build, model, threads, context, **server_options) as server:
                return _row(name, _decode(server, ids, max_new_tokens), base_rate, outputs)
        except ServerFailed as e:
            failed[key or name] = _failure(e)
            say(f"batch 1 {key or name} left out: {failed[key or name]}")
            return None

    rows: Dict[str, Dict[str, Any]] = {}
    f32 = convert_target(build, target_dir, "f32")
    if (row := served("llama_cpp", f32, base_outputs)) is not None:
        rows["llama_cpp"] = {**row, "gguf": os.path.basename(f32), **common}
    bf16 = convert_target(build, target_dir, "bf16")
    if (row := served("llama_cpp_bf16", bf16, None)) is not None:
        rows["llama_cpp_bf16"] = {**row, "gguf": os.path.basename(bf16), **common}
    draft_gguf = convert_draft(build, draft, draft_dir, target_dir, "f32")
    layers = gguf_fields(draft_gguf).get("eagle3.target_layers")
    sweep = {}
    for n in sorted(set(draft_max) | {CROSS_CHECK_DEPTH}):
        row = served(f"n_max_{n}", f32, base_outputs, key=f"llama_cpp_eagle3 --spec-draft-n-max {n}",
                     draft=draft_gguf, draft_max=n, p_min=P_MIN)
        if row is not None:
            sweep[f"n_max_{n}"] = row
            say(f"batch 1 llama_cpp_eagle3 n_max {n}: {row['tokens_per_s']:.1f} tokens/s, "
                f"acceptance length {row['acceptance_length']:.2f}")
    tried = [f"n_max_{n}" for n in draft_max if f"n_max_{n}" in sweep]
    cross_check = f"n_max_{CROSS_CHECK_DEPTH}"
    if tried:
        best = max(tried, key=lambda k: sweep[k]["tokens_per_s"])
        rows["llama_cpp_eagle3"] = {**sweep[best], "method": "llama_cpp_eagle3", "draft_max": int(best.split("_")[-1]),
                                    "p_min": P_MIN, "sweep": sweep,
                                    "cross_check": cross_check if cross_check in sweep else None,
                                    "draft_gguf": os.path.basename(draft_gguf), "target_layers": layers,
                                    "draft_aux_layers": list(draft.aux_layer_ids), **common}
    else:
        failed["llama_cpp_eagle3"] = "no --spec-draft-n-max value ran (each is left out with its reason)"
    if gguf is not None:
        kind = str(gguf_fields(gguf).get("general.file_type", "gguf"))
        name = f"llama_cpp_{_file_type_name(gguf)}"
        row = served(name, gguf, None)
        if row is None:  # again without repacking: llama.cpp's AMX path for it has crashed on some CPUs
            crash = failed.pop(name)
            say(f"batch 1 {name}: again with --no-repack")
            row = served(name, gguf, None, key=name, repack=False)
            if row is not None:
                row["repack"] = False
                row["repacked_run"] = crash
            else:
                failed[name] = f"{crash}; without repacking (--no-repack): {failed[name]}"
        if row is not None:
            rows[name] = {**row, "gguf": os.path.basename(gguf), "file_type": kind, **common}
    return rows


def _file_type_name(path: str) -> str:
    """q4_1 for SmolLM2-135M-Instruct.Q4_1.gguf: the quantization named in the file name, else 'gguf'."""
    stem = os.path.basename(path)[:-len(".gguf")]
    tail = stem.rsplit(".", 1)[-1] if "." in stem else ""
    return tail.lower() if tail and tail[0] in "qQfFbB" and any(ch.isdigit() for ch in tail) else "gguf"
