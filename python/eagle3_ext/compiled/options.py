"""``CompileOptions``: how ``compile=`` builds a generator's graphs (compiled/graphs.py).

``compile=True`` is ``CompileOptions()``, the settings a user gets; ``False`` or ``None``
compiles nothing. The options reach the compiled verify (compiled/verify.py), its
AOTInductor packages (compiled/packages.py) and the compiled draft
(compiled/draft.py) as an argument: nothing there reads the environment. An environment
variable can only override a field, once, when a generator is built (``with_environment``).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Dict, Optional, Union

from ..errors import BadInputError, BadInputTypeError
from ..validation import boolean, path

# The environment variable that overrides each field.
ENVIRONMENT: Dict[str, str] = {
    "autotune": "EAGLE3_COMPILE_AUTOTUNE",
    "cpp_wrapper": "EAGLE3_COMPILE_CPP_WRAPPER",
    "cuda_graphs": "EAGLE3_COMPILE_CUDA_GRAPHS",
    "packages": "EAGLE3_COMPILE_PACKAGES",
    "package_dir": "EAGLE3_PACKAGE_DIR",
}


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    """How ``SpeculativeGenerator(compile=...)`` compiles the verify forward and the draft's side
    of a round. ``compile=True`` is ``CompileOptions()``.

    Fields (default; the environment variable that overrides it):
        autotune: None. On CPU, Inductor autotunes each graph's GEMMs (its C++ GEMM template
            against ATen's): compiles several times slower, for faster graphs where ATen's GEMMs
            over a few rows are slow. None autotunes where that was measured to pay (``autotunes``
            in compiled/verify.py: CPUs without AVX-512); False keeps ATen's GEMMs.
            ``EAGLE3_COMPILE_AUTOTUNE=0`` / ``=1``.
        cpp_wrapper: True. On CPU, a graph's kernels are launched from C++ rather than from
            Python: faster calls, slower compiles. ``EAGLE3_COMPILE_CPP_WRAPPER=0`` / ``=1``.
        cuda_graphs: True. On CUDA, the graphs run as CUDA graphs (Inductor's
            ``triton.cudagraphs``): a round's kernels are replayed rather than launched one by
            one. ``EAGLE3_COMPILE_CUDA_GRAPHS=0`` / ``=1``.
        packages: True. On CPU, a float32 target's verify is built as an AOTInductor package
            kept on disk, which a later process loads instead of compiling
            (compiled/packages.py); False compiles it with ``torch.compile`` as the other
            dtypes are. ``EAGLE3_COMPILE_PACKAGES=0`` / ``=1``.
        package_dir: None, or the folder of those packages (a str or os.PathLike; default:
            ``eagle3_verify`` in Inductor's cache folder). ``EAGLE3_PACKAGE_DIR=<folder>``.

    A field of the wrong type raises a TypeError naming it. The environment variables are
    overrides for a run whose code cannot be changed: when one is set (and not empty), it
    replaces its field whatever the code passed; it is read when a generator is built
    (``with_environment``), and a switch other than 0 or 1 raises a ValueError naming it.
    """

    autotune: Optional[bool] = None
    cpp_wrapper: bool = True
    cuda_graphs: bool = True
    packages: bool = True
    package_dir: Optional[Union[str, os.PathLike]] = None

    def __post_init__(self) -> None:
        boolean("CompileOptions.autotune", self.autotune, allow_none=True)
        for name in ("cpp_wrapper", "cuda_graphs", "packages"):
            boolean(f"CompileOptions.{name}", getattr(self, name))
        if self.package_dir is not None:
            object.__setattr__(self, "package_dir", Path(path("CompileOptions.package_dir", self.package_dir)))

    def with_environment(self) -> "CompileOptions":
        """These options with the environment variables that are set (``ENVIRONMENT``) in place of
        their fields."""
        changes: Dict[str, Any] = {}
        for name, variable in ENVIRONMENT.items():
            value = os.environ.get(variable, "")
            if not value:
                continue
            if name == "package_dir":
                changes[name] = value
            elif value in ("0", "1"):
                changes[name] = value == "1"
            else:
                raise BadInputError(f"{variable} (it overrides CompileOptions.{name}) must be 0 or 1, got {value!r}")
        return dataclasses.replace(self, **changes) if changes else self


def compile_options(value: Any, name: str = "compile") -> Optional[CompileOptions]:
    """A ``compile=`` argument as options: True is ``CompileOptions()``, False and None are None
    (nothing compiled), a CompileOptions is itself; anything else raises a TypeError naming
    ``name``."""
    if value is True:
        return CompileOptions()
    if value is False or value is None:
        return None
    if isinstance(value, CompileOptions):
        return value
    raise BadInputTypeError(f"{name} must be True, False, None or a CompileOptions, got {value!r} "
                            f"({type(value).__name__})")
