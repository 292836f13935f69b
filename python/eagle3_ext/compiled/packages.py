"""A float32 target's compiled verify on CPU as AOTInductor packages kept on disk.

Inductor's freezing pass gives a float32 graph's GEMMs oneDNN-packed copies of the weights,
which its on-disk graph cache cannot store: with ``torch.compile`` every process compiled the
bundled target's verify graph again (tens of seconds on a small CPU). Here the same forward is exported
(``torch.export``) and built ahead of time with the same Inductor settings
(``aoti_compile_and_package``); the package, packed weights included, is a file that a later
process loads in a fraction of a second.

A package is built per (batch size, tree size, cache capacity), like the compiled graphs, and
stored under a key of everything it was built from (``package_key``): the weights' bytes, the
config, the shapes, the captured layers, the torch and transformers versions, the CPU's vector
ISA and the library's tracing code. Other weights, or another machine, get a package of their own.

The cache stays the generator's: each layer's ``keys``, ``values`` and ``cumulative_length``
are inputs of the exported forward, written in place as an eager forward writes them, and the
captured aux hidden states are outputs (the capture hooks are traced with the forward).
A target whose forward ``torch.export`` cannot trace (or AOTInductor cannot build) is
compiled with ``torch.compile`` instead, with a warning. CompileOptions' ``packages=False``
compiles with ``torch.compile`` always; its ``package_dir`` names the folder (default:
``eagle3_verify`` in Inductor's cache folder).
"""

from __future__ import annotations

import hashlib
import os
import platform
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from ..decoding.capture import AuxHiddenCapture
from ..decoding.verify_forward import tree_forward
from ..version import __version__

_TRACED_SOURCES = ("hf_attention.py", "decoding/verify_forward.py", "compiled/packages.py")


def package_dir(configured: Optional[Path] = None) -> Path:
    """Where packages are kept: ``configured`` (CompileOptions.package_dir), else ``eagle3_verify``
    in Inductor's cache folder."""
    if configured is not None:
        return Path(configured)
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir()) / "eagle3_verify"


def weights_digest(model: nn.Module) -> str:
    """A hash of ``model``'s parameters and buffers (names, dtypes, shapes and bytes)."""
    h = hashlib.blake2b(digest_size=16)
    for name, t in sorted(model.state_dict(keep_vars=False).items()):
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        if t.numel():
            h.update(t.view(-1).view(torch.uint8).numpy())   # hashed in place, not copied to bytes
    return h.hexdigest()


def package_key(weights: str, config_json: str, shapes: Tuple, aux_ids: Sequence[int],
                settings: Dict[str, object]) -> str:
    """The name of the package built from all of these and the machine's toolchain."""
    import transformers
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    root = Path(__file__).resolve().parent.parent
    h = hashlib.blake2b(digest_size=16)
    parts = (weights, config_json, shapes, tuple(aux_ids), sorted(settings.items()), torch.__version__,
             transformers.__version__, __version__, platform.machine(), str(pick_vec_isa()))
    h.update(repr(parts).encode())
    for source in _TRACED_SOURCES:
        h.update((root / source).read_bytes())
    return h.hexdigest()


class NoPackage(RuntimeError):
    """No package could be made of this target's verify forward: ``torch.export`` cannot trace
    it (code that export does not support) or AOTInductor failed to build it; ``torch.compile``
    can still compile it."""


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


class _VerifyForward(nn.Module):
    """The tree forward with the cache's tensors as inputs and the aux states as outputs."""

    def __init__(self, model: nn.Module, cache, capture: AuxHiddenCapture):
        super().__init__()
        self.model = model
        self.cache = cache
        self.capture = capture

    def forward(self, keys: List[torch.Tensor], values: List[torch.Tensor], lengths: List[torch.Tensor],
                input_ids, position_ids, tree_mask, cache_lens, tree_start):
        layers = self.cache.layers
        saved = [(layer.keys, layer.values, layer.cumulative_length) for layer in layers]
        try:
            for layer, k, v, n in zip(layers, keys, values, lengths):
                layer.keys, layer.values, layer.cumulative_length = k, v, n
            logits = tree_forward(self.model, self.cache, input_ids, position_ids, tree_mask, cache_lens, tree_start)
            return (logits, *self.capture.take())
        finally:
            for layer, (k, v, n) in zip(layers, saved):
                layer.keys, layer.values, layer.cumulative_length = k, v, n


def cache_inputs(cache) -> Tuple[List[torch.Tensor], List[torch.Tensor], List[torch.Tensor]]:
    """The StaticCache's tensors, as the package takes them."""
    layers = cache.layers
    return ([l.keys for l in layers], [l.values for l in layers], [l.cumulative_length for l in layers])


class PackagedVerify:
    """The verify forward of ``model`` through AOTInductor packages (module docstring), one per
    shape, built on first use unless one is on disk. ``settings``: Inductor's settings for
    the build; ``directory``: where the packages are kept (``package_dir``). ``builds``:
    packages this object built (not loaded)."""

    def __init__(self, model: nn.Module, settings: Dict[str, object], directory: Optional[Path] = None):
        self.model = model
        self.directory = package_dir(directory)
        self.settings = {k: v for k, v in settings.items() if k != "cpp_wrapper"}  # (AOTInductor is C++)
        self._weights = weights_digest(model)
        self._config = model.config.to_json_string()
        self._runners: Dict[Tuple, object] = {}
        self.builds = 0

    def path(self, shapes: Tuple, aux_ids: Sequence[int]) -> Path:
        return self.directory / f"verify-{package_key(self._weights, self._config, shapes, aux_ids, self.settings)}.pt2"

    def _runner(self, capture: AuxHiddenCapture, cache, args: Tuple):
        shapes = (tuple(args[0].shape), cache.layers[0].max_cache_len)
        runner = self._runners.get(shapes)
        if runner is None:
            path = self.path(shapes, capture.ids)
            if not path.exists():
                self._build(path, capture, cache, args)
            runner = torch._inductor.aoti_load_package(str(path))
            self._runners[shapes] = runner
        return runner

    def _build(self, path: Path, capture: AuxHiddenCapture, cache, args: Tuple) -> None:
        # Export mutates the cache as a call would: it runs on copies of the cache's tensors.
        inputs = tuple([t.clone() for t in ts] for ts in cache_inputs(cache))
        try:
            with capture:
                program = torch.export.export(_VerifyForward(self.model, cache, capture), inputs + tuple(args),
                                              strict=False)
        except Exception as e:  # any tracing failure: the caller compiles with torch.compile instead
            raise NoPackage(f"torch.export failed: {_first_line(e)}") from e
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written under a temporary name, then renamed: a process that finds the file finds all of it.
        fd, partial = tempfile.mkstemp(suffix=".pt2", prefix=path.stem + ".", dir=path.parent)
        os.close(fd)
        try:
            # (a copy: the build adds its own entries to the dict it is given)
            torch._inductor.aoti_compile_and_package(program, package_path=partial,
                                                     inductor_configs=dict(self.settings))
            os.replace(partial, path)
        except Exception as e:
            raise NoPackage(f"AOTInductor failed to build it: {_first_line(e)}") from e
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
        self.builds += 1

    def __call__(self, capture: AuxHiddenCapture, cache, *args) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        """``args``: input_ids, position_ids, tree_mask, cache_lens, tree_start. Returns the logits
        and the captured aux states; writes the cache in place."""
        runner = self._runner(capture, cache, args)
        out = runner(*cache_inputs(cache), *args)
        return out[0], list(out[1:])
