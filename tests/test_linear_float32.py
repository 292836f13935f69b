"""float32_gemms: half-precision F.linear of many rows multiplies in float32 where the CPU has no
native half-precision GEMM, rounds once, and leaves everything else as it is."""

import contextlib
import os

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import TOLERANCES, cpu_flags
from eagle3_ext import linear as routes
from eagle3_ext.linear import MIN_ROWS, float32_gemms


class GemmDtypes(TorchDispatchMode):
    """Records the dtype of every matrix product ATen runs."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm):
            self.seen.append(args[0].dtype if func.overloadpacket is not torch.ops.aten.addmm else args[1].dtype)
        return func(*args, **(kwargs or {}))


@pytest.fixture
def no_native(monkeypatch):
    """A CPU without native half-precision GEMMs, whose float32 products stay with ATen (the route
    of float32 through oneDNN on AMD CPUs is tested in test_linear_onednn.py)."""
    monkeypatch.setattr(routes, "native_half_gemm", lambda dtype: dtype not in routes.HALF)
    monkeypatch.setattr(routes, "onednn_float32", lambda: False)


def _linear(rows, dtype, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 96, generator=g).to(dtype)
    w = (torch.randn(40, 96, generator=g) / 10).to(dtype)
    b = torch.randn(40, generator=g).to(dtype) if bias else None
    return x, w, b


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [MIN_ROWS, 3 * MIN_ROWS + 5])
@pytest.mark.parametrize("bias", [True, False])
def test_many_rows_multiply_in_float32_and_round_once(no_native, dtype, rows, bias):
    x, w, b = _linear(rows, dtype, bias)
    spy = GemmDtypes()
    with float32_gemms(torch.device("cpu"), dtype, rows):
        with spy:
            out = F.linear(x, w, b)
    assert out.dtype == dtype and out.shape == (rows, 40)
    assert spy.seen and set(spy.seen) == {torch.float32}
    # The exact product rounded once to dtype: at most half an ulp away, so equal after rounding
    # wherever the float32 sum is within float32 rounding of it.
    exact = F.linear(x.double(), w.double(), None if b is None else b.double())
    torch.testing.assert_close(out.double(), exact.to(dtype).double(), rtol=2 ** -7 if dtype == torch.bfloat16
                               else 2 ** -10, atol=1e-3)
    # ATen's own half-precision product: the same up to the summation order.
    torch.testing.assert_close(out, F.linear(x, w, b), rtol=2 ** -7, atol=1e-2)


@pytest.mark.parametrize("case", ["few rows", "float32", "native", "cuda device", "rows below the call's"])
def test_other_products_are_left_as_they_are(no_native, monkeypatch, case):
    dtype, rows, device = torch.bfloat16, MIN_ROWS, torch.device("cpu")
    x, w, b = _linear(rows, dtype)
    if case == "few rows":
        x = x[:MIN_ROWS - 1]
    if case == "float32":
        dtype, x, w, b = torch.float32, x.float(), w.float(), b.float()
    if case == "native":
        monkeypatch.setattr(routes, "native_half_gemm", lambda dtype: True)
    if case == "cuda device":
        device = torch.device("cuda")
    call_rows = MIN_ROWS - 1 if case == "rows below the call's" else rows
    context = float32_gemms(device, dtype, call_rows)
    if case in ("native", "cuda device", "float32", "rows below the call's"):
        assert isinstance(context, contextlib.nullcontext)
    spy = GemmDtypes()
    with context, spy:
        out = F.linear(x, w, b)
    assert set(spy.seen) == {dtype}
    assert torch.equal(out, F.linear(x, w, b))


@pytest.fixture
def fresh_probe():
    """native_half_gemm asks once per process (functools.cache): ask again here, and after."""
    routes.native_half_gemm.cache_clear()
    yield
    routes.native_half_gemm.cache_clear()


# The CPU's instruction sets (/proc/cpuinfo flags) that give a dtype a native GEMM, and those
# without which it has none: oneDNN multiplies bfloat16 natively with AVX512-BF16 or AMX-BF16,
# float16 with AVX512-FP16 or AMX-FP16; with neither AVX-512 nor AVX-NE-CONVERT (an AVX2 CPU, such
# as the 2-core machine this was tuned on) it has no half-precision GEMM of its own.
NATIVE_ISA = {torch.bfloat16: ({"avx512_bf16", "amx_bf16"}, {"avx512bw", "avx_ne_convert"}),
              torch.float16: ({"avx512_fp16", "amx_fp16"}, {"avx512_fp16", "avx_ne_convert"})}


@pytest.mark.skipif(not cpu_flags(), reason="no x86 /proc/cpuinfo flags to check against")
@pytest.mark.skipif(bool(os.environ.get("DNNL_MAX_CPU_ISA") or os.environ.get("ONEDNN_MAX_CPU_ISA")),
                    reason="oneDNN's instruction sets are capped by the environment")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_native_support_follows_the_cpus_instruction_sets(fresh_probe, dtype):
    """Checked against the hardware, not against the oneDNN query the function makes. Between the
    two sets (AVX-512 without the dtype's own instructions) oneDNN's choice is not asserted."""
    flags = set(cpu_flags())
    native, needed = NATIVE_ISA[dtype]
    if flags & native:
        assert routes.native_half_gemm(dtype) is True
    elif not flags & needed:
        assert routes.native_half_gemm(dtype) is False
    else:
        pytest.skip(f"this CPU has {sorted(flags & needed)} but none of {sorted(native)}: oneDNN decides")


def test_float32_is_native_and_an_unanswered_probe_is_not(fresh_probe, monkeypatch):
    assert routes.native_half_gemm(torch.float32) is True
    assert routes.gemm_dtype(torch.device("cpu"), torch.float32) == torch.float32
    torch.ops.mkldnn  # noqa: B018  (created on first access: monkeypatch restores it after)
    monkeypatch.setattr(torch.ops, "mkldnn", object())  # a torch without oneDNN's queries
    assert routes.native_half_gemm(torch.bfloat16) is False
    assert routes.native_half_gemm(torch.float32) is True


def test_the_prefill_and_the_prompt_pass_of_the_draft_run_their_projections_in_float32(no_native, tmp_path):
    """Where the generator uses it: a bfloat16 target's prefill (seven projections a layer; the
    one-row head stays) and the draft's pass over the prompt pairs."""
    from eagle3_ext.decoding.capture import AuxHiddenCapture
    from eagle3_ext.decoding.drafting import DraftInputs, extend_eager
    from eagle3_ext.decoding.target import TargetRunner
    from tiny_models import make_draft, make_target

    target, _ = make_target(str(tmp_path), layers=2)
    target = target.to(torch.bfloat16)
    runner = TargetRunner(target, AuxHiddenCapture(target, [0, 1, 2]), use_tree_attention=True)
    ids = torch.randint(3, 100, (1, MIN_ROWS + 4))
    spy = GemmDtypes()
    with spy:
        out = runner.prefill(ids, torch.ones_like(ids))
    assert spy.seen.count(torch.float32) == 7 * 2 and out.logits.dtype == torch.bfloat16
    assert spy.seen.count(torch.bfloat16) == 1   # the head, over the last position only

    draft = make_draft().to(torch.bfloat16)
    n = MIN_ROWS + 2
    cache = draft.new_cache(1, 64)
    inputs = DraftInputs(features=torch.randn(1, n, draft.config.hidden_size, dtype=torch.bfloat16),
                         tokens=torch.randint(0, 90, (1, n)), positions=torch.arange(n)[None],
                         counts=torch.tensor([n]))
    spy = GemmDtypes()
    with spy:
        extend_eager(draft, cache, inputs)
    assert spy.seen.count(torch.float32) >= 7


