import json

import pytest
import torch

from eagle3_ext import Eagle3DraftModel
from eagle3_ext.cli import main as cli_main
from eagle3_ext.train import TrainConfig, Trainer, build_vocab_mapping, expected_acceptance_length, train
from tiny_models import corpus, make_target


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("train")
    make_target(str(d / "target"))
    (d / "data.txt").write_text(corpus(300, seed=1))
    return d


def config(workdir, out, **over):
    base = dict(target=str(workdir / "target"), data=[str(workdir / "data.txt")], out=str(workdir / out),
                ttt_steps=2, epochs=10, lr=1e-2, warmup_steps=5, batch_tokens=512, max_len=64, eval_every=15,
                progress=False, draft_vocab_size=200, max_steps=30)
    base.update(over)
    return TrainConfig(**base)


def test_training_learns_and_exports(workdir):
    train(config(workdir, "run"))
    with open(workdir / "run" / "metrics.json") as f:
        evals = json.load(f)["evals"]
    first, last = evals[0], evals[-1]
    assert first["step"] == 0 and last["step"] == 30
    # The loss falls and acc_0 rises far above chance (1 / 200 for a uniform guess) and above
    # the untrained draft.
    assert last["val_loss"] < first["val_loss"] - 1.0
    assert last["acc"][0] > 0.2 and last["acc"][0] > 5 * first["acc"][0]
    # Both exports load back with the recorded aux layers (EAGLE default for 6 layers).
    from transformers import AutoConfig
    target_cfg = AutoConfig.from_pretrained(workdir / "target")
    for path in (workdir / "run", workdir / "run" / "specforge"):
        draft = Eagle3DraftModel.from_pretrained(str(path), target_config=target_cfg)
        assert draft.aux_layer_ids == [2, 3, 3]
    spec = json.loads((workdir / "run" / "specforge" / "config.json").read_text())
    assert spec["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 2]


def test_resume_continues_from_saved_step(workdir):
    train(config(workdir, "resume", max_steps=10, eval_every=5))
    resumed = Trainer(config(workdir, "resume", max_steps=20, eval_every=5, resume=True))
    assert resumed.state["step"] == 10
    result = resumed.train()
    assert result.step == 20
    steps = [e["step"] for e in json.loads((workdir / "resume" / "metrics.json").read_text())["evals"]]
    assert steps == [0, 5, 10, 15, 20]


def test_init_from_starts_where_the_given_draft_ended(workdir):
    train(config(workdir, "init-src", max_steps=12, eval_every=12, export_specforge=False, export_vllm=False))
    source_final = json.loads((workdir / "init-src" / "metrics.json").read_text())["final"]
    # The same data and seed hold out the same conversations: step 0 of the new run scores the
    # given draft itself, and training goes on from there with a fresh schedule.
    trainer = Trainer(config(workdir, "init-dst", init_from=str(workdir / "init-src"), max_steps=6, eval_every=6,
                             lr=2e-3, export_specforge=False, export_vllm=False))
    assert all(p.dtype == torch.float32 for p in trainer.draft.parameters())
    result = trainer.train()
    first, last = trainer.history[0], trainer.history[-1]
    assert result.step == 6 and first["step"] == 0
    assert first["acc"] == pytest.approx(source_final["acc"], abs=1e-6)
    assert first["val_loss"] == pytest.approx(source_final["val_loss"], rel=1e-4)
    assert last["val_loss"] < first["val_loss"]
    fresh = Trainer(config(workdir, "init-none", max_steps=1))
    assert fresh.evaluate()["val_loss"] > first["val_loss"] + 1.0  # a new draft starts far behind


def test_init_from_refuses_options_that_shape_another_draft(workdir):
    train(config(workdir, "init-base", max_steps=1, export_specforge=False, export_vllm=False))
    base = str(workdir / "init-base")
    with pytest.raises(ValueError, match=r"draft_vocab_size 100 differs from init_from's \(200 in "):
        Trainer(config(workdir, "init-bad", init_from=base, draft_vocab_size=100))
    with pytest.raises(ValueError, match=r"aux_layers \[1, 2, 3\] differ from init_from's \(\[2, 3, 3\]"):
        Trainer(config(workdir, "init-bad", init_from=base, aux_layers=[1, 2, 3]))
    with pytest.raises(ValueError, match="fc_norm=True, but the init_from draft in .* was built without it"):
        Trainer(config(workdir, "init-bad", init_from=base, fc_norm=True))
    with pytest.raises(FileNotFoundError, match="init_from"):
        config(workdir, "init-bad", init_from=str(workdir / "missing")).validate()
    with pytest.raises(TypeError, match="compile must be"):
        config(workdir, "init-bad", compile="yes").validate()


def test_compiled_loss_trains_like_the_eager_one(workdir):
    runs = {}
    for compiled in (False, True):
        trainer = Trainer(config(workdir, f"compiled-{compiled}", compile=compiled, max_steps=3, eval_every=3,
                                 export_specforge=False, export_vllm=False))
        trainer.train()
        runs[compiled] = trainer.history[-1]
    assert runs[True]["acc"] == pytest.approx(runs[False]["acc"], abs=0.02)
    assert runs[True]["val_loss"] == pytest.approx(runs[False]["val_loss"], rel=1e-3)


def test_custom_aux_layers_are_recorded(workdir):
    train(config(workdir, "aux", aux_layers=[1, 4, 6], max_steps=2, export_specforge=False))
    saved = json.loads((workdir / "aux" / "config.json").read_text())
    assert saved["eagle3_ext"]["aux_layer_ids"] == [1, 4, 6]


def test_cli_train_json(workdir, capsys):
    rc = cli_main(["train", "--target", str(workdir / "target"), "--data", str(workdir / "data.txt"),
                   "--out", str(workdir / "cli"), "--ttt-steps", "1", "--max-steps", "2", "--max-len", "64",
                   "--batch-tokens", "256", "--draft-vocab-size", "100", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["step"] == 2 and len(out["acc"]) == 1


def test_bad_data_gives_clear_errors(workdir, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ValueError, match="empty.txt is empty"):
        Trainer(config(workdir, "bad", data=[str(empty)]))
    chat = tmp_path / "chat.jsonl"
    long_prompt = " ".join(["def"] * 200)
    chat.write_text(json.dumps({"messages": [{"role": "user", "content": long_prompt},
                                             {"role": "assistant", "content": "return"}]}) + "\n")
    with pytest.raises(ValueError, match=r"chat.jsonl:1: the prompt before the first assistant token is \d+ "
                                         r"tokens, longer than max_len=64"):
        Trainer(config(workdir, "bad", data=[str(chat)]))
    with pytest.raises(ValueError, match=r"draft_vocab_size 100000 is larger than the target vocabulary \(336\)"):
        Trainer(config(workdir, "bad", draft_vocab_size=100000))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Trainer(config(workdir, "bad", data=[str(tmp_path / "missing.txt")]))
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text("{not json}\n")
    with pytest.raises(ValueError, match="bad.jsonl:1: not valid JSON"):
        Trainer(config(workdir, "bad", data=[str(bad_json)]))


def test_chat_data_trains_on_assistant_tokens_only(workdir, tmp_path):
    chat = tmp_path / "chat.jsonl"
    chat.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": "def print"},
                                                       {"role": "assistant", "content": "return value"}]})
                              for _ in range(4)) + "\n")
    trainer = Trainer(config(workdir, "chat", data=[str(chat)], max_steps=1))
    ex = trainer.train_set[0]
    tok = trainer.source.tokenizer
    assistant = tok.decode(ex.input_ids[ex.loss_mask])
    assert "return value" in assistant and "def print" not in assistant


