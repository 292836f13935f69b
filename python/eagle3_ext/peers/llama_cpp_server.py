"""llama.cpp's server (from ``llama_cpp_build``) as a timed greedy decoder, with or without an
EAGLE-3 draft (``--spec-type draft-eagle3``).

Prompts go over as token ids, so llama.cpp decodes exactly the tokens Hugging Face decodes (no
second tokenization, no template). Greedy is ``top_k=1`` with temperature 0 and no other
sampler. Times are the server's own (prompt processing plus generation, without HTTP), so
they compare with the in-process timings of the other rows.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import List, Optional, Sequence

from .llama_cpp_build import LlamaCppBuild

STARTUP_TIMEOUT_S = 180.0   # loading a model and, with a draft, warming both up
REQUEST_TIMEOUT_S = 600.0


@dataclass
class Completion:
    """One greedy completion: the new tokens and the server's timings."""

    tokens: List[int]
    seconds: float              # prompt processing + generation, as the server measured them
    drafted: int = 0            # draft tokens proposed (with a draft)
    accepted: int = 0           # of which the target accepted


class ServerFailed(RuntimeError):
    """llama-server exited (a crash included), did not become ready, or stopped answering; the
    message names the exit code (and signal) and ends with the tail of its log."""


def _exit_text(code: int) -> str:
    """``exited with code -4 (SIGILL)``: the code, and the signal that ended it where there is one."""
    try:
        name = f" ({signal.Signals(-code).name})" if code < 0 else ""
    except ValueError:
        name = ""
    return f"exited with code {code}{name}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """A llama-server process for one model (and draft), used as a context manager.

    Args:
        model: the target GGUF file.
        threads: CPU threads for generation and for prompt processing.
        context: the context length in tokens (prompt + new tokens of the longest request).
        draft: an EAGLE-3 draft GGUF (from ``convert_draft``), or None for plain decoding.
        draft_max: draft tokens per round at most (``--spec-draft-n-max``).
        p_min: llama.cpp's confidence cut-off (``--spec-draft-p-min``): a chain stops at a draft
            token of lower probability; 0 (llama.cpp's default) drafts ``draft_max`` tokens a round.
        repack: False passes ``--no-repack``: quantized weights stay in the file's layout instead of
            being repacked for the CPU's wider kernels (AMX among them, whose repacked Q4_1 path
            has crashed this llama.cpp on its first product).

    Both are fixed per process: this llama.cpp's server ignores the per-request speculative
    fields (its schema compiles them out), so each setting needs a server of its own.
    """

    def __init__(self, build: LlamaCppBuild, model: str, threads: int, context: int, draft: Optional[str] = None,
                 draft_max: int = 5, p_min: float = 0.0, repack: bool = True):
        self.command = [build.binary("llama-server"), "-m", model, "-t", str(threads), "-tb", str(threads),
                        "-c", str(context), "-np", "1", "--host", "127.0.0.1", "--no-webui"]
        if not repack:
            self.command.append("--no-repack")
        if draft is not None:
            self.command += ["-md", draft, "--spec-type", "draft-eagle3", "--spec-draft-n-max", str(draft_max),
                             "--spec-draft-p-min", str(p_min), "-td", str(threads), "-tbd", str(threads)]
        self.process: Optional[subprocess.Popen] = None
        self.url = ""
        self.log = None

    def __enter__(self) -> "LlamaServer":
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="llama-server-", suffix=".log", delete=False)
        self.process = subprocess.Popen(self.command + ["--port", str(port)], stdout=self.log,
                                        stderr=subprocess.STDOUT)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self._log_tail()
                self.__exit__(None, None, None)
                raise ServerFailed(f"llama-server {_exit_text(self.process.returncode)}:\n{tail}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        tail = self._log_tail()
        self.__exit__(None, None, None)
        raise ServerFailed(f"llama-server did not become ready in {STARTUP_TIMEOUT_S:.0f} s:\n{tail}")

    def __exit__(self, *exc) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.log is not None:
            self.log.close()
            os.unlink(self.log.name)
            self.log = None

    def _log_tail(self, lines: int = 15) -> str:
        if self.log is None:
            return ""
        self.log.flush()
        with open(self.log.name) as f:
            return "".join(f.readlines()[-lines:])

    def complete(self, prompt_ids: Sequence[int], max_new_tokens: int) -> Completion:
        """Greedy decoding of ``prompt_ids`` up to ``max_new_tokens`` (or an end-of-generation
        token, kept)."""
        body = {"prompt": [int(t) for t in prompt_ids], "n_predict": int(max_new_tokens), "temperature": 0.0,
                "top_k": 1, "samplers": ["top_k"], "cache_prompt": False, "return_tokens": True, "stream": False}
        request = urllib.request.Request(f"{self.url}/completion", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as r:
                out = json.load(r)
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            state = _exit_text(self.process.returncode) if self.process.poll() is not None else "is running"
            raise ServerFailed(f"llama-server stopped answering ({e}; it {state}):\n{self._log_tail()}") from e
        timings = out.get("timings", {})
        return Completion(tokens=[int(t) for t in out.get("tokens", [])],
                          seconds=(timings.get("prompt_ms", 0.0) + timings.get("predicted_ms", 0.0)) / 1e3,
                          drafted=int(timings.get("draft_n", 0)), accepted=int(timings.get("draft_n_accepted", 0)))