def test_gemm_dtype_and_the_roofline_matmul_rate(no_native):
    """The roofline's matmul rate is the hardware's limit: for bf16 on a CPU without a native
    GEMM, the float32 units' rate."""
    from eagle3_ext.bench.roofline import measure_machine

    cpu = torch.device("cpu")
    assert routes.gemm_dtype(cpu, torch.bfloat16) == torch.float32
    assert routes.gemm_dtype(cpu, torch.float16) == torch.float32
    assert routes.gemm_dtype(cpu, torch.float32) == torch.float32
    assert routes.gemm_dtype(torch.device("cuda"), torch.bfloat16) == torch.bfloat16
    spy = GemmDtypes()
    with spy:
        measure_machine(torch.bfloat16)
    assert spy.seen and set(spy.seen) == {torch.float32}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_eager_verify_streams_a_trees_rows_and_multiplies_a_batchs_half_rows_in_float32(
        no_native, tmp_path, dtype):
    """The eager verify (eager_linears): one request's 6-token chain runs its 14 projections and
    the head through the streaming kernel; three requests' 18 rows of bfloat16 run in float32
    (float32 ones stay with ATen). The logits are the target's own forward over prompt + chain."""
    import copy
    from types import SimpleNamespace

    from eagle3_ext.decoding.capture import AuxHiddenCapture
    from eagle3_ext.decoding.target import TargetRunner
    from tiny_models import make_target

    target, _ = make_target(str(tmp_path), layers=2)
    target = target.to(dtype)

    class Products(GemmDtypes):
        """Also records the streaming kernel's calls."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket is torch.ops.eagle3.fused_aux_fc:
                self.seen.append("stream")
            return super().__torch_dispatch__(func, types, args, kwargs)

    def verify(batch, n=6, prompt=9):
        ids = torch.randint(3, 100, (batch, prompt + n), generator=torch.Generator().manual_seed(batch))
        runner = TargetRunner(target, AuxHiddenCapture(target, [0, 1, 2]), use_tree_attention=True)
        runner.prefill(ids[:, :prompt], torch.ones_like(ids[:, :prompt]))
        chain = SimpleNamespace(draft_tokens=ids[:, prompt:], positions=torch.arange(prompt, prompt + n).repeat(batch),
                                tree_mask=torch.ones(n, n, dtype=torch.bool).tril().expand(batch, n, n).contiguous())
        spy = Products()
        with spy:
            logits = runner.verify(chain).logits
        return ids, logits, spy.seen

    ids, logits, seen = verify(1)
    assert seen == ["stream"] * (7 * 2 + 1)
    with torch.no_grad():
        expected = copy.deepcopy(target).float()(ids).logits[:, -6:]
    torch.testing.assert_close(logits.float(), expected, **({} if dtype == torch.float32 else TOLERANCES[dtype]))

    _, logits, seen = verify(3)
    assert seen == [torch.float32] * (7 * 2 + 1)
    assert logits.dtype == dtype
