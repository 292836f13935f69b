import json
import shutil

import pytest
import torch

from eagle3_ext.cli import main as cli_main
from eagle3_ext.doctor import candidate_layer_sets, diagnose, paired_difference
from eagle3_ext.doctor.faults import NOT_COPIED, edited_copy, plant
from eagle3_ext.train import TrainConfig, train
from tiny_models import corpus, make_target

TRAINED_ON = [1, 2, 4]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A 6-layer target (neighbouring layers made distinct, as in trained models) and a draft
    trained in the test on known layers (the trainer records its activation fingerprint)."""
    d = tmp_path_factory.mktemp("doctor")
    make_target(str(d / "target"), residual_scale=16.0)
    (d / "data.txt").write_text(corpus(300, seed=1))
    train(TrainConfig(target=str(d / "target"), data=[str(d / "data.txt")], out=str(d / "draft"),
                      aux_layers=TRAINED_ON, draft_vocab_size=200, ttt_steps=2, epochs=20, lr=1e-2, warmup_steps=5,
                      batch_tokens=512, max_len=64, eval_every=1000, progress=False, max_steps=80,
                      export_specforge=False, export_vllm=False))
    (d / "sample.txt").write_text(corpus(40, seed=9))
    return d


def variant(pair, fault):
    """A copy of the trained draft with one planted fault of the doctor's matrix."""
    return plant(str(pair / "draft"), str(pair / fault.replace(" ", "_").replace(",", "")), fault)


def run(pair, draft_dir, **kwargs):
    options = dict(steps=2, max_examples=16, max_len=48, prompt_tokens=8, acceptance_prompts=2,
                   acceptance_tokens=16)
    options.update(kwargs)
    return diagnose(str(pair / "target"), str(draft_dir), [str(pair / "sample.txt")], **options)


def test_healthy_pair_is_healthy_with_confidence(pair):
    report = run(pair, pair / "draft")
    assert report.healthy and report.verdict.startswith("HEALTHY"), report.verdict
    assert report.exit_code == 0 and report.fingerprint["ok"]
    names = {c.name for c in report.candidates}
    assert names >= {"configured", "shifted -1", "shifted +1", "reversed", "norm_before_residual flipped"}
    flips = [c for c in report.candidates if c.flags]
    assert flips and all(c.z <= -3 for c in flips)  # what HEALTHY rests on besides the fingerprint
    assert report.data["source"] == "self-generated" and report.data["scored_tokens"] > 0
    assert report.acceptance["configured"]["acceptance_length"] > 1.0


def test_shifted_capture_is_a_fault_with_the_trained_layers_recommended(pair):
    report = run(pair, variant(pair, "shifted capture"))
    assert report.verdict.startswith("FAULT") and report.exit_code == 1
    fp = next(f for f in report.findings if f.check == "activation fingerprint")
    assert fp.status == "fault" and report.fingerprint["looks_like"] == [i + 1 for i in TRAINED_ON]
    assert report.recommended_aux_layer_ids == TRAINED_ON
    assert report.recommended_config["eagle3_ext.aux_layer_ids"] == TRAINED_ON
    assert report.recommended_config["eagle_config.eagle_aux_hidden_state_layer_ids"] == [0, 1, 3]
    back = next(c for c in report.candidates if c.name == "shifted -1")
    assert back.aux_layer_ids == TRAINED_ON and back.z > 0


def test_shifted_capture_without_fingerprint_is_found_by_measurement(pair):
    report = run(pair, variant(pair, "shifted capture, no fingerprint"))
    assert report.verdict.startswith("FAULT"), report.verdict
    measured = next(f for f in report.findings if f.check == "setup (measured)")
    assert measured.status == "fault" and "z = " in measured.message
    assert report.recommended_aux_layer_ids == TRAINED_ON
    best = next(c for c in report.candidates if c.aux_layer_ids == TRAINED_ON and not c.flags)
    assert best.z >= 3
    assert report.acceptance[best.name]["acceptance_length"] >= report.acceptance["configured"]["acceptance_length"]


def test_flipped_residual_convention_is_named(pair):
    report = run(pair, variant(pair, "flipped residual"))
    assert report.verdict.startswith("FAULT"), report.verdict
    assert report.recommended_config == {"norm_before_residual": False}
    winner = next(c for c in report.candidates if c.name == "norm_before_residual flipped")
    assert winner.z >= 3


def test_embedding_output_added_is_named(pair):
    report = run(pair, variant(pair, "embedding output added"))
    assert not report.healthy
    static = next(f for f in report.findings if f.check == "aux layers vs fc")
    assert "embedding output" in static.message
    assert report.recommended_aux_layer_ids == TRAINED_ON


def test_zeroed_d2t_is_named_and_measurement_skipped(pair):
    report = run(pair, variant(pair, "zeroed d2t"))
    assert report.verdict.startswith("FAULT") and "d2t" in report.verdict
    fault = next(f for f in report.findings if f.check == "vocabulary map (d2t/t2d)")
    assert "d2t is all zeros" in fault.message and "d2t" in report.recommended_config
    assert not report.candidates and report.recommended_aux_layer_ids is None


def test_too_little_data_is_inconclusive_and_says_how_much_more(pair):
    # One short sequence is a single block of tokens: no standard error, so nothing is decided.
    report = run(pair, variant(pair, "shifted capture, no fingerprint"), max_examples=1, max_len=20,
                 acceptance_prompts=0)
    assert report.verdict.startswith("INCONCLUSIVE"), report.verdict
    assert report.exit_code == 3 and "scored tokens would decide" in report.verdict