def test_expected_acceptance_length_by_hand():
    # 1 + a0 + a0 a1 + ...: the bonus token plus each draft position reached.
    assert expected_acceptance_length([0.5, 0.5]) == pytest.approx(1.75)
    assert expected_acceptance_length([1.0, 1.0, 1.0]) == pytest.approx(4.0)
    assert expected_acceptance_length([0.0, 1.0]) == pytest.approx(1.0)


def test_vocab_mapping_picks_most_frequent():
    counts = torch.tensor([5, 0, 9, 1, 9, 0])
    d2t, t2d = build_vocab_mapping(counts, 3)
    assert (torch.arange(3) + d2t).tolist() == [0, 2, 4]
    assert t2d.tolist() == [True, False, True, False, True, False]
    with pytest.raises(ValueError, match="larger than the target vocabulary"):
        build_vocab_mapping(counts, 7)


def test_mixed_precision_keeps_fp32_master_weights(workdir):
    trainer = Trainer(config(workdir, "amp", amp="bfloat16", max_steps=4, eval_every=100))
    result = trainer.train()
    assert result.step == 4
    assert all(p.dtype == torch.float32 for p in trainer.draft.parameters())
    first, last = trainer.history[0], trainer.history[-1]
    assert last["val_loss"] < first["val_loss"]  # bf16 matmuls still train


