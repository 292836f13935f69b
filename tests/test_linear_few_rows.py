"""The draft's few-row linears through the streaming kernel (linear.py) and the
kernel's single-row tiles they run on."""

import pytest
import torch
import torch.nn.functional as F

from conftest import DTYPES, TOLERANCES, calls_after_a_first
from eagle3_ext import fused_aux_fc, reference
from eagle3_ext import linear as routes
from test_draft_model import plain_forward
from tiny_models import H, VOCAB, make_draft


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [1, 2], ids=lambda k: f"k{k}")
@pytest.mark.parametrize("out_features", [1, 4, 7, 8, 12, 13, 29, 4101])
@pytest.mark.parametrize("hidden", [37, 600], ids=lambda h: f"H{h}")
def test_single_row_feature_tiles(dtype, k, out_features, hidden):
    # One row runs 8-feature tiles (AVX-512), then 4-feature tiles, then single features, and
    # prefetches the next tile's rows; H=600 spans two reduction chunks of 512.
    g = torch.Generator().manual_seed(out_features + hidden)
    aux = [torch.randn(1, hidden, generator=g).to(dtype) for _ in range(k)]
    weight = (torch.randn(out_features, k * hidden, generator=g) * (k * hidden) ** -0.5).to(dtype)
    out = fused_aux_fc(aux, weight)
    torch.testing.assert_close(out.float(), reference.fused_aux_fc(aux, weight, None).float(), **TOLERANCES[dtype])


def _layer(in_features, out_features, dtype, bias):
    torch.manual_seed(in_features + out_features)
    return torch.nn.Linear(in_features, out_features, bias=bias).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 6, 16, 17, 40])
@pytest.mark.parametrize("parts", [1, 2])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_linear_equals_the_layer_over_the_concatenation(dtype, rows, parts, bias):
    layer = _layer(parts * 48, 72, dtype, bias)
    xs = [torch.randn(rows, 48).to(dtype) for _ in range(parts)]
    with torch.no_grad():
        out = routes.linear(layer, *xs)
        expected = F.linear(torch.cat(xs, -1).float(), layer.weight.float(),
                            None if layer.bias is None else layer.bias.float())
    assert out.dtype == dtype and out.shape == (rows, 72)
    torch.testing.assert_close(out.float(), expected, **TOLERANCES[dtype])


def test_which_products_stream():
    layer = _layer(48, 72, torch.float32, False)
    one, many = torch.randn(2, 3, 48), torch.randn(3, 6, 48)  # 6 rows, 18 rows
    with torch.no_grad():
        assert routes.streams(one, layer)
        assert not routes.streams(many, layer)
    # Training: gradients go through F.linear.
    assert not routes.streams(one, layer)
    layer.weight.requires_grad_(False)
    assert routes.streams(one, layer)
    # Another module in a linear's place (a subclass may compute something else) is called.
    class Scaled(torch.nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    scaled = Scaled(48, 72, bias=False).requires_grad_(False)
    scaled.load_state_dict(layer.state_dict())
    with torch.no_grad():
        assert not routes.streams(one, scaled)
        torch.testing.assert_close(routes.linear(scaled, one), 2 * routes.linear(layer, one))
    if torch.cuda.is_available():
        assert not routes.streams(one.cuda(), layer.cuda())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("n", [1, 6])
def test_draft_forward_streams_and_matches_the_plain_reimplementation(monkeypatch, dtype, n):
    d = make_draft().to(dtype)
    ids = torch.randint(0, VOCAB, (2, n))
    features = torch.randn(2, n, H).to(dtype)
    pos = torch.arange(n).expand(2, n) + 30
    calls = []
    op = torch.ops.eagle3.fused_aux_fc

    def counted(parts, weight, bias):
        calls.append(tuple(weight.shape))
        return op(parts, weight, bias)

    monkeypatch.setattr(torch.ops.eagle3, "fused_aux_fc", counted)
    with torch.no_grad():
        out = d(ids, features, pos)
    # q, k, v (over the embedding and feature halves), o, gate, up, down, lm_head
    assert len(calls) == 8
    logits, hidden = plain_forward(d, ids, features, pos)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=0.1, rtol=0.05)
    torch.testing.assert_close(out.logits.float(), logits, **tol)
    torch.testing.assert_close(out.hidden.float(), hidden, **tol)


