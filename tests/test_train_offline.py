"""Offline training: ``eagle3 train capture`` writes the target's side of every example once, and
``eagle3 train --from-cache`` trains from it with no target in memory. The same data, seed and
options give the same losses per step and the same draft as online training."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from eagle3_ext.cli import main as cli_main
from eagle3_ext.train import TrainConfig, train
from eagle3_ext.train.cache import MANIFEST, CachedTarget, bytes_per_token
from eagle3_ext.train.capture_cache import CaptureConfig, capture
from eagle3_ext.train.target_source import OnlineTarget
from eagle3_ext.train.layout import TrainLayout
from tiny_models import corpus, make_target

OPTIONS = dict(ttt_steps=3, epochs=2, lr=1e-2, warmup_steps=2, batch_tokens=256, max_len=32, eval_every=4,
               progress=False, draft_vocab_size=200, max_steps=8, export_specforge=False, export_vllm=False)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("offline")
    make_target(str(d / "target"), layers=4)
    (d / "data.txt").write_text(corpus(80, seed=2))
    return d


def _capture(workdir, out, **over):
    cfg = dict(target=str(workdir / "target"), data=[str(workdir / "data.txt")], out=str(workdir / out),
               max_len=32, draft_vocab_size=200, batch_tokens=128, progress=False)
    cfg.update(over)
    return capture(CaptureConfig(**cfg))


def _metrics(out):
    with open(os.path.join(out, "metrics.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("head", ["hidden", "logits"])
def test_offline_equals_online(workdir, head):
    cache = workdir / f"cache-{head}"
    result = _capture(workdir, cache.name, head=head, shard_mb=1)
    assert result["head"] == head and result["bytes_written"] > 0
    manifest = json.loads((cache / MANIFEST).read_text())
    assert len({e["shard"] for e in manifest["examples"]}) > 1  # 1 MiB shards: several files
    train(TrainConfig(target=str(workdir / "target"), data=[str(workdir / "data.txt")],
                      out=str(workdir / f"online-{head}"), **OPTIONS))
    train(TrainConfig(target=None, data=None, from_cache=str(cache), out=str(workdir / f"offline-{head}"),
                      **OPTIONS))
    online, offline = _metrics(workdir / f"online-{head}"), _metrics(workdir / f"offline-{head}")
    a = [s["loss"] for s in online["train_loss"]]
    b = [s["loss"] for s in offline["train_loss"]]
    assert len(a) == len(b) == 8 and a[0] != a[-1]
    assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5
    assert [e["val_loss"] for e in offline["evals"]] == pytest.approx([e["val_loss"] for e in online["evals"]],
                                                                      abs=1e-5)
    w_on = load_file(str(workdir / f"online-{head}" / "model.safetensors"))
    w_off = load_file(str(workdir / f"offline-{head}" / "model.safetensors"))
    assert w_on.keys() == w_off.keys()
    for name in w_on:
        torch.testing.assert_close(w_off[name], w_on[name], atol=1e-5, rtol=1e-5)


def test_cache_batch_equals_target_forward(workdir):
    """The cached states and logits are the target's own, padding included in the batch."""
    cache = CachedTarget(str(workdir / "cache-hidden"))
    train_set, _ = cache.split()
    batch = train_set[:3]
    online = OnlineTarget(str(workdir / "target"), torch.float32, 32, TrainLayout())
    online.start(cache.manifest["aux_layer_ids"], cache.parts["d2t"])
    cache.start(cache.manifest["aux_layer_ids"], cache.parts["d2t"])
    got, want = cache.batch(batch, "cpu"), online.batch(batch, "cpu")
    valid = want[2]
    for x, y in zip(got[:3], want[:3]):
        assert torch.equal(x, y)
    for x, y in zip(got[3], want[3]):
        torch.testing.assert_close(x[valid], y[valid], atol=1e-6, rtol=1e-6)
    assert torch.equal(got[4].top[valid], want[4].top[valid])
    torch.testing.assert_close(got[4].draft_logits[valid], want[4].draft_logits[valid], atol=1e-5, rtol=1e-5)


def test_size_estimate_and_dry_run(workdir):
    est = _capture(workdir, "dry", dry_run=True)
    assert not (workdir / "dry" / MANIFEST).exists()
    hidden = 64
    assert est["bytes_per_token"] == bytes_per_token(3, hidden, 200, 4, est["head"]) == (3 + 1) * hidden * 4 + 17
    written = json.loads((workdir / "cache-hidden" / MANIFEST).read_text())
    assert est["tokens"] == written["tokens"]
    # The shard files hold what the estimate counts (plus safetensors headers).
    on_disk = sum(os.path.getsize(workdir / "cache-hidden" / f) for f in os.listdir(workdir / "cache-hidden")
                  if f.startswith("shard-"))
    assert est["estimated_bytes"] <= on_disk <= est["estimated_bytes"] * 1.2


def test_cli_capture_and_train_from_cache(workdir, capsys):
    out = workdir / "cli-cache"
    assert cli_main(["train", "capture", "--target", str(workdir / "target"), "--data", str(workdir / "data.txt"),
                     "--out", str(out), "--max-len", "32", "--draft-vocab-size", "200", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["examples"] > 0 and figures["tokens_per_s"] > 0
    assert cli_main(["train", "--from-cache", str(out), "--out", str(workdir / "cli-draft"), "--ttt-steps", "2",
                     "--max-steps", "2", "--epochs", "3", "--no-specforge-export", "--no-vllm-export", "--json"]) == 0
    final = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert final["step"] == 2
    # The exported draft names the cache's target and loads against it.
    from eagle3_ext import Eagle3DraftModel
    from transformers import AutoConfig
    draft = Eagle3DraftModel.from_pretrained(str(workdir / "cli-draft"),
                                             target_config=AutoConfig.from_pretrained(workdir / "target"))
    assert draft.config.fingerprint is not None and draft.config.draft_vocab_size == 200


def test_bad_cache_use_is_a_clear_error(workdir, capsys):
    cache = str(workdir / "cache-hidden")
    with pytest.raises(ValueError, match="max_len 64 differs from the cache's 32"):
        train(TrainConfig(target=None, data=None, from_cache=cache, out=str(workdir / "x"), **{**OPTIONS,
                                                                                               "max_len": 64}))
    with pytest.raises(ValueError, match="target must be None with from_cache"):
        TrainConfig(target=str(workdir / "target"), data=None, from_cache=cache, out=str(workdir / "x")).validate()
    with pytest.raises(ValueError, match="no manifest.json"):
        train(TrainConfig(target=None, data=None, from_cache=str(workdir / "target"), out=str(workdir / "x")))
    with pytest.raises(ValueError, match="already holds a training cache"):
        _capture(workdir, "cache-hidden")
    assert cli_main(["train", "--out", str(workdir / "x")]) == 2
    assert "--target and --data are required" in capsys.readouterr().err
    assert cli_main(["train", "capture", "--target", str(workdir / "target"), "--data", str(workdir / "data.txt"),
                     "--out", str(workdir / "y"), "--head", "nope"]) == 2
