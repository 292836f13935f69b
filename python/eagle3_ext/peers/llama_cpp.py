"""llama.cpp as a peer of ``eagle3 bench``: the target converted to GGUF and decoded greedily by
llama-cpp-python on the same machine, in the same run, from the same token ids.

Optional: ``available()`` says whether llama-cpp-python and gguf are installed and the target
converts; the bench leaves the row out with that reason otherwise.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from typing import List, Optional, Sequence, Tuple

import torch

from .gguf_export import check_convertible, export_gguf


def missing_reason(target_dir: str) -> Optional[str]:
    """None when the llama.cpp row can run for ``target_dir``, otherwise why not."""
    import json

    for module in ("llama_cpp", "gguf"):
        try:
            __import__(module)
        except ImportError:
            return f"{module} is not installed (pip install llama-cpp-python gguf)"

    with open(os.path.join(target_dir, "config.json")) as f:
        try:
            check_convertible(json.load(f))
        except ValueError as e:
            return str(e)
    return None


def checkpoint_key(target_dir: str) -> str:
    """16 hex digits naming a checkpoint: its directory and its weight and config files' names,
    sizes and modification times."""
    digest = hashlib.sha256(os.path.realpath(target_dir).encode())
    for name in sorted(os.listdir(target_dir)):
        if name.endswith((".safetensors", ".json")):
            st = os.stat(os.path.join(target_dir, name))
            digest.update(f"{name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def gguf_path(target_dir: str, cache_dir: Optional[str] = None) -> str:
    """The target as GGUF, converted once per checkpoint and kept in ``cache_dir``. The key is
    the directory and each weight / config file's name, size and modification time, not its
    content: reading a large target's weights again on every bench run would cost more than the
    conversion saves."""
    cache_dir = cache_dir or os.path.join(tempfile.gettempdir(), "eagle3_gguf")
    os.makedirs(cache_dir, exist_ok=True)
    path = os.path.join(cache_dir, f"{checkpoint_key(target_dir)}-f32.gguf")
    if not os.path.exists(path):
        partial = f"{path}.{os.getpid()}.partial"
        export_gguf(target_dir, partial)
        os.replace(partial, path)
    return path


class LlamaCppGreedy:
    """Greedy decoding of one GGUF model with llama-cpp-python, one prompt at a time."""

    def __init__(self, path: str, context: int, eos_token_id: Optional[int], threads: Optional[int] = None):
        from llama_cpp import Llama

        self.eos = eos_token_id
        threads = threads or torch.get_num_threads()
        self.llm = Llama(model_path=path, n_ctx=context, n_batch=min(context, 512), n_threads=threads,
                         n_threads_batch=threads, verbose=False)

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int) -> Tuple[List[int], float]:
        """(new tokens, seconds): greedy, ending at EOS (included) or ``max_new_tokens``."""
        self.llm.reset()
        out: List[int] = []
        started = time.perf_counter()
        # temp 0 is llama.cpp's greedy sampler; repeat_penalty 1 leaves the logits untouched.
        for token in self.llm.generate(list(prompt_ids), temp=0.0, repeat_penalty=1.0, reset=True):
            out.append(int(token))
            if len(out) >= max_new_tokens or token == self.eos:
                break
        return out, time.perf_counter() - started
