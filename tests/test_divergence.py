"""The losslessness check of reduced-precision runs: the first divergent token, its fp32 margin,
and the near-tie verdict (never in fp32)."""

import copy

import pytest
import torch

from eagle3_ext.bench.divergence import NEAR_TIE_ULPS, UNIT_ROUNDOFF, first_divergence
from tiny_models import make_target


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    target, tok = make_target(str(tmp_path_factory.mktemp("div") / "t"), layers=2)
    prompt = tok("def print return").input_ids
    with torch.no_grad():
        logits = target.float()(input_ids=torch.tensor([prompt])).logits[0, -1]
    return target.eval(), prompt, logits.argsort(descending=True).tolist(), logits


def test_identical_or_prefix_outputs_have_no_divergence(tiny):
    target, prompt, _, _ = tiny
    assert first_divergence(target, prompt, [5, 6, 7], [5, 6, 7]) is None
    assert first_divergence(target, prompt, [5, 6], [5, 6, 7]) is None  # one stopped earlier


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_a_tie_is_a_near_tie_only_in_reduced_precision(tiny, dtype):
    base, prompt, order, _ = tiny
    target = copy.deepcopy(base).to(dtype)
    a, b = order[0], order[1]
    with torch.no_grad():  # b's logit made equal to a's: a tie rounding may break either way
        target.lm_head.weight[b] = target.lm_head.weight[a]
    d = first_divergence(target, prompt, [a, 9], [b, 9])
    assert d["position"] == 0 and d["tokens"] == [a, b]
    assert d["margin"] == pytest.approx(0.0, abs=1e-5)
    assert d["near_tie"] is (dtype != torch.float32)  # fp32 argmaxes break an exact tie the same way


def test_a_clear_winner_is_not_a_near_tie(tiny):
    base, prompt, order, _ = tiny
    target = copy.deepcopy(base).to(torch.bfloat16)
    a, far = order[0], order[-1]
    d = first_divergence(target, prompt, [3, a], [3, far])
    assert d["position"] == 1 and d["margin"] > d["bound"] and not d["near_tie"]
    # the margin is recomputed from the shared prefix (prompt + 3) in fp32, from the bf16 weights ...
    with torch.no_grad():
        ref = copy.deepcopy(target).float()(input_ids=torch.tensor([prompt + [3]])).logits[0, -1]
    assert d["margin"] == pytest.approx(abs(float(ref[a] - ref[far])), rel=1e-4)
    # ... and the bound is the stated one
    size = max(abs(float(ref[a])), abs(float(ref[far])), 1.0)
    assert d["bound"] == pytest.approx(NEAR_TIE_ULPS * UNIT_ROUNDOFF[torch.bfloat16] * size, rel=1e-4)


def test_cli_reports_identical_or_a_named_divergence_in_bf16(capsys):
    import json

    from eagle3_ext import cli

    prompt = "def parse(self, text):\n    for line in text.splitlines():\n"
    rc = cli.main(["generate", "--dtype", "bfloat16", "--baseline", "--json", "--max-new-tokens", "64",
                   "--prompt", prompt])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["identical"] in (True, False)
    if report["identical"]:
        assert rc == 0 and "divergence" not in report
    else:  # a divergence names its token and margin, and only a near-tie passes
        d = report["divergence"]
        assert set(d) == {"position", "tokens", "margin", "bound", "near_tie"}
        assert report["tokens"][d["position"]] == d["tokens"][0]
        assert rc == (0 if d["near_tie"] else 1)