def _candidate(name, z, gain=0.1, flags=None):
    from eagle3_ext.doctor import Candidate
    return Candidate(name, [1, 2, 3], dict(flags or {}), acc=[0.5], loss=1.0, loss_gain=gain, z=z)


def test_verdict_rule():
    from eagle3_ext.doctor.verdict import judge
    flip = dict(flags={"norm_before_residual": True})
    # Two decisive winners: the larger gain wins, not the larger z.
    d = judge([_candidate("a", 9.0, gain=0.01), _candidate("b", 4.0, gain=0.05), _candidate("c", -8)], False)
    assert d.status == "fault" and d.winner.name == "b"
    assert judge([_candidate("a", -4), _candidate("f", -30, **flip)], False).status == "ok"
    undecided = judge([_candidate("a", -1.5), _candidate("f", -30, **flip)], False)
    assert undecided.status == "inconclusive" and [c.name for c in undecided.undecided] == ["a"]
    # A matching fingerprint settles the capture candidates, not the conventions.
    assert judge([_candidate("a", -1.5), _candidate("f", -30, **flip)], True).status == "ok"
    assert judge([_candidate("a", -10), _candidate("f", -2, **flip)], True).status == "inconclusive"


def test_cli_json_and_exit_codes(pair, capsys):
    bad = variant(pair, "shifted capture")
    common = ["--data", str(pair / "sample.txt"), "--steps", "2", "--max-examples", "16", "--max-len", "48",
              "--prompt-tokens", "8", "--acceptance-prompts", "0"]
    rc = cli_main(["doctor", "--target", str(pair / "target"), "--draft", str(bad), "--json"] + common)
    report = json.loads(capsys.readouterr().out)
    assert rc == 1 and report["healthy"] is False and report["verdict"].startswith("FAULT")
    assert report["recommended_aux_layer_ids"] == TRAINED_ON
    assert report["recommended_config"]["eagle_aux_hidden_state_layer_ids"] == TRAINED_ON
    assert all(len(c["acc"]) == 2 and "z" in c for c in report["candidates"])
    rc = cli_main(["doctor", "--target", str(pair / "target"), "--draft", str(pair / "draft")] + common)
    assert rc == 0 and "HEALTHY" in capsys.readouterr().out


def test_write_fingerprint_after_a_healthy_verdict(pair):
    from eagle3_ext import Eagle3DraftModel
    plain = pair / "nofp"  # healthy, without the fingerprint the trainer wrote
    shutil.rmtree(plain, ignore_errors=True)
    shutil.copytree(pair / "draft", plain, ignore=shutil.ignore_patterns(*NOT_COPIED))
    config = json.loads((plain / "config.json").read_text())
    config["eagle3_ext"].pop("fingerprint")
    (plain / "config.json").write_text(json.dumps(config))
    assert Eagle3DraftModel.from_pretrained(str(plain)).config.fingerprint is None
    report = run(pair, plain, write_fingerprint=True, acceptance_prompts=0)
    assert report.healthy, report.verdict
    fp = Eagle3DraftModel.from_pretrained(str(plain)).config.fingerprint
    assert fp is not None and fp["aux_layer_ids"] == TRAINED_ON
    with pytest.raises(ValueError, match="not HEALTHY"):
        run(pair, variant(pair, "shifted capture, no fingerprint"), write_fingerprint=True,
            acceptance_prompts=0)


def test_candidates_stay_in_range():
    sets = dict(candidate_layer_sets([1, 3, 6], 3, 6))
    assert sets["configured"] == [1, 3, 6] and "shifted +1" not in sets  # 7 > L
    assert all(len(ids) == 3 for ids in sets.values())
    assert sets["embedding output in place of the lowest layer"] == [0, 3, 6]
    with_embedding = dict(candidate_layer_sets([0, 2, 4], 2, 6))
    assert with_embedding["embedding output removed"] == [2, 4]
    assert with_embedding["embedding removed, shifted +1"] == [3, 5]
    replaced = dict(candidate_layer_sets([0, 4, 5], 3, 8))
    assert replaced["embedding output replaced by 2"] == [2, 4, 5]
    assert "EAGLE default" not in replaced  # the same ids, listed once


def test_paired_difference_z_and_block_error():
    gen = torch.Generator().manual_seed(0)
    a = [torch.randn(64, generator=gen) + 0.5 for _ in range(8)]
    b = [x - 0.5 + 0.01 * torch.randn(64, generator=gen) for x in a]  # a is 0.5 higher, tiny noise
    d = paired_difference(a, b)
    assert d.tokens == 512 and d.blocks == 32 and abs(d.mean - 0.5) < 0.01 and d.z > 100
    same = paired_difference(a, a)
    assert same.mean == 0 and same.z == 0
    noisy = paired_difference([torch.randn(64, generator=gen) for _ in range(2)],
                              [torch.randn(64, generator=gen) for _ in range(2)])
    assert abs(noisy.z) < 3 and noisy.tokens_to_decide() > noisy.tokens


def test_rope_and_context_mismatches_are_warned(pair):
    def edit(path, config):
        config["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
        config["max_position_embeddings"] = 64
    report = run(pair, edited_copy(str(pair / "draft"), str(pair / "rope"), edit), acceptance_prompts=0)
    checks = {f.check: f for f in report.findings}
    assert checks["rope"].status == "warning" and "rope scaling differs" in checks["rope"].message
    assert checks["context"].status == "warning" and "(64) is shorter than the target's (512)" in checks["context"].message
