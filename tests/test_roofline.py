"""The roofline estimate of a round's cost: weight bytes counted as a forward reads them, the
larger of memory and compute time, and r in decode forwards."""

import pytest
import torch

from eagle3_ext.api.config import TreeConfig
from eagle3_ext.bench import roofline
from eagle3_ext.bench.roofline import (BANDWIDTH_BYTES, MachineRates, estimate_round_cost, measure_machine,
                                         read_bandwidth, weights_read)


class TinyLM(torch.nn.Module):
    def __init__(self, vocab=100, hidden=8, tied=True):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.proj = torch.nn.Linear(hidden, hidden, bias=False)
        self.head = torch.nn.Linear(hidden, vocab, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def get_output_embeddings(self):
        return self.head


def test_weights_read_counts_a_tied_table_once_and_skips_lookup_only_tables():
    tied = weights_read(TinyLM(tied=True))
    assert tied == {"bytes": (100 * 8 + 8 * 8) * 4, "elements": 100 * 8 + 8 * 8}
    untied = weights_read(TinyLM(tied=False).to(torch.bfloat16))   # the embedding is only looked up
    assert untied == {"bytes": (8 * 8 + 100 * 8) * 2, "elements": 8 * 8 + 100 * 8}


def test_forward_time_is_the_larger_of_memory_and_compute():
    rates = MachineRates(bandwidth_gb_s=10.0, matmul_gflop_s=100.0)
    assert rates.forward_s(10**9, 10**6, tokens=1) == pytest.approx(0.1)         # 1 GB at 10 GB/s
    assert rates.forward_s(10**6, 10**9, tokens=16) == pytest.approx(0.32)       # 32 GFLOP at 100 GFLOP/s


def test_round_cost_in_decode_forwards():
    target, draft = TinyLM(vocab=1000, hidden=32), TinyLM(vocab=1000, hidden=32)
    rates = MachineRates(bandwidth_gb_s=1.0, matmul_gflop_s=1e6)    # memory-bound at every size here
    est = estimate_round_cost(target, draft, TreeConfig(5, 2, 16, lookup_tokens=0), rates)
    # memory-bound: a verify reads the target once (1 decode forward), each of the 5 draft
    # forwards reads the draft once, and the draft is as large as the target here
    assert est["verify"] == pytest.approx(1.0) and est["draft"] == pytest.approx(5.0)
    assert est["r"] == pytest.approx(6.0)
    slow_compute = MachineRates(bandwidth_gb_s=1e6, matmul_gflop_s=1.0)
    est = estimate_round_cost(target, draft, TreeConfig(5, 2, 16, lookup_tokens=0), slow_compute)
    assert est["verify"] == pytest.approx(16.0)  # compute-bound: 16 tree tokens cost 16 decode tokens


def test_measured_rates_are_plausible():
    rates = measure_machine(torch.float32)
    assert 0.1 < rates.bandwidth_gb_s < 10_000 and 0.1 < rates.matmul_gflop_s < 1_000_000


@pytest.mark.parametrize("sum_s, product_s", [(0.5, 0.25), (0.25, 0.5)], ids=["product-faster", "sum-faster"])
def test_bandwidth_is_the_faster_of_two_reads(monkeypatch, sum_s, product_s):
    """A sum alone can fall short of the memory's rate (a matrix-vector product over the same bytes
    read 1.4x faster on one VM): the bandwidth is the faster read, whichever it is."""
    times = iter([sum_s, product_s])   # read_bandwidth times the sum first, then the product
    monkeypatch.setattr(roofline, "_best_of", lambda fn: (fn(), next(times))[1])
    assert read_bandwidth() == pytest.approx(BANDWIDTH_BYTES / 0.25 / 1e9)


@pytest.mark.parametrize("onednn", [True, False], ids=["onednn route", "aten only"])
@pytest.mark.parametrize("aten_s, onednn_s", [(0.5, 0.25), (0.25, 0.5)], ids=["onednn-faster", "aten-faster"])
def test_matmul_rate_is_the_faster_of_the_routes_the_library_takes(monkeypatch, onednn, aten_s, onednn_s):
    """Where float32 products go through oneDNN (an AMD CPU), the matmul rate is the faster of
    ATen's and oneDNN's; elsewhere ATen's alone."""
    from eagle3_ext import linear as routes

    monkeypatch.setattr(roofline, "read_bandwidth", lambda device="cpu": 1.0)
    monkeypatch.setattr(roofline, "onednn_float32", lambda: onednn)
    times = iter([aten_s, onednn_s])   # ATen's product is timed first
    monkeypatch.setattr(roofline, "_best_of", lambda fn: (fn(), next(times))[1])
    if onednn and not hasattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise"):
        pytest.skip("this torch build has no oneDNN linear")
    called = []
    real = routes.onednn_linear
    monkeypatch.setattr(roofline, "onednn_linear", lambda *a: called.append(1) or real(*a))
    rate = measure_machine(torch.float32).matmul_gflop_s
    flop = 2.0 * roofline.MATMUL_SIZE ** 3
    assert rate == pytest.approx(flop / (min(aten_s, onednn_s) if onednn else aten_s) / 1e9)
    assert bool(called) is onednn
