"""The draft's n-gram table for hybrid drafting (``draft/lookup_corpus.py``, ``eagle3 train
ngrams``): counted as a by-hand tally says, proposed greedily through the longest known context,
stored and read back, carried by the draft's checkpoints, taken only where the request's own
tokens match little, and lossless in generation."""

import json
import os

import pytest
import torch

from eagle3_ext import Eagle3DraftModel, SpeculativeGenerator, TreeConfig
from eagle3_ext.bench.baseline import hf_generate
from eagle3_ext.cli import main as cli_main
from eagle3_ext.decoding.lookup import NgramLookup
from eagle3_ext.draft import lookup_corpus
from eagle3_ext.draft.lookup_corpus import LookupCorpus
from eagle3_ext.errors import BadInputError
from eagle3_ext.models import bundled_paths
from eagle3_ext.train.data import Example
from bad_inputs import cli_error
from tiny_models import corpus, make_trained_pair


def example(ids, trained=None):
    ids = torch.tensor(ids)
    mask = torch.ones(len(ids), dtype=torch.bool) if trained is None else torch.tensor(trained)
    return Example(ids, mask)


def tally(examples, max_ngram, min_count):
    """The table by hand: every (context, successor) pair of a trained token, counted in a flat
    list, then per context the most frequent successor (the first seen among equals)."""
    pairs = []
    for e in examples:
        ids, mask = e.input_ids.tolist(), e.loss_mask.tolist()
        for i in range(len(ids)):
            for n in range(2, max_ngram + 1):
                if mask[i] and i >= n:
                    pairs.append((tuple(ids[i - n:i]), ids[i]))
    table = {}
    for context in dict.fromkeys(c for c, _ in pairs):
        successors = [s for c, s in pairs if c == context]
        if len(successors) >= min_count:
            best = max(dict.fromkeys(successors), key=successors.count)  # max keeps the first of equals
            table[context] = (best, successors.count(best) / len(successors))
    return table


def same_table(a, b):
    """Equal contexts and successors, shares equal to float32 precision (as the file stores them)."""
    return a.keys() == b.keys() and all(
        a[n].keys() == b[n].keys() and all(a[n][c][0] == b[n][c][0] and abs(a[n][c][1] - b[n][c][1]) < 1e-6
                                           for c in a[n]) for n in a)


# --- counting and proposing -----------------------------------------------------------------------

@pytest.mark.parametrize("max_ngram, min_count", [(2, 1), (3, 2), (4, 1)])
def test_the_table_is_the_by_hand_tally(max_ngram, min_count):
    g = torch.Generator().manual_seed(max_ngram * 10 + min_count)
    examples = [example(torch.randint(0, 5, (30,), generator=g).tolist(),
                        (torch.rand(30, generator=g) < 0.7).tolist()) for _ in range(6)]
    table = LookupCorpus.count(examples, vocab_size=5, max_ngram=max_ngram, min_count=min_count)
    want = tally(examples, max_ngram, min_count)
    got = {c: hit for n in table.table for c, hit in table.table[n].items()}
    assert got.keys() == want.keys() and len(table) == len(want)
    for context, (token, share) in want.items():
        assert got[context][0] == token and got[context][1] == pytest.approx(share)


def test_only_trained_tokens_are_counted_but_any_token_is_context():
    # 7 8 is the prompt (untrained); 9 after it is trained, so (7, 8) -> 9 is counted, while
    # nothing predicts the untrained 8.
    table = LookupCorpus.count([example([7, 8, 9, 1], [False, False, True, True])], 10, max_ngram=3, min_count=1)
    assert table.table[2] == {(7, 8): (9, 1.0), (8, 9): (1, 1.0)}
    assert table.table[3] == {(7, 8, 9): (1, 1.0)}


def test_proposals_follow_the_longest_known_context_with_cumulative_shares():
    table = LookupCorpus({2: {(1, 2): (3, 0.5), (2, 3): (4, 0.8), (3, 5): (6, 1.0)},
                          3: {(1, 2, 3): (5, 0.9)}}, vocab_size=10, min_count=1)
    chain, scores, first = table.propose([0, 1, 2], 4)
    # (1, 2) -> 3; then (1, 2, 3) -> 5 beats (2, 3) -> 4; then (3, 5) -> 6; then (5, 6) is unknown.
    assert chain == [3, 5, 6] and first == 2
    assert scores == pytest.approx([0.5, 0.45, 0.45])
    assert table.propose([0, 1, 2], 1)[0] == [3]
    assert table.propose([4, 4], 5) == ([], [], 0)
    assert table.propose([2], 5) == ([], [], 0)  # shorter than the shortest context


