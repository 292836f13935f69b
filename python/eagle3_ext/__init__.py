"""eagle3_ext: EAGLE-3 speculative decoding kernels and driver for PyTorch.

Importing the package loads torch first, then the native module, which registers every
``torch.ops.eagle3.*`` op (CPU kernels always, CUDA kernels when they were compiled).
"""

from __future__ import annotations

import torch  # noqa: F401  (the native module links against the torch already loaded)

from . import _C  # noqa: F401  (registers the eagle3 ops)
from . import ops, reference
from .api import CompileOptions, SpeculativeGenerateOutput, SpeculativeGenerator, TreeConfig
from .api.custom_generate import custom_generate_path
from .draft import AuxLayerResolution, Eagle3DraftConfig, Eagle3DraftModel, resolve_aux_layer_ids
from .ops import (
    build_tree_kernel_efficient,
    fused_aux_fc,
    tree_speculative_sampling_draft_probs,
    tree_speculative_sampling_target_only,
    tree_attention,
    tree_attention_paged,
    verify_tree_greedy,
)
from .version import __version__


def build_info() -> dict:
    """How the native module was built and what it runs on.

    Returns a dict with ``torch_version`` (the torch running now),
    ``compiled_torch_version`` (the torch it was compiled against), ``cuda_compiled``
    (whether CUDA kernels are in the module), ``cuda_archs`` (e.g. ``["90a", "80"]``),
    ``sm90_wgmma`` (whether fused_aux_fc's TMA + wgmma kernel for Hopper is in it) and
    ``cuda_available`` (whether torch sees a GPU now).
    """
    info = dict(_C.build_info())
    info["torch_version"] = torch.__version__
    info["torch_cuda_version"] = torch.version.cuda
    info["cuda_available"] = torch.cuda.is_available()
    info["cuda_archs"] = list(info["cuda_archs"])
    return info


__all__ = [
    "AuxLayerResolution",
    "CompileOptions",
    "Eagle3DraftConfig",
    "Eagle3DraftModel",
    "SpeculativeGenerateOutput",
    "SpeculativeGenerator",
    "TreeConfig",
    "build_info",
    "build_tree_kernel_efficient",
    "custom_generate_path",
    "fused_aux_fc",
    "ops",
    "reference",
    "resolve_aux_layer_ids",
    "tree_speculative_sampling_draft_probs",
    "tree_speculative_sampling_target_only",
    "tree_attention",
    "tree_attention_paged",
    "verify_tree_greedy",
    "__version__",
]
