"""``eagle3 train regenerate``: every assistant turn becomes the target's own greedy response (the
same as Hugging Face's generate on the same prompt, and the same with a draft), other records
pass through, a rerun continues an interrupted run (also from torchrun's part files) and
refuses a file written for other input, two torchrun processes write the file one process
writes, and the trainer reads the result with the loss on the regenerated turns."""

import importlib
import json
import os
import shutil
import subprocess

import pytest
import torch

from eagle3_ext.cli import main as cli_main
from eagle3_ext.train.regenerate import PROVENANCE_KEY, RegenerateConfig, part_path, regenerate
from torchrun import torchrun_command

HERE = os.path.dirname(os.path.abspath(__file__))
NEW_TOKENS = 10
# The tiny targets' template, with the generation prompt a chat model's template adds.
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}<eos>{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")

CHAT = [
    {"id": "a", "messages": [{"role": "user", "content": "def print value"},
                             {"role": "assistant", "content": "a response written by another model"}]},
    {"messages": [{"role": "system", "content": "for while"}, {"role": "user", "content": "class key item"},
                  {"role": "assistant", "content": "first"}, {"role": "user", "content": "return index count"},
                  {"role": "assistant", "content": "second"}]},
    None,  # a blank line: skipped, as the trainer skips it
    {"text": "def print return value key item index count total self lambda yield"},
    {"messages": [{"role": "user", "content": "import try except"}, {"role": "assistant", "content": ""}],
     "source": "kept as it is"},
]
MORE = [
    {"messages": [{"role": "user", "content": "len list dict set tuple"}, {"role": "assistant", "content": "x"}]},
    {"messages": [{"role": "user", "content": "None True False"}, {"role": "assistant", "content": "y"},
                  {"role": "user", "content": "with as"}, {"role": "assistant", "content": "z"}]},
]
RECORDS = [r for r in CHAT if r is not None] + MORE
TURNS = sum(sum(m["role"] == "assistant" for m in r.get("messages", [])) for r in RECORDS)


def _write_jsonl(path, records):
    path.write_text("".join("\n" if r is None else json.dumps(r) + "\n" for r in records))
    return str(path)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny target with a chat template, a random draft for it, two chat files and the greedy
    regeneration of them (batch 2, one process) that every other run is compared with."""
    from tiny_models import make_target
    from eagle3_ext.draft import Eagle3DraftModel, eagle_default_aux_layers
    from eagle3_ext.train.trainer import draft_config_for

    root = tmp_path_factory.mktemp("regenerate")
    target, tokenizer = make_target(str(root / "target"), layers=4)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(str(root / "target"))
    # An untrained draft over the whole vocabulary: it guesses badly, which changes the speed only.
    torch.manual_seed(0)
    draft = Eagle3DraftModel(draft_config_for(target.config, list(eagle_default_aux_layers(4)),
                                              target.config.vocab_size))
    with torch.no_grad():
        draft.t2d.fill_(True)
    draft.save_pretrained(str(root / "draft"))
    data = [_write_jsonl(root / "chat.jsonl", CHAT), _write_jsonl(root / "more.jsonl", MORE)]
    reference = str(root / "reference.jsonl")
    result = regenerate(_config(root, data, reference))
    return {"root": root, "target": target, "tokenizer": tokenizer, "data": data, "reference": reference,
            "result": result, "lines": _read(reference)}


def _config(root, data, out, **over):
    options = dict(target=str(root / "target"), data=data, out=str(out), max_new_tokens=NEW_TOKENS,
                   batch_size=2, device="cpu", progress=False)  # the CPU, as the HF references here
    options.update(over)
    return RegenerateConfig(**options)


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines(keepends=True)


def _text(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_greedy_turns_are_hugging_face_generate(setup):
    """Each regenerated turn is HF's greedy generate (batch 1) on the conversation before it as
    regenerated, rendered with the generation prompt."""
    tok, target = setup["tokenizer"], setup["target"]
    records = [json.loads(line) for line in setup["lines"]]
    assert len(records) == len(RECORDS)
    checked = 0
    for index, (record, original) in enumerate(zip(records, RECORDS)):
        block = record.pop(PROVENANCE_KEY)
        assert block["index"] == index
        assert (block["file"], block["line"]) == (("chat.jsonl", [1, 2, 4, 5][index]) if index < 4
                                                  else ("more.jsonl", index - 3))
        assert block["max_new_tokens"] == NEW_TOKENS and block["temperature"] == 0.0 and "seed" not in block
        assert set(record) == set(original)  # other keys kept
        if "messages" not in original:
            assert record == original and block["turns"] == 0  # passed through
            continue
        assert [m["role"] for m in record["messages"]] == [m["role"] for m in original["messages"]]
        for k, message in enumerate(record["messages"]):
            if message["role"] != "assistant":
                assert message == original["messages"][k]
                continue
            ids = tok.apply_chat_template(record["messages"][:k], add_generation_prompt=True, tokenize=True)
            ids = torch.tensor([ids if isinstance(ids, list) else ids["input_ids"]])
            with torch.no_grad():
                out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                      do_sample=False, pad_token_id=tok.pad_token_id)
            expected = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()
            assert message["content"] == expected, (index, k)
            assert message["content"] != original["messages"][k]["content"]
            checked += 1
    assert checked == TURNS
    result = setup["result"]
    assert result["conversations"] == len(RECORDS) and result["regenerated"] == len(RECORDS)
    assert result["turns_regenerated"] == TURNS and result["resumed_from"] == 0
    assert 0 < result["tokens_generated"] <= TURNS * NEW_TOKENS and result["tokens_per_s"] > 0
    assert not os.path.exists(part_path(setup["reference"], 0))  # one process appends to out itself


def test_draft_writes_the_same_file(setup, tmp_path, monkeypatch):
    """Speculative generation is lossless: with a draft (fp32, batch 3) the file is byte for byte
    the one without."""
    from eagle3_ext.api.generator import SpeculativeGenerator

    calls = []
    generate = SpeculativeGenerator.generate
    monkeypatch.setattr(SpeculativeGenerator, "generate",
                        lambda self, *a, **k: calls.append(1) or generate(self, *a, **k))
    out = tmp_path / "speculative.jsonl"
    result = regenerate(_config(setup["root"], setup["data"], out, draft=str(setup["root"] / "draft"),
                                batch_size=3))
    assert calls  # the draft's path ran
    assert _text(out) == _text(setup["reference"])
    assert result["tokens_generated"] == setup["result"]["tokens_generated"]


def test_a_turn_ends_at_eos(setup, tmp_path):
    """A turn stops after the target's EOS (its generation config's), with and without a draft;
    the stop token is not part of the text."""
    tok, target = setup["tokenizer"], setup["target"]
    ids = tok.apply_chat_template(CHAT[0]["messages"][:1], add_generation_prompt=True, tokenize=True)
    ids = torch.tensor([ids if isinstance(ids, list) else ids["input_ids"]])
    with torch.no_grad():
        greedy = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                 do_sample=False, pad_token_id=tok.pad_token_id)[0, ids.shape[1]:].tolist()
    stop = greedy[2]  # a token the target says third in the first conversation: made an EOS
    shutil.copytree(setup["root"] / "target", tmp_path / "target")
    config_path = tmp_path / "target" / "generation_config.json"
    generation = json.loads(config_path.read_text())
    generation["eos_token_id"] = [tok.eos_token_id, stop]
    config_path.write_text(json.dumps(generation))
    texts = []
    for draft in (None, str(setup["root"] / "draft")):
        out = tmp_path / f"{draft is None}.jsonl"
        regenerate(_config(setup["root"], setup["data"], out, target=str(tmp_path / "target"), draft=draft))
        first = json.loads(_read(out)[0])
        assert first[PROVENANCE_KEY]["new_tokens"] == greedy.index(stop) + 1 < NEW_TOKENS
        assert first["messages"][1]["content"] == tok.decode(greedy[:greedy.index(stop)]).strip()
        texts.append(_text(out))
    assert texts[0] == texts[1]


def test_an_interrupt_leaves_a_prefix_that_a_rerun_continues(setup, tmp_path, monkeypatch):
    """Ctrl-C during the third batch: the conversations finished before it are in out, whole and
    in order, and the rerun writes the rest."""
    module = importlib.import_module("eagle3_ext.train.regenerate")  # (the package exports a function of that name)

    make = module.make_responder

    def interrupted_at_third_call(*args):
        respond, calls = make(*args), []

        def wrapped(prompts, seed):
            calls.append(1)
            if len(calls) == 3:
                raise KeyboardInterrupt
            return respond(prompts, seed)
        return wrapped

    monkeypatch.setattr(module, "make_responder", interrupted_at_third_call)
    out = tmp_path / "out.jsonl"
    with pytest.raises(KeyboardInterrupt, match=r"4 more conversations are in .*out.jsonl; rerun the same command"):
        regenerate(_config(setup["root"], setup["data"], out))
    assert _read(out) == setup["lines"][:4]
    monkeypatch.setattr(module, "make_responder", make)
    assert regenerate(_config(setup["root"], setup["data"], out))["resumed_from"] == 4
    assert _text(out) == _text(setup["reference"])


def test_resume_continues_an_interrupted_file(setup, tmp_path):
    lines = setup["lines"]
    out = tmp_path / "out.jsonl"
    # Two finished lines and a third cut short, as an interrupted write leaves them.
    out.write_text("".join(lines[:2]) + lines[2][:25], encoding="utf-8")
    result = regenerate(_config(setup["root"], setup["data"], out))
    assert _text(out) == _text(setup["reference"])
    assert result["resumed_from"] == 2 and result["regenerated"] == len(lines) - 2
    # A complete file: nothing left to do (no model is loaded).
    again = regenerate(_config(setup["root"], setup["data"], out))
    assert again["resumed_from"] == len(lines) and again["regenerated"] == 0 and again["tokens_generated"] == 0
    assert _text(out) == _text(setup["reference"])


def test_resume_merges_the_parts_of_an_interrupted_torchrun(setup, tmp_path):
    """out's prefix plus parts of an interrupted two-process run (in any order, one line cut
    short) are continued by one process: the rest is regenerated and all is merged in order."""
    lines = setup["lines"]
    out = tmp_path / "out.jsonl"
    out.write_text(lines[0], encoding="utf-8")
    (tmp_path / "out.jsonl.part-1").write_text(lines[3] + lines[1] + lines[5][:10], encoding="utf-8")
    (tmp_path / "out.jsonl.part-0").write_text(lines[2], encoding="utf-8")
    result = regenerate(_config(setup["root"], setup["data"], out))
    assert _text(out) == _text(setup["reference"])
    assert result["resumed_from"] == 4 and result["regenerated"] == len(lines) - 4
    assert sorted(os.listdir(tmp_path)) == ["out.jsonl"]  # the parts merged away


@pytest.mark.parametrize("change, message", [
    ("other data", r"written from chat.jsonl:1, but record 0 of this input is .*more.jsonl:1 \(another record\)"),
    ("other content", r"written from chat.jsonl:1, but record 0 of this input is .*chat.jsonl:1 \(other content at "
                      r"the same place\)"),
    ("fewer records", r"out.jsonl:4: written for record 3, but this input has 3 records"),
    ("other settings", r"written with other settings: max_new_tokens 10 \(now 8\), temperature 0.0 \(now 1.0\), "
                       r"top_p None \(now 1.0\), top_k None \(now 0\), seed None \(now 0\)"),
    ("other file", r"out.jsonl:1: not a line written by eagle3 train regenerate \(no \"regenerated\" block\)"),
    ("other order", r"out.jsonl:1: holds record 1 where record 0 belongs"),
], ids=["other-data", "other-content", "fewer-records", "other-settings", "other-file", "other-order"])
def test_an_out_written_for_other_input_is_an_error(setup, tmp_path, deadline, change, message):
    out = tmp_path / "out.jsonl"
    shutil.copy(setup["reference"], out)
    data, over = setup["data"], {}
    if change == "other data":
        data = [setup["data"][1]]
    elif change == "other content":
        changed = [None if r is None else dict(r) for r in CHAT]
        changed[0]["id"] = "b"
        data = [_write_jsonl(tmp_path / "chat.jsonl", changed), setup["data"][1]]
    elif change == "fewer records":
        data = [_write_jsonl(tmp_path / "chat.jsonl", CHAT[:4])]
    elif change == "other settings":
        over = dict(max_new_tokens=8, temperature=1.0)
    elif change == "other file":
        out.write_text(json.dumps({"text": "training text from elsewhere"}) + "\n")
    else:
        out.write_text("".join(setup["lines"][1:]), encoding="utf-8")
    before = _text(out)
    with pytest.raises(ValueError, match=message):
        regenerate(_config(setup["root"], data, out, **over))
    assert _text(out) == before  # never appended to


def test_the_output_trains(setup):
    """The trainer reads every record; the loss is on the regenerated assistant turns only."""
    from eagle3_ext.train.data import load_examples

    tok = setup["tokenizer"]
    examples = load_examples([setup["reference"]], tok, 256)
    assert len(examples) == len(RECORDS)  # one per conversation, one window of the short text
    records = [json.loads(line) for line in setup["lines"]]
    chats = [r for r in records if "messages" in r]
    for example, record in zip([e for e, r in zip(examples, records) if "messages" in r], chats):
        learned = tok.decode(example.input_ids[example.loss_mask])
        for message in record["messages"]:
            if message["role"] == "assistant":
                assert message["content"] in learned
            else:
                assert message["content"] not in learned


def test_sampling_is_seeded(setup, tmp_path):
    first, second, other = (tmp_path / f"{name}.jsonl" for name in ("first", "second", "other"))
    for out, seed in ((first, 1), (second, 1), (other, 2)):
        regenerate(_config(setup["root"], setup["data"], out, temperature=2.0, seed=seed))
    assert _text(first) == _text(second)
    # Negative control: another seed samples other text (and greedy decoding yet another).
    assert _text(other) != _text(first) != _text(setup["reference"])
    block = json.loads(_read(first)[0])[PROVENANCE_KEY]
    assert (block["temperature"], block["top_p"], block["top_k"], block["seed"]) == (2.0, 1.0, 0, 1)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="needs torch.distributed")
def test_two_processes_write_what_one_writes(setup, tmp_path):
    """torchrun, 2 CPU processes (gloo): each regenerates its share into its part and rank 0
    merges them; started from an interrupted state (out's first line, a part of another run),
    the file equals the one process's."""
    lines = setup["lines"]
    out = tmp_path / "out.jsonl"
    out.write_text(lines[0], encoding="utf-8")
    (tmp_path / "out.jsonl.part-3").write_text(lines[4], encoding="utf-8")  # from a run of 4 processes
    # CPU processes (gloo) also where a GPU is visible: two ranks cannot share one GPU under NCCL.
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(__import__("eagle3_ext").__file__)), HERE]
        + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    run = subprocess.run(torchrun_command(2) + [
        "-m", "eagle3_ext", "train", "regenerate", "--target", str(setup["root"] / "target"), "--data",
        *setup["data"], "--out", str(out), "--max-new-tokens", str(NEW_TOKENS), "--batch-size", "2", "--device",
        "cpu", "--json"], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    reports = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert len(reports) == 1, run.stdout  # rank 0 alone reports
    assert reports[0]["world_size"] == 2 and reports[0]["resumed_from"] == 2
    assert reports[0]["regenerated"] == len(lines) - 2
    assert _text(out) == _text(setup["reference"])
    assert sorted(os.listdir(tmp_path)) == ["out.jsonl"]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_with_and_without_a_draft(setup, tmp_path):
    """The default device where a GPU is visible: the same file with a draft as without, and (a
    tiny fp32 target, far from ties) the CPU's."""
    texts = []
    for draft in (None, str(setup["root"] / "draft")):
        out = tmp_path / f"{draft is None}.jsonl"
        regenerate(_config(setup["root"], setup["data"], out, device=None, draft=draft))
        texts.append(_text(out))
    assert texts[0] == texts[1] == _text(setup["reference"])


def test_command_line(setup, tmp_path, capsys):
    out = tmp_path / "cli.jsonl"
    argv = ["train", "regenerate", "--target", str(setup["root"] / "target"), "--data", setup["data"][1],
            "--out", str(out), "--max-new-tokens", str(NEW_TOKENS), "--batch-size", "1", "--device", "cpu"]
    assert cli_main(argv + ["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["conversations"] == len(MORE) and report["turns_regenerated"] == 3
    assert report["out"] == str(out) and len(_read(out)) == len(MORE)
    assert cli_main(argv) == 0  # a rerun: nothing left
    assert "already holds all 2 conversations; nothing to do" in capsys.readouterr().out
    # Other settings on the same file: bad input, one line, exit 2.
    assert cli_main(argv[:-2] + ["--max-new-tokens", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("eagle3 train regenerate: error: ") and "max_new_tokens 10 (now 3)" in err


@pytest.mark.parametrize("argv, message", [
    (["--max-new-tokens", "0"], "argument --max-new-tokens: expected a positive integer, got 0"),
    (["--batch-size", "two"], "argument --batch-size: expected a positive integer, got 'two'"),
    (["--temperature", "-1"], "argument --temperature: expected a number >= 0, got -1"),
    (["--dtype", "int8"], "argument --dtype: invalid choice: 'int8'"),
], ids=["max-new-tokens", "batch-size", "temperature", "dtype"])
def test_command_line_rejects_bad_flags(setup, tmp_path, capsys, argv, message):
    base = ["train", "regenerate", "--target", str(setup["root"] / "target"), "--data", setup["data"][0],
            "--out", str(tmp_path / "o.jsonl")]
    assert cli_main(base + argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: eagle3 train regenerate") and message in err


@pytest.mark.parametrize("over, error, message", [
    (dict(max_new_tokens=0), ValueError, "max_new_tokens must be a positive integer, got 0"),
    (dict(max_new_tokens=2.5), TypeError, r"max_new_tokens must be a positive integer, got 2.5 \(float\)"),
    (dict(batch_size=True), TypeError, r"batch_size must be a positive integer, got True \(bool\)"),
    (dict(temperature=-0.5), ValueError, "temperature must be a number >= 0, got -0.5"),
    (dict(top_p=0), ValueError, r"top_p must be a number in \(0, 1\], got 0"),
    (dict(seed=-1), ValueError, "seed must be an integer in"),
    (dict(dtype="fp8"), ValueError, "dtype must be one of float32, bfloat16, float16, got 'fp8'"),
    (dict(device="tpu"), ValueError, "device 'tpu' is not a device torch knows"),
    (dict(progress=1), TypeError, "progress must be True or False"),
    (dict(data=[]), TypeError, r"data must be a non-empty list of JSONL file paths, got \[\]"),
    (dict(data="chat.jsonl"), TypeError, "data must be a non-empty list of JSONL file paths, got 'chat.jsonl'"),
    (dict(data=["missing.jsonl"]), FileNotFoundError, r"data\[0\]: missing.jsonl does not exist"),
    (dict(out="out.txt"), ValueError, "out must name a .jsonl file"),
    (dict(out=""), ValueError, "out must be a non-empty path"),
    (dict(target="missing"), FileNotFoundError, "target: missing does not exist, expected a directory"),
    (dict(draft="missing"), FileNotFoundError, "draft: missing does not exist, expected a directory"),
], ids=["max-new-tokens-0", "max-new-tokens-float", "batch-size-bool", "temperature", "top-p", "seed", "dtype",
        "device", "progress", "no-data", "data-string", "missing-data", "out-not-jsonl", "out-empty",
        "missing-target", "missing-draft"])
def test_bad_config_is_named(setup, deadline, over, error, message):
    root, over = setup["root"], dict(over)
    config = _config(root, over.pop("data", setup["data"]), over.pop("out", root / "never.jsonl"), **over)
    with pytest.raises(error, match=message):
        regenerate(config)
    assert not os.path.exists(root / "never.jsonl")


@pytest.mark.parametrize("content, message", [
    ("{not json}\n", r"bad.jsonl:1: not valid JSON"),
    ("\n[1, 2]\n", r"bad.jsonl:2: expected a JSON object, got list"),
    ('{"messages": [{"role": "user"}]}\n', r"bad.jsonl:1: \"messages\" must be a non-empty list of"),
    ('{"messages": [{"role": "user", "content": "hi"}]}\n', r"bad.jsonl:1: the conversation has no assistant "
                                                             r"message to regenerate; end it with"),
    ('{"prompt": "hi"}\n', r"bad.jsonl:1: expected a \"messages\" list \(or a \"text\" string"),
    ("  \n", r"bad.jsonl is empty"),
], ids=["not-json", "not-an-object", "bad-messages", "no-assistant", "no-known-key", "empty"])
def test_bad_records_are_named_by_file_and_line(setup, tmp_path, deadline, content, message):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    with pytest.raises(ValueError, match=message):
        regenerate(_config(setup["root"], [str(bad)], tmp_path / "out.jsonl"))


def test_other_bad_inputs(setup, tmp_path, deadline):
    root = setup["root"]
    text = tmp_path / "data.txt"
    text.write_text("plain text\n")
    with pytest.raises(ValueError, match=r"data\[0\] must be a .jsonl file"):
        regenerate(_config(root, [str(text)], tmp_path / "out.jsonl"))
    with pytest.raises(ValueError, match=r"out must not be one of the data files, got data\[1\]"):
        regenerate(_config(root, setup["data"], setup["data"][1]))
    directory = tmp_path / "dir.jsonl"
    directory.mkdir()
    with pytest.raises(ValueError, match="dir.jsonl is a directory, expected a file to write"):
        regenerate(_config(root, setup["data"], directory))
    from eagle3_ext.models import bundled_paths
    with pytest.raises(ValueError, match="its tokenizer has no chat template"):
        regenerate(RegenerateConfig(target=bundled_paths()[0], data=setup["data"], out=str(tmp_path / "o.jsonl")))
    # A prompt that leaves no room for max_new_tokens in the target's 512 positions.
    with pytest.raises(ValueError, match=r"chat.jsonl:1: the conversation before message 2 is \d+ tokens; with "
                                         r"max_new_tokens=510 that passes the target's context \(512 positions\)"):
        regenerate(_config(root, setup["data"], tmp_path / "long.jsonl", max_new_tokens=510))