def test_a_request_takes_the_tables_chain_only_where_its_own_match_is_short():
    table = LookupCorpus({2: {(1, 2): (3, 0.5), (5, 6): (9, 0.9)}, 3: {(8, 5, 6): (7, 0.6)}}, 10, 1)
    lk = NgramLookup(3, 4, corpus=table)
    lk.tokens.extend([5, 6, 0, 1, 2])  # its own tokens: only 2 matches nothing, 1 2 never seen
    assert lk.propose() == [3] and lk.from_corpus and lk.scores(1) == [0.5]
    before = lk.rate
    assert lk.record([3], [3, 4]) == 1
    assert lk.rate == before  # the table's outcomes leave the request's own copy record alone
    lk.tokens.extend([3, 5, 6])  # 5 6 occurred in its own tokens: a 2-token match, its own copy wins
    assert lk.propose() == [0, 1, 2, 3] and not lk.from_corpus
    assert lk.scores(2) == pytest.approx([before, before ** 2])
    plain = NgramLookup(3, 4)
    plain.tokens.extend([5, 6, 0, 1, 2])
    assert plain.propose() == [] and not plain.from_corpus


# --- files and checkpoints ------------------------------------------------------------------------

def small_table():
    examples = [example([1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 4])]
    return LookupCorpus.count(examples, vocab_size=8192, max_ngram=3, min_count=1)


def test_a_saved_table_reads_back_the_same_and_saves_the_same_bytes(tmp_path):
    table = small_table()
    table.save(str(tmp_path / "a.safetensors"))
    again = LookupCorpus.load(str(tmp_path / "a.safetensors"))
    assert same_table(again.table, table.table) and again.vocab_size == 8192 and again.min_count == 1
    again.save(str(tmp_path / "b.safetensors"))
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()


def test_files_that_are_no_table_are_errors_naming_them(tmp_path):
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not safetensors")
    with pytest.raises(BadInputError, match="junk.safetensors: not a readable safetensors file"):
        LookupCorpus.load(str(junk))
    from safetensors.torch import save_file
    other = tmp_path / "other.safetensors"
    save_file({"x": torch.zeros(2)}, str(other))
    with pytest.raises(BadInputError, match="other.safetensors: not an n-gram table"):
        LookupCorpus.load(str(other))
    gap = LookupCorpus({2: {(1, 2): (3, 1.0)}, 4: {(1, 2, 3, 4): (5, 1.0)}}, 8, 1)  # no 3-token contexts
    gap.save(str(tmp_path / "gap.safetensors"))
    with pytest.raises(BadInputError, match=r"gap.safetensors: a damaged n-gram table \(context lengths \[2, 4\]"):
        LookupCorpus.load(str(tmp_path / "gap.safetensors"))


@pytest.mark.parametrize("fmt", ["eagle3_ext", "specforge", "vllm"])
def test_the_table_travels_with_the_draft_in_every_format(tmp_path, fmt):
    draft = Eagle3DraftModel.from_pretrained(bundled_paths()[1])
    assert draft.lookup_corpus is None  # the toy draft ships none
    draft.lookup_corpus = small_table()
    draft.save_pretrained(str(tmp_path / "d"), format=fmt)
    loaded = Eagle3DraftModel.from_pretrained(str(tmp_path / "d"))
    assert same_table(loaded.lookup_corpus.table, draft.lookup_corpus.table)
    loaded.lookup_corpus = None  # saving a draft without one over it removes the old file
    loaded.save_pretrained(str(tmp_path / "d"), format=fmt)
    assert not os.path.exists(tmp_path / "d" / lookup_corpus.FILE_NAME)


def test_a_table_of_another_vocabulary_is_refused_by_the_target():
    target, draft_dir = bundled_paths()
    draft = Eagle3DraftModel.from_pretrained(draft_dir)
    draft.lookup_corpus = LookupCorpus({2: {}}, vocab_size=49152, min_count=2)
    with pytest.raises(BadInputError, match="counted over a vocabulary of 49152 tokens, the target has 8192"):
        SpeculativeGenerator.from_pretrained(target, draft, dtype="float32")


def test_asking_for_a_table_the_draft_lacks_is_an_error():
    target, draft = bundled_paths()  # the toy draft ships no table
    gen = SpeculativeGenerator.from_pretrained(target, draft, dtype="float32",
                                               tree=TreeConfig(3, 1, 10, lookup_tokens=6, lookup_corpus=True))
    with pytest.raises(BadInputError, match=r"the draft ships no n-gram table \(lookup_ngrams.safetensors\); count "
                                            "one with `eagle3 train ngrams`"):
        gen.generate("def add(a, b):", max_new_tokens=4)


