import inspect
import os
import re

import pytest
import torch
from torch._library import simple_registry

import eagle3_ext
import eagle3_ext.ops


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


def test_the_version_is_the_installed_distribution_s():
    from importlib.metadata import version
    assert eagle3_ext.__version__ == version("eagle3_ext")  # pyproject.toml's, as installed


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


REGISTRATION = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "csrc", "registration.cpp")


def _declared_schemas():
    """{op name: FunctionSchema} of every ``m.def("...")`` in csrc/registration.cpp, the one place
    the op schemas are written, parsed by torch's own schema parser."""
    with open(REGISTRATION) as f:
        source = re.sub(r"//[^\n]*", "", f.read())  # the comments quote argument lists too
    schemas = {}
    for call in re.finditer(r'\bm\.def\(\s*((?:"(?:[^"\\]|\\.)*"\s*)+)\)', source):
        text = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', call.group(1)))  # adjacent literals joined
        schema = torch._C.parse_schema(f"eagle3::{text}")
        schemas[schema.name.split("::", 1)[1]] = schema
    return schemas


def test_the_installed_ops_are_the_ones_the_sources_declare():
    """Every op csrc/registration.cpp declares is in torch.ops.eagle3 with that schema, and no
    other: a module built from older sources (the package is installed, not linked: csrc/ edited
    without `make install`) or a lost registration fails here, naming the op. Each op has a CPU
    kernel, a CUDA kernel where the CUDA kernels were compiled, a fake kernel (what torch.compile
    traces) and a typed wrapper in eagle3_ext.ops taking the schema's arguments in its order
    (the wrapper passes them on by position; options of its own are keyword-only)."""
    declared = _declared_schemas()
    assert "fused_aux_fc" in declared and len(declared) >= 7, f"parsed only {sorted(declared)} from {REGISTRATION}"
    assert sorted(torch.ops.eagle3) == sorted(declared), "the installed module differs from csrc/: run make install"
    cuda = eagle3_ext.build_info()["cuda_compiled"]
    for name, schema in declared.items():
        qualified = f"eagle3::{name}"
        installed = getattr(torch.ops.eagle3, name).default._schema
        assert str(installed) == str(schema), f"{name}: installed {installed}, csrc/ declares {schema}"
        assert torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "CPU"), f"{name} has no CPU kernel"
        if cuda:
            assert torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "CUDA"), f"{name} has no CUDA kernel"
        assert simple_registry.singleton.find(qualified).fake_impl.kernel is not None, f"{name} has no fake kernel"
        wrapper = inspect.signature(getattr(eagle3_ext.ops, name)).parameters
        positional = [p for p in wrapper if wrapper[p].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
        assert positional == [a.name for a in schema.arguments], f"eagle3_ext.ops.{name}{list(wrapper)}"
        assert all(wrapper[p].kind is inspect.Parameter.KEYWORD_ONLY for p in wrapper if p not in positional)
        for a in schema.arguments:
            if a.default_value is not None:
                assert wrapper[a.name].default == a.default_value, f"{name}: default of {a.name}"


# sgl-kernel's declarations of the tree ops (sgl-kernel/csrc/common_extension.cc, sglang commit
# 0063ef14c8f9), which these are a drop-in for: the arguments in order, "!" for those it declares
# written, ":int" / ":float" / ":bool" for the scalars (the rest are tensors). Its trailing
# cuda_stream argument is left out: these ops run on the current stream.
SGL_KERNEL = {
    "build_tree_kernel_efficient": "parent_list selected_index verified_seq_len tree_mask! positions! retrive_index! "
                                   "retrive_next_token! retrive_next_sibling! topk:int depth:int draft_token_num:int "
                                   "tree_mask_mode:int",
    "verify_tree_greedy": "predicts! accept_index! accept_token_num! candidates retrive_index retrive_next_token "
                          "retrive_next_sibling target_predict",
    "tree_speculative_sampling_target_only": "predicts! accept_index! accept_token_num! candidates retrive_index "
                                             "retrive_next_token retrive_next_sibling uniform_samples "
                                             "uniform_samples_for_final_sampling target_probs draft_probs "
                                             "threshold_single:float threshold_acc:float deterministic:bool",
}
# What these ops declare written beyond sgl-kernel (README: it writes draft_probs without saying so).
ALSO_WRITTEN = {"tree_speculative_sampling_target_only": {"draft_probs"}}


@pytest.mark.parametrize("name", sorted(SGL_KERNEL))
def test_the_tree_ops_take_sgl_kernels_arguments(name):
    """An engine swaps them in for sgl-kernel's: the same arguments in the same order with the
    same types, every output sgl-kernel writes declared written, and nothing returned."""
    theirs = [(arg.rstrip("!").split(":")[0], arg.rstrip("!").split(":")[1] if ":" in arg else "Tensor",
               arg.endswith("!")) for arg in SGL_KERNEL[name].split()]
    schema = getattr(torch.ops.eagle3, name).default._schema
    ours = [(a.name, str(a.type), bool(a.alias_info and a.alias_info.is_write)) for a in schema.arguments]
    assert [o[:2] for o in ours] == [t[:2] for t in theirs]
    written = {n for n, _, w in ours if w}
    assert written == {n for n, _, w in theirs if w} | ALSO_WRITTEN.get(name, set())
    assert list(schema.returns) == []
