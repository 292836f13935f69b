"""The float32 route through oneDNN (linear.py): on an AMD CPU, float32 ``F.linear`` of many rows
runs through oneDNN, computes the same product and the same gradients, and leaves every other
product as it is; the generator's prefill takes it and stays token-identical to greedy decoding,
and a float32 draft trains through it as through ATen."""

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from eagle3_ext import linear as routes
from eagle3_ext.linear import MIN_ROWS, RoutedLinears, float32_gemms

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available() or
                                not hasattr(torch.ops.mkldnn, "_linear_pointwise"),
                                reason="this torch build has no oneDNN linear")


class Products(TorchDispatchMode):
    """Records which kernel ran each matrix product: "onednn" or "aten"."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket is torch.ops.mkldnn._linear_pointwise:
            self.seen.append("onednn")
        elif func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm):
            self.seen.append("aten")
        return func(*args, **(kwargs or {}))


@pytest.fixture
def fresh_probe(monkeypatch):
    """onednn_float32 asks once per process (functools.cache): ask again here, and after, with the
    environment's override unset."""
    monkeypatch.delenv(routes.ONEDNN_FLOAT32, raising=False)
    routes.onednn_float32.cache_clear()
    yield
    routes.onednn_float32.cache_clear()


@pytest.fixture
def amd(monkeypatch, fresh_probe):
    """This CPU taken for an AMD one, whatever it is."""
    monkeypatch.setattr(routes, "cpu_vendor", lambda: "AuthenticAMD")


def _linear(shape, out=40, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    w = torch.randn(out, shape[-1], generator=g) / 10
    b = torch.randn(out, generator=g) if bias else None
    return x, w, b


@pytest.mark.parametrize("vendor, expected", [("AuthenticAMD", True), ("GenuineIntel", False), ("", False)])
def test_the_route_is_taken_on_amd_cpus_only(monkeypatch, fresh_probe, vendor, expected):
    monkeypatch.setattr(routes, "cpu_vendor", lambda: vendor)
    assert routes.onednn_float32() is expected
    context = float32_gemms(torch.device("cpu"), torch.float32, MIN_ROWS)
    assert isinstance(context, RoutedLinears) is expected


@pytest.mark.parametrize("value, vendor, expected", [("1", "GenuineIntel", True), ("0", "AuthenticAMD", False),
                                                    ("", "AuthenticAMD", True), ("", "GenuineIntel", False)])
def test_the_environment_overrides_the_vendor(monkeypatch, fresh_probe, value, vendor, expected):
    monkeypatch.setenv(routes.ONEDNN_FLOAT32, value)
    monkeypatch.setattr(routes, "cpu_vendor", lambda: vendor)
    assert routes.onednn_float32() is expected


@pytest.mark.parametrize("value", ["yes", "2", " 1"])
def test_a_bad_environment_value_names_the_variable(monkeypatch, fresh_probe, value):
    monkeypatch.setenv(routes.ONEDNN_FLOAT32, value)
    with pytest.raises(ValueError, match=rf"EAGLE3_ONEDNN_FLOAT32 must be 0 or 1, got {value!r}"):
        routes.onednn_float32()


def test_the_vendor_is_read_from_the_cpu(tmp_path, monkeypatch):
    """cpu_vendor reads /proc/cpuinfo's vendor_id; where there is none it answers ""."""
    import builtins

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n")
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda f, *a, **k: real_open(cpuinfo if f == "/proc/cpuinfo" else f, *a, **k))
    assert routes.cpu_vendor() == "AuthenticAMD"
    cpuinfo.write_text("processor\t: 0\n")
    assert routes.cpu_vendor() == ""
    cpuinfo.unlink()
    assert routes.cpu_vendor() == ""


@pytest.mark.parametrize("shape", [(MIN_ROWS, 96), (3 * MIN_ROWS + 5, 96), (2, MIN_ROWS, 160)],
                         ids=["16 rows", "53 rows", "2 x 16 rows"])
