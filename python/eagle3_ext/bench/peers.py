"""The stronger baselines of ``eagle3 bench`` at batch 1, beside plain generate:

- ``hf_static_compile``: Hugging Face generate with a static cache and ``torch.compile`` of the
  decode forward (Inductor; on CPU too). The cache length is one value for the whole prompt
  set, so the decode step has one shape and compiles once; the prefill runs eagerly, as
  Hugging Face runs it. The compile time is reported apart from the timed calls, and so is
  any recompilation during them.
- ``llama_cpp``: llama.cpp's greedy decoding of the same target converted to GGUF, when
  llama-cpp-python is installed (see ``eagle3_ext.peers``).

Each row has the same fields as the other rows; speedups stay against plain generate.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List

import torch

from ..peers.llama_cpp import LlamaCppGreedy, gguf_path
from .baseline import hf_generate

CACHE_LENGTH_MULTIPLE = 64  # the static cache's length, rounded up: prompt sets of similar length share it


def _row(method: str, tokens: int, seconds: float, base_rate: float, identical: bool, **extra) -> Dict[str, Any]:
    rate = tokens / seconds
    return {"method": method, "tokens_per_s": rate, "speedup": rate / base_rate, "acceptance_length": None,
            "identical": identical, **extra}


def compiled_baseline_row(target, tok, groups: List[List[str]], max_new_tokens: int, base_outputs: List[List[int]],
                          base_rate: float) -> Dict[str, Any]:
    """Batch-1 groups through Hugging Face generate with a static cache and a compiled decode step;
    the row keeps its ``outputs`` for the caller's divergence check (a compiled graph may round
    differently in reduced precision)."""
    from torch._dynamo.utils import counters
    from transformers.generation import CompileConfig

    longest = max(len(tok(g[0]).input_ids) for g in groups)
    cache_len = -(-(longest + max_new_tokens) // CACHE_LENGTH_MULTIPLE) * CACHE_LENGTH_MULTIPLE
    config = CompileConfig(fullgraph=False, dynamic=False, mode="default")
    config._compile_all_devices = True  # Hugging Face compiles on accelerators only unless told
    kwargs = dict(cache_implementation="static", max_cache_len=cache_len, compile_config=config)
    started = time.perf_counter()
    hf_generate(target, tok, groups[0], 4, **kwargs)  # compiles the decode step
    compile_s = time.perf_counter() - started
    graphs_before = counters["stats"]["unique_graphs"]
    tokens, seconds, outputs = 0, 0.0, []
    for group in groups:
        out, t = hf_generate(target, tok, group, max_new_tokens, **kwargs)
        tokens += len(out[0])
        seconds += t
        outputs.append(out[0])
    return _row("hf_static_compile", tokens, seconds, base_rate, outputs == base_outputs, outputs=outputs,
                compile_s=compile_s,
                recompiles=counters["stats"]["unique_graphs"] - graphs_before, cache_length=cache_len)


def llama_cpp_row(target_dir: str, target, tok, groups: List[List[str]], max_new_tokens: int,
                  base_outputs: List[List[int]], base_rate: float) -> Dict[str, Any]:
    """llama.cpp's greedy decoding of batch-1 groups from the same token ids (the GGUF conversion,
    once per checkpoint, is timed apart as ``convert_s``)."""
    started = time.perf_counter()
    path = gguf_path(target_dir)
    convert_s = time.perf_counter() - started
    ids = [tok(g[0]).input_ids for g in groups]
    context = max(len(i) for i in ids) + max_new_tokens
    eos = target.generation_config.eos_token_id
    runner = LlamaCppGreedy(path, context, eos if isinstance(eos, int) else None)
    runner.generate(ids[0], 4)  # warm-up
    tokens, seconds, same = 0, 0.0, True
    for prompt_ids, ref in zip(ids, base_outputs):
        out, t = runner.generate(prompt_ids, max_new_tokens)
        tokens += len(out)
        seconds += t
        same &= out == ref
    return _row("llama_cpp", tokens, seconds, base_rate, same, gguf=path, convert_s=convert_s,
                threads=torch.get_num_threads())
