import os

import pytest
import torch

import eagle3_ext


def test_build_info_reports_versions_and_cuda():
    info = eagle3_ext.build_info()
    assert info["torch_version"] == torch.__version__
    assert info["compiled_torch_version"] == torch.__version__
    assert isinstance(info["cuda_compiled"], bool)
    if info["cuda_compiled"]:
        assert info["cuda_archs"], "CUDA kernels compiled for no architecture"
    else:
        assert info["cuda_archs"] == []
    assert isinstance(info["sm90_wgmma"], bool)
    if info["sm90_wgmma"]:
        assert "90a" in info["cuda_archs"]


@pytest.mark.skipif(os.environ.get("EAGLE3_EXPECT_CUDA") != "1",
                    reason="set by `make test` with TORCH=cuda, where the CUDA kernels must build")
def test_cuda_kernels_compiled_when_expected():
    # The CUDA build of torch plus nvcc must never silently produce a CPU-only module.
    assert torch.version.cuda, "EAGLE3_EXPECT_CUDA=1 but torch is a CPU-only build"
    info = eagle3_ext.build_info()
    assert info["cuda_compiled"]
    # `make` installs the CUTLASS/CuTe headers, so an sm_90a build carries the wgmma kernel.
    if "90a" in info["cuda_archs"]:
        assert info["sm90_wgmma"], "sm_90a was compiled without fused_aux_fc's wgmma kernel"


def test_ops_registered_in_eagle3_namespace():
    assert hasattr(torch.ops.eagle3, "fused_aux_fc")
    schema = str(torch.ops.eagle3.fused_aux_fc.default._schema)
    assert schema == (
        "eagle3::fused_aux_fc(Tensor[] aux_hidden, Tensor weight, Tensor? bias) -> Tensor"
    )
