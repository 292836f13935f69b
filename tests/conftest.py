import pytest
import torch

import eagle3_ext  # noqa: F401  (registers torch.ops.eagle3)

HAS_CUDA = torch.cuda.is_available() and eagle3_ext.build_info()["cuda_compiled"]

DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param(
        "cuda",
        id="cuda",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU and the CUDA kernels"),
        ],
    ),
]

DTYPES = [
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.float16, id="fp16"),
    pytest.param(torch.bfloat16, id="bf16"),
]

# Tolerances against an fp32 reference for outputs of magnitude ~1.
TOLERANCES = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.float16: dict(atol=4e-3, rtol=4e-3),
    torch.bfloat16: dict(atol=3e-2, rtol=2e-2),
}
