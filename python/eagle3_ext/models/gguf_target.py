"""GGUF targets: a ``.gguf`` file converted once into a Hugging Face model directory.

Wherever a target directory is accepted, a ``.gguf`` file is accepted too. transformers'
GGUF loader dequantizes the file into an ordinary model (SmolLM2's Q4_1 file becomes a
``LlamaForCausalLM``), but such a model refuses ``save_pretrained`` and is slow to
load. So the file is converted once into a plain directory (safetensors in the requested
dtype, tokenizer with its chat template, generation config), kept in a cache keyed by the
file's content hash and the dtype, and every later run loads that directory.

The cache lives under ``cache_dir``, else ``$EAGLE3_CACHE_DIR/gguf``, else
``$XDG_CACHE_HOME/eagle3_ext/gguf`` (``~/.cache/eagle3_ext/gguf``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from typing import Optional

import torch

from ..dtypes import DTYPES, check_dtype_name
from ..errors import BadInputError, BadInputTypeError, MissingPathError, PathExistsError

logger = logging.getLogger(__name__)

GGUF_SUFFIX = ".gguf"
PROVENANCE_FILE = "eagle3_gguf.json"
HASH_CHUNK = 1 << 22


def is_gguf(path) -> bool:
    """True for an existing regular file whose name ends in ``.gguf``."""
    return isinstance(path, (str, os.PathLike)) and str(path).endswith(GGUF_SUFFIX) and os.path.isfile(path)


def check_gguf_file(path) -> None:
    """A clear error unless ``path`` is an existing file named ``*.gguf``."""
    if not isinstance(path, (str, os.PathLike)):
        raise BadInputTypeError(f"gguf file must be a path, got {type(path).__name__}")
    if not os.path.exists(path):
        raise MissingPathError(f"gguf file {os.fspath(path)} does not exist")
    if not is_gguf(path):
        raise BadInputError(f"gguf file {os.fspath(path)} is not a file named *{GGUF_SUFFIX}")


def default_cache_dir() -> str:
    """Where converted GGUF targets are kept unless a ``cache_dir`` is given."""
    root = os.environ.get("EAGLE3_CACHE_DIR")
    if root:
        return os.path.join(root, "gguf")
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "eagle3_ext", "gguf")


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(HASH_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def gguf_architecture(path: str) -> str:
    """The file's ``general.architecture`` (e.g. "llama")."""
    from gguf import GGUFReader

    field = GGUFReader(path).fields.get("general.architecture")
    if field is None:
        raise BadInputError(f"{path} has no general.architecture field: not a model GGUF file")
    return field.contents()


def check_supported(path: str) -> str:
    """The file's architecture, or a ValueError naming it when transformers cannot dequantize it."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    arch = gguf_architecture(path)
    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        raise BadInputError(f"{path}: GGUF architecture {arch!r} cannot be loaded by transformers' GGUF loader "
                            f"(it reads {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))}); convert the model to a "
                            "Hugging Face directory another way and pass that directory")
    return arch


def convert(path: str, out_dir: str, dtype: str = "float32") -> str:
    """Writes the Hugging Face directory of GGUF file ``path`` to ``out_dir`` (which must not
    exist yet) with weights in ``dtype``; returns ``out_dir``. The directory is written under a
    temporary name beside it and renamed, so it is whole or absent."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_gguf_file(path)
    check_dtype_name("dtype", dtype)
    if os.path.exists(out_dir):
        raise PathExistsError(f"out_dir {out_dir} exists already; name a new directory")
    arch = check_supported(path)
    folder, name = os.path.split(os.path.abspath(path))
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    # A GGUF-loaded model is marked quantized and refuses save_pretrained; a fresh model of the
    # same config without that mark takes its (dequantized) weights and saves as usual. Left in
    # the saved config, the mark would make transformers treat the weights as GGUF-packed.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype])
    model.load_state_dict({k: v.to(DTYPES[dtype]) for k, v in loaded.state_dict().items()}, assign=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".converting-", dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # a directory like any other, not mkdtemp's private one
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        with open(os.path.join(tmp, PROVENANCE_FILE), "w") as f:
            json.dump({"gguf_file": name, "sha256": file_sha256(path), "architecture": arch, "dtype": dtype,
                       "model_class": type(model).__name__}, f, indent=2)
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("converted %s (%s) into %s", path, arch, out_dir)
    return out_dir


def cached_target(path: str, dtype: str = "float32", cache_dir: Optional[str] = None) -> str:
    """The converted directory of GGUF file ``path`` in ``dtype``, converting it on first use."""
    check_dtype_name("dtype", dtype)
    check_gguf_file(path)
    root = cache_dir or default_cache_dir()
    out = os.path.join(root, f"{file_sha256(path)[:20]}-{dtype}")
    if os.path.exists(os.path.join(out, PROVENANCE_FILE)):
        return out
    logger.warning("converting %s into %s once (later runs load the converted copy)", path, out)
    try:
        return convert(path, out, dtype)
    except OSError:  # another process converted it meanwhile (its rename came first)
        if os.path.exists(os.path.join(out, PROVENANCE_FILE)):
            return out
        raise


def resolve_target(target, dtype: str = "float32", cache_dir: Optional[str] = None):
    """``target`` itself, unless it is a ``.gguf`` file: then its converted directory."""
    if isinstance(target, (str, os.PathLike)) and is_gguf(target):
        return cached_target(os.fspath(target), dtype, cache_dir)
    return target