@pytest.mark.parametrize("bias", [True, False])
def test_many_float32_rows_run_through_onednn_and_compute_the_product(amd, shape, bias):
    x, w, b = _linear(shape, bias=bias)
    spy = Products()
    with float32_gemms(torch.device("cpu"), torch.float32, x.numel() // x.shape[-1]), spy:
        out = F.linear(x, w, b)
    assert spy.seen == ["onednn"]
    assert out.dtype == torch.float32 and out.shape == (*shape[:-1], 40)
    exact = F.linear(x.double(), w.double(), None if b is None else b.double())
    torch.testing.assert_close(out.double(), exact, rtol=1e-5, atol=1e-5)


def test_a_strided_input_and_a_transposed_weight(amd):
    """Views as a model's forward makes them (a slice of a wider tensor, a weight's transpose)."""
    x = torch.randn(MIN_ROWS + 3, 200)[:, 8:104]
    w = torch.randn(96, 40).t()
    spy = Products()
    with RoutedLinears(onednn=True), spy:
        out = F.linear(x, w)
    assert spy.seen == ["onednn"]
    torch.testing.assert_close(out.double(), F.linear(x.double(), w.double()), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(MIN_ROWS, 96), (2, MIN_ROWS, 96)], ids=["2-D", "3-D"])
@pytest.mark.parametrize("needs", ["all", "weight only"])
@pytest.mark.parametrize("bias", [True, False])
def test_gradients_through_onednn_equal_those_of_the_product(amd, shape, needs, bias):
    """The forward and each gradient's product run through oneDNN (none for an input that needs no
    gradient); the gradients equal float64 autograd's of the same product."""
    x, w, b = _linear(shape, bias=bias)
    leaves = [w] + ([b] if bias else []) + ([x] if needs == "all" else [])
    for t in leaves:
        t.requires_grad_(True)
    grad = torch.randn(*shape[:-1], 40, generator=torch.Generator().manual_seed(5))
    spy = Products()
    with RoutedLinears(onednn=True), spy:
        F.linear(x, w, b).backward(grad)
    assert spy.seen == ["onednn"] * (3 if needs == "all" else 2)
    x64, w64 = x.detach().double().requires_grad_(needs == "all"), w.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_() if bias else None
    F.linear(x64, w64, b64).backward(grad.double())
    for ours, exact in [(w, w64)] + ([(b, b64)] if bias else []) + ([(x, x64)] if needs == "all" else []):
        torch.testing.assert_close(ours.grad.double(), exact.grad, rtol=1e-5, atol=1e-5)
    if needs != "all":
        assert x.grad is None


def test_a_float32_draft_trains_through_onednn_as_through_aten(monkeypatch, fresh_probe, tmp_path):
    """The trainer's float32 steps (target pass, draft forward and backward) on an AMD CPU run
    oneDNN products, on another CPU none; three steps end at the same validation loss."""
    from eagle3_ext.train import TrainConfig, Trainer
    from tiny_models import corpus, make_target

    make_target(str(tmp_path / "target"), layers=4)
    (tmp_path / "data.txt").write_text(corpus(200, seed=1))

    def run(vendor):
        monkeypatch.setattr(routes, "cpu_vendor", lambda: vendor)
        routes.onednn_float32.cache_clear()
        trainer = Trainer(TrainConfig(target=str(tmp_path / "target"), data=[str(tmp_path / "data.txt")],
                                      out=str(tmp_path / vendor), ttt_steps=2, lr=1e-2, warmup_steps=1,
                                      batch_tokens=512, max_len=64, eval_every=3, progress=False,
                                      draft_vocab_size=200, max_steps=3, export_specforge=False,
                                      export_vllm=False))
        spy = Products()
        with spy:
            trainer.train()
        return trainer.history[-1]["val_loss"], spy.seen

    amd_loss, amd_products = run("AuthenticAMD")
    intel_loss, intel_products = run("GenuineIntel")
    assert amd_products.count("onednn") > amd_products.count("aten")
    assert "onednn" not in intel_products
    assert amd_loss == pytest.approx(intel_loss, rel=1e-3)


