"""`eagle3 train shrink-vocab` / `shrink_draft_vocab`: a trained draft cut to a smaller vocabulary
keeps each kept token's lm_head row and logit, gets the vocabulary a training run at that size
would have chosen, and still decodes losslessly."""

import json

import pytest
import torch

from eagle3_ext import Eagle3DraftModel, SpeculativeGenerator, TreeConfig
from eagle3_ext.cli import main as cli_main
from eagle3_ext.errors import BadInputError
from eagle3_ext.models import bundled_paths
from eagle3_ext.train import ShrinkVocabConfig, TrainConfig, Trainer, shrink_draft_vocab, shrink_vocab, train
from bad_inputs import cli_error
from tiny_models import corpus, make_target


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny target and a draft trained on it with a 200-token vocabulary."""
    d = tmp_path_factory.mktemp("shrink")
    make_target(str(d / "target"))
    (d / "data.txt").write_text(corpus(300, seed=1))
    train(TrainConfig(target=str(d / "target"), data=[str(d / "data.txt")], out=str(d / "draft"), ttt_steps=2,
                      lr=1e-2, warmup_steps=5, batch_tokens=512, max_len=64, eval_every=100, progress=False,
                      draft_vocab_size=200, max_steps=20, export_specforge=False, export_vllm=False))
    return d


def _target_ids(draft) -> list:
    return (torch.arange(draft.d2t.numel()) + draft.d2t).tolist()


def test_kept_tokens_keep_their_rows_and_the_most_frequent_stay():
    draft = Eagle3DraftModel.from_pretrained(bundled_paths()[1])
    before_ids = _target_ids(draft)
    rows = dict(zip(before_ids, draft.lm_head.weight.detach().clone()))
    counts = torch.randint(0, 50, (draft.t2d.numel(),), generator=torch.Generator().manual_seed(0))
    shrink_draft_vocab(draft, counts, 1000)
    kept = _target_ids(draft)
    # By hand: the draft's own ids by count, highest first, the lower id first among equals.
    expected = sorted(sorted(before_ids, key=lambda t: (-int(counts[t]), t))[:1000])
    assert kept == expected
    assert draft.config.draft_vocab_size == 1000 and draft.lm_head.out_features == 1000
    assert draft.t2d.nonzero().flatten().tolist() == kept
    assert all(torch.equal(draft.lm_head.weight[j], rows[t]) for j, t in enumerate(kept))


def test_shrinking_gives_the_vocabulary_training_at_that_size_chooses(trained, tmp_path, capsys):
    out = tmp_path / "small"
    rc = cli_main(["train", "shrink-vocab", "--draft", str(trained / "draft"), "--target", str(trained / "target"),
                   "--data", str(trained / "data.txt"), "--max-len", "64", "--draft-vocab-size", "30",
                   "--out", str(out), "--json"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert report["draft_vocab_size"] == [200, 30]
    assert report["train_coverage"][1] < report["train_coverage"][0] <= 1.0
    small = Eagle3DraftModel.from_pretrained(str(out))
    big = Eagle3DraftModel.from_pretrained(str(trained / "draft"))
    assert small.lm_head.weight.dtype == big.lm_head.weight.dtype
    # The trainer's own choice at 30 tokens, on the same data and split.
    at_30 = Trainer(TrainConfig(target=str(trained / "target"), data=[str(trained / "data.txt")],
                                out=str(tmp_path / "unused"), max_len=64, draft_vocab_size=30, progress=False))
    assert torch.equal(small.d2t, at_30.draft.d2t) and torch.equal(small.t2d, at_30.draft.t2d)
    # Every other weight is the trained draft's.
    small_state, big_state = small.state_dict(), big.state_dict()
    cut = ("lm_head.weight", "d2t", "t2d")
    assert all(torch.equal(small_state[k], big_state[k]) for k in big_state if k not in cut)


def test_a_shrunk_draft_decodes_losslessly(trained, tmp_path):
    out = tmp_path / "small"
    assert cli_main(["train", "shrink-vocab", "--draft", str(trained / "draft"), "--target",
                     str(trained / "target"), "--data", str(trained / "data.txt"), "--max-len", "64",
                     "--draft-vocab-size", "40", "--out", str(out)]) == 0
    gen = SpeculativeGenerator.from_pretrained(str(trained / "target"), str(out), dtype="float32",
                                               tree=TreeConfig(depth=3, topk=2, num_draft_tokens=8, lookup_tokens=0))
    prompt = gen.tokenizer(corpus(2, seed=7), return_tensors="pt")
    ours = gen.generate(**prompt, max_new_tokens=24, return_dict_in_generate=True)
    plain = gen.target.generate(**prompt, max_new_tokens=24, do_sample=False)
    assert ours.sequences.tolist() == plain.tolist()
    assert ours.stats.acceptance_length > 1.0  # the shrunk draft still proposes accepted tokens


def test_bad_sizes_and_counts_are_errors_that_name_them():
    draft = Eagle3DraftModel.from_pretrained(bundled_paths()[1])
    counts = torch.ones(draft.t2d.numel(), dtype=torch.int64)
    for size in (0, draft.config.draft_vocab_size + 1):
        with pytest.raises(BadInputError, match=rf"draft_vocab_size must be in \[1, 4096\].*got {size}"):
            shrink_draft_vocab(draft, counts, size)
    with pytest.raises(BadInputError, match=r"token_counts must be a vector of the target vocabulary's 8192 counts, "
                                            r"got shape \(100,\)"):
        shrink_draft_vocab(draft, counts[:100], 10)
    assert draft.config.draft_vocab_size == 4096  # refused calls change nothing


@pytest.mark.parametrize("args, message", [
    (["--draft", "{missing}"], "argument --draft: {missing} does not exist"),
    (["--draft", "{target}"], "not an EAGLE-3 draft"),
    (["--target", "{missing}"], "argument --target: {missing} does not exist"),
    (["--target", "{draft}"], "holds an EAGLE-3 draft, not a target model"),
    (["--target", "{toy_target}"], "its tokenizer has 8192 tokens but the draft's vocabulary map covers 336"),
    (["--data", "{missing}"], "argument --data: {missing} does not exist"),
    (["--data", "{empty}"], "is empty"),
    (["--draft-vocab-size", "0"], "argument --draft-vocab-size: expected a positive integer, got 0"),
    (["--draft-vocab-size", "-3"], "argument --draft-vocab-size: expected a positive integer, got -3"),
    (["--draft-vocab-size", "x"], "argument --draft-vocab-size: expected a positive integer, got 'x'"),
    (["--draft-vocab-size", "201"], "draft_vocab_size must be in [1, 200] (the draft's vocabulary now), got 201"),
    (["--out", ""], "argument --out: expected a non-empty"),
    (["--max-len", "0"], "argument --max-len: expected an integer >= 4, got 0"),
    (["--val-examples", "0"], "argument --val-examples: expected a positive integer, got 0"),
    (["--seed", "-1"], "argument --seed: expected an integer"),
    (["--json=1"], "argument --json: ignored explicit argument '1'"),
], ids=["draft-missing", "draft-kind", "target-missing", "target-kind", "target-other", "data-missing", "data-empty",
        "size-zero", "size-negative", "size-type", "size-too-large", "out-empty", "max-len-zero", "val-zero",
        "seed-negative", "json-value"])
def test_cli_bad_input_is_one_clear_line(trained, tmp_path, capsys, args, message):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    values = {"missing": str(tmp_path / "missing"), "target": str(trained / "target"), "draft": str(trained / "draft"),
              "toy_target": bundled_paths()[0], "empty": str(empty)}
    options = {"--draft": "{draft}", "--target": "{target}", "--data": str(trained / "data.txt"),
               "--draft-vocab-size": "30", "--out": str(tmp_path / "out"), "--max-len": "64"}
    last = cli_error(["train", "shrink-vocab"], options, args, values, capsys)
    assert message.format(**values) in last, last


@pytest.mark.parametrize("over, error, message", [
    (dict(draft="missing"), FileNotFoundError, "draft: missing does not exist, expected a directory"),
    (dict(data="data.txt"), TypeError, "data must be a non-empty list of file paths, got 'data.txt'"),
    (dict(data=[]), TypeError, r"data must be a non-empty list of file paths, got \[\]"),
    (dict(draft_vocab_size=0), ValueError, "draft_vocab_size must be a positive integer, got 0"),
    (dict(draft_vocab_size=2.5), TypeError, r"draft_vocab_size must be a positive integer, got 2.5 \(float\)"),
    (dict(max_len=3), ValueError, "max_len must be an integer >= 4, got 3"),
    (dict(val_examples=0), ValueError, "val_examples must be a positive integer, got 0"),
    (dict(seed=-1), ValueError, r"seed must be an integer in \[0, .*\], got -1"),
    (dict(val_fraction=0), ValueError, r"val_fraction must be a number in \(0, 1\], got 0"),
], ids=["draft-missing", "data-string", "data-empty", "size-zero", "size-float", "max-len", "val-examples", "seed",
        "val-fraction"])
def test_config_errors_name_the_field(trained, tmp_path, over, error, message):
    config = dict(draft=str(trained / "draft"), target=str(trained / "target"), data=[str(trained / "data.txt")],
                  draft_vocab_size=30, out=str(tmp_path / "out"), max_len=64)
    with pytest.raises(error, match=message):
        shrink_vocab(ShrinkVocabConfig(**{**config, **over}))
    assert not (tmp_path / "out").exists()  # nothing written
