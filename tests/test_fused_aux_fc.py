import os
import re
import subprocess
import sys

import pytest
import torch

import eagle3_ext
from conftest import CAPPED_BUILDS, DEVICES, DTYPES, TOLERANCES, calls_after_a_first, cpu_flags, op_error
from eagle3_ext import fused_aux_fc, ops, reference


def make_inputs(k, rows, hidden, out_features, dtype, device, bias=True, seed=0, lead=None):
    g = torch.Generator().manual_seed(seed)
    shape = (*(lead or ()), rows, hidden)
    aux = [torch.randn(shape, generator=g).to(dtype=dtype, device=device) for _ in range(k)]
    scale = (k * hidden) ** -0.5
    weight = (torch.randn(out_features, k * hidden, generator=g) * scale).to(dtype=dtype, device=device)
    b = torch.randn(out_features, generator=g).to(dtype=dtype, device=device) if bias else None
    return aux, weight, b


def check_against_reference(aux, weight, bias):
    out = fused_aux_fc(aux, weight, bias)
    expected = reference.fused_aux_fc(aux, weight, bias)
    assert out.dtype == aux[0].dtype and out.shape == expected.shape
    torch.testing.assert_close(out.float(), expected.float(), **TOLERANCES[aux[0].dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [1, 2, 3, 4], ids=lambda k: f"k{k}")
@pytest.mark.parametrize("rows", [1, 7, 64, 300], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("hidden", [40, 37], ids=lambda h: f"H{h}")
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_matches_reference(device, dtype, k, rows, hidden, bias):
    aux, weight, b = make_inputs(k, rows, hidden, 24, dtype, device, bias)
    check_against_reference(aux, weight, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 15, 16, 17, 24, 25, 32, 33, 64, 65, 100, 128, 129],
                         ids=lambda t: f"T{t}")
def test_kernel_paths_and_tile_edges(device, dtype, rows):
    # Row counts around the CPU streaming kernel's tiles and thresholds (bf16 streams up to
    # 24 rows, runs the transposed GEMM up to 64, the row-tile GEMM beyond) and the CUDA
    # decode tiles (one tile of 16 / 32 / 64 / 128 rows up to T = 128) and the prefill tile
    # beyond; 67 output features leave partial feature tiles; H=136 is a multiple of 8 (vector
    # path on CUDA) but not of 16 or 32 (masked tails on CPU).
    aux, weight, b = make_inputs(3, rows, 136, 67, dtype, device)
    check_against_reference(aux, weight, b)


@pytest.mark.parametrize("isa", CAPPED_BUILDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden", [(1, 37), (2, 136), (3, 40), (5, 37), (16, 136), (17, 37), (65, 40),
                                         (130, 37)], ids=lambda v: str(v))
def test_capped_cpu_builds_match_reference(cpu_isa, isa, dtype, rows, hidden):
    # Each streaming build the CPU runs (avx2 on an AVX-512 machine too), and ATen's GEMMs
    # (generic): odd and even row counts around the AVX2 build's 2-row tiles and the 64-row
    # block, hidden sizes with 8-lane and 16-lane tails, a partial feature tile (67).
    cpu_isa(isa)
    aux, weight, b = make_inputs(3, rows, hidden, 67, dtype, "cpu", seed=rows)
    check_against_reference(aux, weight, b)
    aux, weight, _ = make_inputs(1, rows, hidden, 9, dtype, "cpu", bias=False, seed=rows + 1)
    check_against_reference(aux, weight, None)


def test_the_cpu_isa_cap_applies_from_the_next_call(cpu_isa):
    # Two fp32 rows stream on an AVX2 or AVX-512 CPU; capped at "generic" they run ATen's GEMMs.
    aux, weight, _ = make_inputs(3, 2, 64, 16, torch.float32, "cpu", bias=False)

    def gemms():
        return calls_after_a_first(fused_aux_fc, (aux, weight, None), ("aten::mm", "aten::addmm_"))[1]

    cpu_isa("generic")
    assert ops.get_cpu_isa() == "generic" and gemms() > 0
    cpu_isa("avx512")  # a cap above what the CPU has: its widest build
    assert ops.get_cpu_isa() == "avx512"
    if {"avx2", "fma", "f16c"} <= set(cpu_flags()):
        assert gemms() == 0
    cpu_isa(None)
    assert ops.get_cpu_isa() is None


@pytest.mark.parametrize("env, first, error", [("generic", "generic", None), ("", None, None),
                                               ("sse", None, "EAGLE3_CPU_ISA .* must be generic, avx2 or avx512")])