class Wrapped(torch.Tensor):
    """A tensor subclass, as a tensor-parallel target's DTensor weights are."""


@pytest.mark.parametrize("case", ["few rows", "bfloat16", "mixed bias", "intel", "subclass"])
def test_other_products_are_left_as_they_are(amd, monkeypatch, case):
    x, w, b = _linear((MIN_ROWS, 96))
    rows = MIN_ROWS
    if case == "few rows":
        x, rows = x[:MIN_ROWS - 1], MIN_ROWS - 1
    if case == "bfloat16":
        x, w, b = x.bfloat16(), w.bfloat16(), b.bfloat16()
        monkeypatch.setattr(routes, "native_half_gemm", lambda dtype: True)
    if case == "mixed bias":
        b = b.double()
    if case == "subclass":
        w = w.as_subclass(Wrapped)
    if case == "intel":
        monkeypatch.setattr(routes, "cpu_vendor", lambda: "GenuineIntel")
        routes.onednn_float32.cache_clear()
    context = float32_gemms(torch.device("cpu"), x.dtype, rows)
    if case in ("few rows", "bfloat16", "intel"):
        assert isinstance(context, contextlib.nullcontext)
    spy = Products()
    if case == "mixed bias":
        with context, spy, pytest.raises(RuntimeError):
            F.linear(x, w, b)  # ATen's own error for mismatched dtypes, not another route's
        assert "onednn" not in spy.seen
        return
    with context, spy:
        out = F.linear(x, w, b)
    assert spy.seen and "onednn" not in spy.seen
    assert torch.equal(out, F.linear(x, w, b))


def test_a_cuda_device_is_left_alone(amd):
    assert isinstance(float32_gemms(torch.device("cuda"), torch.float32, 4 * MIN_ROWS), contextlib.nullcontext)


def test_the_prefill_runs_its_projections_through_onednn_and_generation_stays_lossless(amd, tmp_path):
    """A float32 target's prefill: seven projections a layer through oneDNN, the one-row head with
    ATen, logits equal to the target's own forward; the generator's greedy tokens equal Hugging
    Face's greedy generate with the route on (the draft here is untrained: acceptance is not the
    point, the prefill's cache is)."""
    from eagle3_ext.api import SpeculativeGenerator, TreeConfig
    from eagle3_ext.bench.baseline import hf_generate
    from eagle3_ext.decoding.capture import AuxHiddenCapture
    from eagle3_ext.decoding.target import TargetRunner
    from eagle3_ext import Eagle3DraftModel
    from eagle3_ext.train.trainer import draft_config_for
    from tiny_models import make_target

    target, tok = make_target(str(tmp_path), layers=2)
    runner = TargetRunner(target, AuxHiddenCapture(target, [0, 1, 2]), use_tree_attention=True)
    ids = torch.randint(3, 100, (1, MIN_ROWS + 4), generator=torch.Generator().manual_seed(1))
    spy = Products()
    with spy:
        out = runner.prefill(ids, torch.ones_like(ids))
    assert spy.seen == ["onednn"] * (7 * 2) + ["aten"]
    with torch.no_grad():
        expected = target(ids).logits[:, -1:]
    torch.testing.assert_close(out.logits, expected, rtol=1e-5, atol=1e-5)

    draft = Eagle3DraftModel(draft_config_for(target.config, [0, 1, 1], target.config.vocab_size)).eval()
    with torch.no_grad():
        draft.t2d[:] = True
    gen = SpeculativeGenerator(target, draft, TreeConfig.chain(3), tokenizer=tok)
    prompts = ["def print return class value key item index count for while if else import lambda",
               "try except with as yield self print range len list dict"]
    want = hf_generate(target, tok, prompts, 16, stop_at_eos=False)[0]
    spy = Products()
    with spy:
        got = gen.generate(prompts, max_new_tokens=16, eos_token_id=[], return_dict_in_generate=True)
    assert "onednn" in spy.seen
    assert got.new_tokens == want
