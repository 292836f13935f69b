import json
import shutil

import pytest

from eagle3_ext.cli import main as cli_main
from eagle3_ext.doctor import candidate_layer_sets, diagnose
from eagle3_ext.train import TrainConfig, train
from tiny_models import corpus, make_target

TRAINED_ON = [1, 2, 4]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A 6-layer target (neighbouring layers made distinct, as in trained models) and a draft
    trained in the test on known layers."""
    d = tmp_path_factory.mktemp("doctor")
    make_target(str(d / "target"), residual_scale=16.0)
    (d / "data.txt").write_text(corpus(300, seed=1))
    train(TrainConfig(target=str(d / "target"), data=[str(d / "data.txt")], out=str(d / "draft"),
                      aux_layers=TRAINED_ON, draft_vocab_size=200, ttt_steps=2, epochs=20, lr=1e-2, warmup_steps=5, batch_tokens=512,
                      max_len=64, eval_every=1000, progress=False, max_steps=80, export_specforge=False))
    (d / "sample.txt").write_text(corpus(40, seed=9))
    return d


def variant(pair, name, edit):
    """A copy of the trained draft whose config.json (or weights) ``edit`` changes."""
    out = pair / name
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(pair / "draft", out, ignore=shutil.ignore_patterns("checkpoint", "metrics.json", "specforge"))
    config = json.loads((out / "config.json").read_text())
    edit(out, config)
    (out / "config.json").write_text(json.dumps(config))
    return out


def run(pair, draft_dir):
    return diagnose(str(pair / "target"), str(draft_dir), [str(pair / "sample.txt")], steps=2)


def test_correct_config_is_healthy(pair):
    report = run(pair, pair / "draft")
    assert report.healthy, report.verdict
    assert report.best == "configured" and report.verdict.startswith("HEALTHY")
    assert {c.name for c in report.candidates} >= {"configured", "shifted -1", "shifted +1", "reversed"}


def test_every_layer_shifted_by_one_names_the_trained_layers(pair):
    def shift(path, config):
        config["eagle3_ext"]["aux_layer_ids"] = [i + 1 for i in TRAINED_ON]
    report = run(pair, variant(pair, "shifted", shift))
    assert not report.healthy
    best = min(report.candidates, key=lambda c: c.loss)
    assert best.aux_layer_ids == TRAINED_ON and best.name == "shifted -1"
    fault = next(f for f in report.findings if f.check == "aux layers (measured)")
    assert fault.status == "fault" and str(TRAINED_ON) in fault.message
    assert '"aux_layer_ids": [1, 2, 4]' in fault.fix and "[0, 1, 3]" in fault.fix  # ours and SpecForge's ids


def test_embedding_output_added_is_named(pair):
    def add_embedding(path, config):
        config["eagle3_ext"]["aux_layer_ids"] = [0] + TRAINED_ON
    report = run(pair, variant(pair, "embedding", add_embedding))
    assert not report.healthy
    static = next(f for f in report.findings if f.check == "aux layers vs fc")
    assert "embedding output" in static.message
    best = min(report.candidates, key=lambda c: c.loss)
    assert best.aux_layer_ids == TRAINED_ON and best.name == "embedding output removed"


def test_zeroed_d2t_is_named(pair):
    def zero_d2t(path, config):
        from safetensors.torch import load_file, save_file
        state = load_file(str(path / "model.safetensors"))
        state["d2t"].zero_()
        save_file(state, str(path / "model.safetensors"))
    report = run(pair, variant(pair, "d2t", zero_d2t))
    assert not report.healthy
    fault = next(f for f in report.findings if f.check == "vocabulary map (d2t/t2d)")
    assert "d2t is all zeros" in fault.message
    assert "d2t" in report.verdict


def test_cli_json_and_exit_code(pair, capsys):
    def shift(path, config):
        config["eagle3_ext"]["aux_layer_ids"] = [i + 1 for i in TRAINED_ON]
    bad = variant(pair, "shifted_cli", shift)
    rc = cli_main(["doctor", "--target", str(pair / "target"), "--draft", str(bad), "--data",
                   str(pair / "sample.txt"), "--steps", "2", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 1 and report["healthy"] is False
    assert all(len(c["acc"]) == 2 for c in report["candidates"])
    rc = cli_main(["doctor", "--target", str(pair / "target"), "--draft", str(pair / "draft"), "--data",
                   str(pair / "sample.txt"), "--steps", "2"])
    assert rc == 0 and "HEALTHY" in capsys.readouterr().out


def test_candidates_stay_in_range():
    sets = dict(candidate_layer_sets([1, 3, 6], 3, 6))
    assert sets["configured"] == [1, 3, 6] and "shifted +1" not in sets  # 7 > L
    assert all(len(ids) == 3 for ids in sets.values())
    with_embedding = dict(candidate_layer_sets([0, 2, 4], 2, 6))
    assert with_embedding["embedding output removed"] == [2, 4]
    assert with_embedding["embedding removed, shifted +1"] == [3, 5]


def test_rope_and_context_mismatches_are_warned(pair):
    def edit(path, config):
        config["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
        config["max_position_embeddings"] = 64
    report = run(pair, variant(pair, "rope", edit))
    checks = {f.check: f for f in report.findings}
    assert checks["rope"].status == "warning" and "rope scaling differs" in checks["rope"].message
    assert checks["context"].status == "warning" and "(64) is shorter than the target's (512)" in checks["context"].message