def test_streamed_linears_route_only_few_half_precision_rows_without_gradients(monkeypatch):
    calls = []
    op = torch.ops.eagle3.fused_aux_fc
    monkeypatch.setattr(torch.ops.eagle3, "fused_aux_fc", lambda *a: calls.append(a[1].dtype) or op(*a))
    layer = _layer(48, 72, torch.bfloat16, True)
    few, many = torch.randn(2, 5, 48).to(torch.bfloat16), torch.randn(3, 6, 48).to(torch.bfloat16)
    with torch.no_grad(), routes.RoutedLinears(stream=[torch.bfloat16, torch.float16]):
        out = layer(few)
        layer(many)                     # 18 rows: ATen
        layer.float()(few.float())      # float32: ATen
    assert calls == [torch.bfloat16]
    expected = F.linear(few.float(), layer.weight.float(), layer.bias.float())
    torch.testing.assert_close(out.float(), expected, **TOLERANCES[torch.bfloat16])
    with routes.RoutedLinears(stream=[torch.float32]):
        layer(few.float())              # gradients on: ATen
    assert calls == [torch.bfloat16]


def test_routed_modules_route_one_models_plain_linears_and_leave_as_they_were(monkeypatch):
    """RoutedModules: inside the context the model's plain nn.Linear modules take the routes
    (few rows streamed; the same products), other modules and a forward a hook library set are
    left alone, and on exit every module is as it was; the context can be entered again."""
    calls = []
    op = torch.ops.eagle3.fused_aux_fc
    monkeypatch.setattr(torch.ops.eagle3, "fused_aux_fc", lambda *a: calls.append(a[1].shape) or op(*a))

    class Subclass(torch.nn.Linear):
        pass

    model = torch.nn.Sequential(_layer(48, 72, torch.float32, True), Subclass(72, 40),
                                _layer(40, 24, torch.float32, False))
    hooked = model[2]
    hooked.forward = lambda x: F.linear(x, hooked.weight, hooked.bias)   # a wrapper set on the module
    x = torch.randn(2, 3, 48)
    with torch.no_grad():
        expected = model(x)
        routed = routes.RoutedModules(model, stream=[torch.float32])
        for _ in range(2):
            with routed:
                torch.testing.assert_close(model(x), expected)
                many = model(torch.randn(40, 48))            # 40 rows: ATen
            assert "forward" not in vars(model[0]) and vars(hooked)["forward"] is not None
    assert calls == [torch.Size([72, 48])] * 2 and many.shape == (40, 24)
    assert model(x).shape == expected.shape and len(calls) == 2   # after the context: ATen again


def _stream_calls(fn, *args):
    return calls_after_a_first(fn, args, ("eagle3::fused_aux_fc",))


@pytest.mark.parametrize("dtype, parts, bias", [(torch.float32, 2, True), (torch.bfloat16, 1, False)],
                         ids=["fp32-2parts-bias", "bf16-1part"])
def test_linears_stack_the_weights_only_in_a_graph_with_frozen_weights(dtype, parts, bias):
    layers = [_layer(parts * 48, out, dtype, bias) for out in (40, 24, 24)]
    xs = [torch.randn(1, 5, 48).to(dtype) for _ in range(parts)]

    def qkv(*xs):
        return routes.linears(layers, *xs)

    with torch.no_grad():
        separate, eager_calls = _stream_calls(qkv, *xs)
        with torch._inductor.config.patch(freezing=True):
            stacked, frozen_calls = _stream_calls(torch.compile(qkv, dynamic=False), *xs)
        unfrozen, unfrozen_calls = _stream_calls(torch.compile(lambda *xs: routes.linears(layers, *xs),
                                                               dynamic=False), *xs)
    assert (eager_calls, frozen_calls, unfrozen_calls) == (3, 1, 3)
    for layer, a, b, c in zip(layers, separate, stacked, unfrozen):
        # One feature's sum runs the same way in a stacked weight: the same bits.
        assert torch.equal(a, b) and torch.equal(a, c)
        expected = F.linear(torch.cat(xs, -1).float(), layer.weight.float(),
                            None if layer.bias is None else layer.bias.float())
        torch.testing.assert_close(b.float(), expected, **TOLERANCES[dtype])


def test_linears_that_do_not_stack_run_one_by_one():
    xs = [torch.randn(1, 5, 48)]
    mixed_bias = [_layer(48, 40, torch.float32, True), _layer(48, 24, torch.float32, False)]
    mixed_dtype = [_layer(48, 40, torch.float32, False), _layer(48, 24, torch.bfloat16, False)]
    with torch.no_grad(), torch._inductor.config.patch(freezing=True):
        _, calls = _stream_calls(torch.compile(lambda x: routes.linears(mixed_bias, x), dynamic=False), *xs)
        assert calls == 2
        assert routes._stackable(mixed_bias[:1] * 2, *xs)
        assert not routes._stackable(mixed_bias, *xs) and not routes._stackable(mixed_dtype, *xs)