def test_tree_labels_and_bench_specs_name_the_table():
    assert TreeConfig.chain(5, lookup_tokens=10).name == "chain5+lookup10"
    on = TreeConfig(depth=5, topk=1, num_draft_tokens=16, lookup_tokens=10, lookup_corpus=True)
    assert on.name == "chain5+lookup10+corpus"
    from eagle3_ext.cli.bench import _parse_trees
    assert _parse_trees(["5,1,16,10,corpus"]) == {on.name: on}
    for spec in ("5,1,6,corpus", "5,1,16,10,corpus,sampled"):
        with pytest.raises(BadInputError, match="or after LOOKUP_TOKENS by ,corpus"):
            _parse_trees([spec])


# --- the command and generation -------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny target, a draft trained on the target's own continuations, and that data."""
    d = tmp_path_factory.mktemp("ngrams")
    target, tok = make_trained_pair(str(d), layers=4, self_generated=True)
    return d, target, tok


def test_the_command_writes_the_table_of_the_training_split(trained, tmp_path, capsys):
    d, _, _ = trained
    argv = ["train", "ngrams", "--draft", str(d / "draft"), "--target", str(d / "target"), "--data",
            str(d / "data.jsonl"), "--max-len", "64", "--max-ngram", "3", "--json"]
    assert cli_main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["out"] == str(d / "draft" / lookup_corpus.FILE_NAME)
    from eagle3_ext.train.training_split import TrainingSplit
    from eagle3_ext.preflight.loading import load_tokenizer
    train, val = TrainingSplit(target=str(d / "target"), data=[str(d / "data.jsonl")], max_len=64).examples(
        load_tokenizer(str(d / "target")), 8192)
    assert report["train_examples"] == len(train) and report["val_examples"] == len(val) > 0
    table = LookupCorpus.load(report["out"])
    assert same_table(table.table, LookupCorpus.count(train, 8192, 3, 2).table)
    assert report["contexts"] == len(table) > 0 and 0 < report["held_out_right"] <= report["held_out_known"] <= 1


def test_generation_with_the_table_is_token_identical_and_uses_it(trained):
    d, target, tok = trained
    assert cli_main(["train", "ngrams", "--draft", str(d / "draft"), "--target", str(d / "target"), "--data",
                     str(d / "data.jsonl"), "--max-len", "64", "--min-count", "1"]) == 0
    draft = Eagle3DraftModel.from_pretrained(str(d / "draft"), target_config=target.config)
    assert draft.lookup_corpus is not None
    prompts = corpus(6, seed=11).splitlines()
    expected = hf_generate(target, tok, prompts, 32, stop_at_eos=False)[0]
    counts = {}
    for use in (True, False):
        cfg = TreeConfig(depth=3, topk=1, num_draft_tokens=12, lookup_tokens=8, lookup_corpus=use)
        gen = SpeculativeGenerator(target, draft, cfg, tokenizer=tok)
        out = gen.generate(prompts, max_new_tokens=32, eos_token_id=[], return_dict_in_generate=True)
        assert out.new_tokens == expected
        counts[use] = out.stats
    assert counts[True].corpus_proposed > 0 and counts[True].corpus_accepted > 0
    assert counts[False].corpus_proposed == 0


@pytest.mark.parametrize("args, message", [
    (["--draft", "{missing}"], "argument --draft: {missing} does not exist"),
    (["--draft", "{target}"], "not an EAGLE-3 draft"),
    (["--target", "{draft}"], "holds an EAGLE-3 draft, not a target model"),
    (["--max-ngram", "1"], "argument --max-ngram: expected an integer in [2, 8], got 1"),
    (["--max-ngram", "9"], "argument --max-ngram: expected an integer in [2, 8], got 9"),
    (["--min-count", "0"], "argument --min-count: expected a positive integer, got 0"),
    (["--min-count", "x"], "argument --min-count: expected a positive integer, got 'x'"),
    (["--max-len", "0"], "argument --max-len: expected an integer >= 4, got 0"),
], ids=["draft-missing", "draft-kind", "target-kind", "ngram-small", "ngram-large", "count-zero", "count-type",
        "max-len"])
def test_cli_bad_input_is_one_clear_line(trained, tmp_path, capsys, args, message):
    d, _, _ = trained
    values = {"missing": str(tmp_path / "missing"), "target": str(d / "target"), "draft": str(d / "draft")}
    options = {"--draft": "{draft}", "--target": "{target}", "--data": str(d / "data.jsonl"), "--max-len": "64"}
    last = cli_error(["train", "ngrams"], options, args, values, capsys)
    assert message.format(**values) in last, last
