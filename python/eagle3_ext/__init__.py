"""eagle3_ext: EAGLE-3 speculative decoding kernels and driver for PyTorch.

Importing the package loads torch first, then the native module, which registers every
``torch.ops.eagle3.*`` op (CPU kernels always, CUDA kernels when they were compiled).
"""

from __future__ import annotations

import torch  # noqa: F401  (the native module links against the torch already loaded)

from . import _C  # noqa: F401  (registers the eagle3 ops)
from . import ops, reference
from .ops import fused_aux_fc, tree_attention, tree_attention_paged

__version__ = "0.1.0"


def build_info() -> dict:
    """How the native module was built and what it runs on.

    Returns a dict with ``torch_version`` (the torch running now),
    ``compiled_torch_version`` (the torch it was compiled against), ``cuda_compiled``
    (whether CUDA kernels are in the module), ``cuda_archs`` (e.g. ``["90a", "80"]``) and
    ``cuda_available`` (whether torch sees a GPU now).
    """
    info = dict(_C.build_info())
    info["torch_version"] = torch.__version__
    info["torch_cuda_version"] = torch.version.cuda
    info["cuda_available"] = torch.cuda.is_available()
    info["cuda_archs"] = list(info["cuda_archs"])
    return info


__all__ = [
    "build_info", "fused_aux_fc", "ops", "reference", "tree_attention", "tree_attention_paged",
    "__version__",
]