def test_eagle3_cpu_isa_is_the_first_cap_only(env, first, error):
    """EAGLE3_CPU_ISA is read once, as the first cap (a bad name raises, naming it); set_cpu_isa
    replaces it."""
    code = ("from eagle3_ext import ops\n"
            "try:\n    print(ops.get_cpu_isa())\nexcept ValueError as e:\n    print(e)\n"
            "ops.set_cpu_isa('avx2'); print(ops.get_cpu_isa())")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "EAGLE3_CPU_ISA": env},
                         capture_output=True, text=True, check=True).stdout.splitlines()
    if error is None:
        assert out[0] == str(first)
    else:
        assert re.search(error, out[0]), out
    assert out[1] == "avx2"


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_several_packed_row_tiles(bias):
    # 1400 rows of 3 x 1024 bf16 exceed the CPU's packing budget (8 MiB): two balanced row
    # tiles, each packed into the same scratch and multiplied on its own.
    aux, weight, b = make_inputs(3, 1400, 1024, 8, torch.bfloat16, "cpu", bias)
    check_against_reference(aux, weight, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows", [2, 17, 128], ids=lambda t: f"T{t}")
def test_split_k_decode_shape(device, rows):
    # Long K and up to 128 rows: the CUDA launcher streams W once (one tile of all the rows),
    # splits K across CTAs and reduces the partials.
    aux, weight, b = make_inputs(3, rows, 2048, 96, torch.bfloat16, device)
    check_against_reference(aux, weight, b)


HALF_DTYPES = [pytest.param(torch.float16, id="fp16"), pytest.param(torch.bfloat16, id="bf16")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("k", [1, 3, 4], ids=lambda k: f"k{k}")
@pytest.mark.parametrize("rows,hidden,out_features", [(129, 128, 67), (300, 192, 256), (520, 64, 130)],
                         ids=["T129-H128-N67", "T300-H192-N256", "T520-H64-N130"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_prefill_tiles_hidden_multiple_of_64(device, dtype, k, rows, hidden, out_features, bias):
    # More than 128 rows with H a multiple of 64: on Hopper (sm_90a builds) the TMA + wgmma
    # kernel, whose K tiles switch descriptor at every segment boundary; partial row and
    # feature tiles at the edges. Elsewhere the mma.sync prefill tiles or the CPU GEMMs.
    aux, weight, b = make_inputs(k, rows, hidden, out_features, dtype, device, bias)
    check_against_reference(aux, weight, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("pad", [64, 8, 3], ids=lambda p: f"pad{p}")
def test_prefill_tiles_row_strided_segments(device, dtype, pad):
    # Segments that are column slices of wider buffers (row stride H + pad, different per
    # segment): TMA takes row strides that are multiples of 8 elements (pad 64, 8); pad 3 must
    # take another kernel and still be right.
    g = torch.Generator().manual_seed(2)
    rows, hidden = 200, 128
    aux = [torch.randn(rows, hidden + pad * (s + 1), generator=g).to(dtype=dtype, device=device)[:, s:s + hidden]
           for s in range(3)]
    assert all(not x.is_contiguous() for x in aux)
    weight = (torch.randn(96, 3 * hidden, generator=g) * (3 * hidden) ** -0.5).to(dtype=dtype, device=device)
    check_against_reference(aux, weight, None)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_prefill_tiles_broadcast_segment(device, dtype):
    # A segment that is one row expanded over T (row stride 0) cannot be described to TMA;
    # it must take another kernel and still be right.
    g = torch.Generator().manual_seed(3)
    rows, hidden = 200, 128
    aux = [torch.randn(rows, hidden, generator=g).to(dtype=dtype, device=device) for _ in range(2)]
    aux.append(torch.randn(1, hidden, generator=g).to(dtype=dtype, device=device).expand(rows, hidden))
    weight = (torch.randn(72, 3 * hidden, generator=g) * (3 * hidden) ** -0.5).to(dtype=dtype, device=device)
    check_against_reference(aux, weight, None)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_sm90_wgmma_kernel_is_what_hopper_runs():
    # Names what the prefill tests above exercise on this machine, so a Hopper run that
    # silently used the fallback kernel is visible.
    info = eagle3_ext.build_info()
    hopper = torch.cuda.get_device_capability() == (9, 0)
    if hopper and "90a" in info["cuda_archs"]:
        assert info["sm90_wgmma"]
    else:
        pytest.skip(f"wgmma kernel not applicable here (capability {torch.cuda.get_device_capability()}, "
                    f"archs {info['cuda_archs']})")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_leading_dims_flatten(device, dtype):
    aux, weight, b = make_inputs(3, 5, 48, 16, dtype, device, lead=(2, 3))
    out = fused_aux_fc(aux, weight, b)
    assert out.shape == (2, 3, 5, 16)
    check_against_reference(aux, weight, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_non_contiguous_inputs(device, dtype):
    g = torch.Generator().manual_seed(1)
    base = torch.randn(3, 40, 2 * 48, generator=g).to(dtype=dtype, device=device)
    # Strided along the hidden dim, a transposed view, and a row-strided slice.
    aux = [base[0, :, ::2], base[1].t().contiguous().t()[:, :48], base[2, :, 48:]]
    assert not aux[0].is_contiguous() and not aux[2].is_contiguous()
    weight = (torch.randn(3 * 48, 20, generator=g) / 12).to(dtype=dtype, device=device).t()
    assert not weight.is_contiguous()
    check_against_reference(aux, weight, None)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_rows(device):
    aux, weight, b = make_inputs(2, 0, 16, 8, torch.float32, device)
    out = fused_aux_fc(aux, weight, b)
    assert out.shape == (0, 8)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_opcheck(device, dtype):
    for bias in (True, False):
        aux, weight, b = make_inputs(3, 5, 24, 8, dtype, device, bias)
        torch.library.opcheck(torch.ops.eagle3.fused_aux_fc.default, (aux, weight, b))


class AuxProjection(torch.nn.Module):
    def __init__(self, weight, bias):
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.bias = torch.nn.Parameter(bias, requires_grad=False)

    def forward(self, a, b, c):
        return torch.relu(fused_aux_fc([a, b, c], self.weight, self.bias)) + 1


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    aux, weight, b = make_inputs(3, 6, 32, 16, torch.float32, device)
    module = AuxProjection(weight, b)
    compiled = torch.compile(module, fullgraph=True)
    torch.testing.assert_close(compiled(*aux), module(*aux))
    torch.testing.assert_close(
        compiled(*aux), torch.relu(reference.fused_aux_fc(aux, weight, b)) + 1, **TOLERANCES[torch.float32]
    )



@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph_backward(device):
    # The gradients live in C++ (the Autograd kernel); a compiled training step must trace
    # through them and agree with autograd of the reference.
    aux, weight, b = make_inputs(3, 5, 16, 8, torch.float32, device)
    leaves = [t.clone().requires_grad_() for t in [*aux, weight, b]]
    ref_leaves = [t.detach().clone().requires_grad_() for t in leaves]

    def loss(x0, x1, x2, w, bias):
        return (fused_aux_fc([x0, x1, x2], w, bias) ** 2).sum()

    torch.compile(loss, fullgraph=True)(*leaves).backward()
    (reference.fused_aux_fc(ref_leaves[:3], ref_leaves[3], ref_leaves[4]) ** 2).sum().backward()
    for got, want in zip(leaves, ref_leaves):
        torch.testing.assert_close(got.grad, want.grad, atol=1e-4, rtol=1e-4)


# --- errors --------------------------------------------------------------------------------


def test_error_extra_captured_layer_names_numbers_and_cause():
    aux, _, _ = make_inputs(4, 2, 56, 8, torch.float32, "cpu")
    weight = torch.randn(8, 3 * 56)
    with pytest.raises(ValueError) as e:
        fused_aux_fc(aux, weight)
    msg = str(e.value)
    assert "eagle3.fused_aux_fc" in msg
    assert "got 4 aux hidden states of width 56 (224 in total)" in msg
    assert "weight expects 168 = 3 x 56" in msg
    assert "differ from the ones the draft was trained on" in msg
    assert "embedding output or an extra layer" in msg


def test_error_missing_layer():
    aux, _, _ = make_inputs(2, 2, 56, 8, torch.float32, "cpu")
    with pytest.raises(ValueError, match=r"weight expects 168 = 3 x 56.*missing"):
        fused_aux_fc(aux, torch.randn(8, 168))


def test_error_width_not_a_multiple():
    aux, _, _ = make_inputs(3, 2, 56, 8, torch.float32, "cpu")
    with pytest.raises(ValueError, match=r"weight expects 170, which is not a multiple of 56"):
        fused_aux_fc(aux, torch.randn(8, 170))


@pytest.mark.parametrize(
    "mutate, pattern",
    [
        (lambda a, w, b: ([], w, b), r"aux_hidden is empty"),
        (lambda a, w, b: ([a[0], a[1][:, :-1], a[2]], w, b), r"aux_hidden\[1\] has shape .* all captured"),
        (lambda a, w, b: ([a[0], a[1][:-1], a[2]], w, b), r"aux_hidden\[1\] has shape"),
        (lambda a, w, b: ([a[0], a[1].double(), a[2]], w, b), r"aux_hidden\[1\] has dtype Double"),
        (lambda a, w, b: ([x.int() for x in a], w.int(), b), r"aux_hidden\[0\] must be float32, float16 or bfloat16, got Int"),
        (lambda a, w, b: ([x.double() for x in a], w.double(), b), r"must be float32, float16 or bfloat16, got Double"),
        (lambda a, w, b: (a, w.unsqueeze(0), b), r"weight must have 2 dimensions, got shape \[1, 8, 48\]"),
        (lambda a, w, b: (a, w[0], b), r"weight must have 2 dimensions"),
        (lambda a, w, b: (a, w.half(), b), r"weight has dtype Half but aux_hidden has Float"),
        (lambda a, w, b: (a, w, b[:-1]), r"bias must have shape \[8\] \(weight.size\(0\)\), got \[7\]"),
        (lambda a, w, b: (a, w, b.half()), r"bias has dtype Half but aux_hidden has Float"),
        (lambda a, w, b: (a, w, b.view(2, 4)), r"bias must have shape \[8\]"),
    ],
    ids=[
        "empty-list", "shape-mismatch-width", "shape-mismatch-rows", "dtype-mismatch", "int-dtype",
        "double-dtype", "weight-rank-3", "weight-rank-1", "weight-dtype", "bias-length",
        "bias-dtype", "bias-rank",
    ],
)
def test_bad_inputs_raise_clear_errors(mutate, pattern):
    aux, weight, b = make_inputs(3, 4, 16, 8, torch.float32, "cpu")
    args = mutate(aux, weight, b)
    with pytest.raises(op_error(pattern), match=pattern):
        fused_aux_fc(*args)


def test_no_silent_broadcast_of_one_row():
    aux, weight, _ = make_inputs(3, 4, 16, 8, torch.float32, "cpu")
    aux[1] = aux[1][:1]  # [1, H] would broadcast in a naive implementation
    with pytest.raises(ValueError, match=r"aux_hidden\[1\] has shape \[1, 16\]"):
        fused_aux_fc(aux, weight)


def test_error_device_mismatch_never_reaches_a_kernel():
    """Mixed devices are named before dispatch (meta stands in for a second device here)."""
    aux, weight, b = make_inputs(3, 4, 16, 8, torch.float32, "cpu", True)
    with pytest.raises(ValueError, match=r"aux_hidden\[2\] is on meta but aux_hidden\[0\] is on cpu"):
        fused_aux_fc([aux[0], aux[1], aux[2].to("meta")], weight)
    with pytest.raises(ValueError, match=r"weight is on meta but aux_hidden is on cpu"):
        fused_aux_fc(aux, weight.to("meta"))
    with pytest.raises(ValueError, match=r"bias is on meta but aux_hidden is on cpu"):
        fused_aux_fc(aux, weight, b.to("meta"))
    # the op itself (no wrapper) reaches the fake kernel with the mix, which checks the same
    with pytest.raises(ValueError, match=r"aux_hidden\[2\] is on meta but aux_hidden\[0\] is on cpu"):
        torch.ops.eagle3.fused_aux_fc([aux[0], aux[1], aux[2].to("meta")], weight, None)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_error_device_mismatch():
    aux, weight, _ = make_inputs(3, 4, 16, 8, torch.float32, "cpu")
    with pytest.raises(ValueError, match=r"aux_hidden\[1\] is on cuda:0 but aux_hidden\[0\] is on cpu"):
        fused_aux_fc([aux[0], aux[1].cuda(), aux[2]], weight)
    with pytest.raises(ValueError, match=r"weight is on cuda:0 but aux_hidden is on cpu"):
        fused_aux_fc(aux, weight.cuda())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_backward_matches_reference(device, bias):
    aux, weight, b = make_inputs(3, 6, 24, 10, torch.float32, device, bias)
    leaves = [t.clone().requires_grad_() for t in aux] + [weight.clone().requires_grad_()]
    leaves += [b.clone().requires_grad_()] if bias else []
    ref_leaves = [t.detach().clone().requires_grad_() for t in leaves]
    grad = torch.randn(6, 10, device=device)
    (fused_aux_fc(leaves[:3], leaves[3], leaves[4] if bias else None) * grad).sum().backward()
    (reference.fused_aux_fc(ref_leaves[:3], ref_leaves[3], ref_leaves[4] if bias else None) * grad).sum().backward()
    for got, want in zip(leaves, ref_leaves):
        torch.testing.assert_close(got.grad, want.grad, atol=1e-4, rtol=1e-4)