def test_validation_share_is_capped(workdir):
    assert len(Trainer(config(workdir, "cap", val_max_examples=2)).val) == 2
    assert len(Trainer(config(workdir, "nocap")).val) > 2  # 10% of the data here


def test_train_config_validation(workdir):
    with pytest.raises(ValueError, match="amp must be one of 'bfloat16', 'float16', got 'int8'"):
        config(workdir, "x", amp="int8").validate()
    with pytest.raises(ValueError, match="val_max_examples must be a positive integer, got 0"):
        config(workdir, "x", val_max_examples=0).validate()
    with pytest.raises(ValueError, match="dtype must be one of"):
        config(workdir, "x", dtype="int8").validate()
    with pytest.raises(ValueError, match=r"batch_tokens \(32\) must hold one sequence of max_len \(64\)"):
        config(workdir, "x", batch_tokens=32).validate()


def test_convention_flags_train_and_export(workdir, caplog):
    rc = cli_main(["train", "--target", str(workdir / "target"), "--data", str(workdir / "data.txt"),
                   "--out", str(workdir / "flags"), "--ttt-steps", "2", "--max-steps", "3", "--max-len", "64",
                   "--batch-tokens", "256", "--draft-vocab-size", "100", "--fc-norm", "--norm-output",
                   "--norm-before-residual", "--json"])
    assert rc == 0
    ours = json.loads((workdir / "flags" / "config.json").read_text())["eagle3_ext"]
    assert ours["fc_norm"] and ours["norm_output"] and ours["norm_before_residual"] and not ours["norm_before_fc"]
    assert ours["fingerprint"]["aux_layer_ids"] == ours["aux_layer_ids"]
    vllm = json.loads((workdir / "flags" / "vllm" / "config.json").read_text())
    assert vllm["fc_norm"] and vllm["norm_output"] and vllm["norm_before_residual"]
    assert vllm["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 2
    assert vllm["speculators_config"]["verifier"]["name_or_path"] == str(workdir / "target")
    # SpecForge's draft feeds the pre-norm state back: that export is refused, with the reason.
    assert not (workdir / "flags" / "specforge").exists()
    assert "not exporting the specforge format" in caplog.text and "norm_output" in caplog.text
    from transformers import AutoConfig
    for path in (workdir / "flags", workdir / "flags" / "vllm"):
        draft = Eagle3DraftModel.from_pretrained(str(path), target_config=AutoConfig.from_pretrained(workdir / "target"))
        assert draft.config.fc_norm and draft.config.norm_output and len(draft.fc_norm) == 3
    # the two pre-fc norms exclude each other
    assert cli_main(["train", "--target", str(workdir / "target"), "--data", str(workdir / "data.txt"),
                     "--out", str(workdir / "x"), "--fc-norm", "--norm-before-fc"]) == 2
