"""The bad things a user can hand the library, made once per test module: files that are not
what they claim, directories that hold the wrong model or a damaged one, and a target that is
not the one a draft was trained for. ``make(root)`` returns {name: path}."""

from __future__ import annotations

import json
import os
import shutil

import torch

from eagle3_ext.cli import main as cli_main
from eagle3_ext.models import bundled_paths
from tiny_models import corpus, make_target


def _write(path: str, content) -> str:
    mode = "wb" if isinstance(content, bytes) else "w"
    with open(path, mode) as f:
        f.write(content)
    return path


def _jsonl(path: str, *records) -> str:
    return _write(path, "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))


def _copy_with(src: str, dst: str, weights: bytes = None, truncate: bool = False, config: dict = None) -> str:
    shutil.copytree(src, dst)
    weights_path = os.path.join(dst, "model.safetensors")
    if weights is not None:
        _write(weights_path, weights)
    if truncate:
        os.truncate(weights_path, os.path.getsize(weights_path) // 2)
    if config is not None:
        with open(os.path.join(dst, "config.json")) as f:
            raw = json.load(f)
        raw.update(config)
        _write(os.path.join(dst, "config.json"), json.dumps(raw))
    return dst


def cli_error(command: list, options: dict, bad: list, values: dict, capsys) -> str:
    """Runs ``eagle3 *command`` with good ``options`` ({flag: value}) and one bad argument: ``bad``
    is a lone flag, or an option and the value that replaces its good one; every value is
    formatted with ``values``. Asserts exit 2, no traceback and an error on the last line that
    names the command, and returns that line."""
    flags = bad if len(bad) == 1 else []
    options = {**options, **(dict([bad]) if len(bad) == 2 else {})}
    argv = [*command, *[x.format(**values) for pair in options.items() for x in pair], *flags]
    rc = cli_main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"eagle3 {' '.join(command)}: error: "), last
    return last


def make(root: str) -> dict:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    target, draft = bundled_paths()
    p = {"target": target, "draft": draft, "missing": os.path.join(root, "missing")}
    garbage = bytes(range(256)) * 8
    # --- directories ----------------------------------------------------------------------------
    p["empty_dir"] = os.path.join(root, "empty_dir")
    os.makedirs(p["empty_dir"])
    for name, content in (("bad_json_dir", "{"), ("json_list_dir", "[1, 2]"), ("binary_config_dir", garbage),
                          ("t5_dir", json.dumps({"model_type": "t5", "d_model": 32, "num_layers": 1, "num_heads": 2,
                                                 "d_kv": 16, "d_ff": 64, "vocab_size": 100}))):
        os.makedirs(os.path.join(root, name))
        _write(os.path.join(root, name, "config.json"), content)
        p[name] = os.path.join(root, name)
    p["corrupt_target"] = _copy_with(target, os.path.join(root, "corrupt_target"), weights=garbage)
    p["truncated_target"] = _copy_with(target, os.path.join(root, "truncated_target"), truncate=True)
    p["no_tokenizer_target"] = os.path.join(root, "no_tokenizer_target")
    os.makedirs(p["no_tokenizer_target"])
    for name in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(target, name), p["no_tokenizer_target"])
    p["corrupt_draft"] = _copy_with(draft, os.path.join(root, "corrupt_draft"), weights=garbage)
    p["truncated_draft"] = _copy_with(draft, os.path.join(root, "truncated_draft"), truncate=True)
    p["deeper_target_draft"] = _copy_with(draft, os.path.join(root, "deeper_target_draft"),
                                          config={"eagle3_ext": {**json.load(open(os.path.join(draft, "config.json")))
                                                                 ["eagle3_ext"], "target_num_hidden_layers": 12}})
    # A target of the bundled one's shape with other weights: the draft was not trained for it.
    torch.manual_seed(1)
    other = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(target))
    p["other_target"] = os.path.join(root, "other_target")
    other.save_pretrained(p["other_target"])
    AutoTokenizer.from_pretrained(target).save_pretrained(p["other_target"])
    # A tiny target with a chat template, for training data.
    p["tiny"] = os.path.join(root, "tiny")
    make_target(p["tiny"], layers=4)
    # --- files ----------------------------------------------------------------------------------
    f = lambda name: os.path.join(root, name)  # noqa: E731
    p["a_file"] = _write(f("a_file.txt"), "def f(x):\n    return x\n")
    p["good_text"] = _write(f("good.txt"), corpus(120))
    p["empty_file"] = _write(f("empty.txt"), "  \n\n")
    p["binary_file"] = _write(f("binary.txt"), b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + garbage)
    p["latin1_file"] = _write(f("latin1.txt"), "first line\ncaf\xe9 au lait\n".encode("latin-1"))
    p["short_text"] = _write(f("short.txt"), "a")
    p["missing_key_jsonl"] = _jsonl(f("missing_key.jsonl"), {"text": "def f(x): return x"}, {"body": "x"})
    p["no_assistant_jsonl"] = _jsonl(f("no_assistant.jsonl"), {"messages": [{"role": "user", "content": "hi"}]})
    p["bad_json_jsonl"] = _jsonl(f("bad_json.jsonl"), {"text": "def f(x): return x"}, "{\"text\": ")
    p["array_jsonl"] = _jsonl(f("array.jsonl"), [1, 2, 3])
    p["bad_messages_jsonl"] = _jsonl(f("bad_messages.jsonl"), {"messages": [{"role": "user", "content": None}]})
    p["out_of_vocab_jsonl"] = _jsonl(f("out_of_vocab.jsonl"), {"input_ids": [1, 2, 3, 999999]})
    p["prompts_no_key"] = _jsonl(f("prompts_no_key.jsonl"), {"prompt": "def f():"}, {"text": "x"})
    p["prompts_bad_json"] = _jsonl(f("prompts_bad_json.jsonl"), "{\"prompt\": ")
    return p
