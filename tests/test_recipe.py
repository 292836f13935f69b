import json
import os

import pytest
import torch

from eagle3_ext import Eagle3DraftModel
from eagle3_ext.api import SpeculativeGenerator, TreeConfig
from eagle3_ext.prompts import load_prompts
from eagle3_ext.models import recipe
from eagle3_ext.train import TrainConfig, train

SOURCE = '''"""A module."""


def add(a, b):
    """Return the sum."""
    return a + b


class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)
'''


def fake_stdlib(root):
    for name in ("os_path_tools.py", "collections_extra.py", "json/__init__.py", "json/decoder.py", "test/skip.py"):
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(SOURCE * 6)


def test_recipe_end_to_end_at_toy_scale(tmp_path):
    fake_stdlib(tmp_path / "stdlib")
    work = str(tmp_path / "work")
    manifest = recipe.collect_corpus(work, str(tmp_path / "stdlib"))
    assert manifest["train_files"] == 2 and manifest["eval_files"] == 2  # json/ held out, test/ skipped
    assert "skip.py" not in json.dumps(manifest["files"])
    recipe.train_tokenizer(work, vocab_size=300)
    summary = recipe.train_target(work, hidden=64, layers=4, heads=4, kv_heads=2, intermediate=128, seq_len=32,
                                  batch=4, max_steps=5)
    assert summary["steps"] == 5 and summary["parameters"] > 0
    with open(os.path.join(work, "target", "config.json")) as f:
        assert json.load(f)["tie_word_embeddings"] is True  # the lm_head shares the embedding (size cap)
    ev = recipe.evaluate_target(work, seq_len=16, batch=4)
    assert ev["held_out_tokens"] > 0
    # Against transformers' own loss (labels=) over the same 17-token windows of eval.txt.
    from transformers import AutoModelForCausalLM as _Model, AutoTokenizer as _Tok
    model, tok = _Model.from_pretrained(os.path.join(work, "target")), _Tok.from_pretrained(os.path.join(work, "target"))
    with open(os.path.join(work, "eval.txt"), encoding="utf-8") as f:
        ids = torch.tensor(tok(f.read())["input_ids"])
    windows = ids[: ids.numel() // 17 * 17].view(-1, 17)
    with torch.no_grad():
        hf_loss = float(model(input_ids=windows, labels=windows).loss)
    assert ev["held_out_loss"] == pytest.approx(hf_loss, rel=1e-4)
    assert ev["held_out_tokens"] == windows.shape[0] * 16 and ev["held_out_perplexity"] > 1
    with pytest.raises(ValueError, match="eval.txt gives 0 windows of 100001 tokens; at least 1 are needed"):
        recipe.evaluate_target(work, seq_len=100000)
    gen = recipe.self_generate(work, count=3, prefix_tokens=8, new_tokens=6, batch=2)
    assert gen["sequences"] == 3
    with open(os.path.join(work, "generated.jsonl")) as f:
        assert len([json.loads(line)["text"] for line in f]) == 3
    train(TrainConfig(target=os.path.join(work, "target"),
                      data=[os.path.join(work, "train.txt"), os.path.join(work, "generated.jsonl")],
                      out=os.path.join(work, "draft"), ttt_steps=2, max_steps=3, batch_tokens=256, max_len=64,
                      progress=False, export_specforge=False, draft_vocab_size=200))
    prompts_path = recipe.make_prompts(work, count=4)
    prompts = load_prompts(prompts_path)
    assert prompts and all(p.startswith(("def ", "class ")) for p in prompts)
    package = tmp_path / "package"
    package.mkdir()
    sizes = recipe.install(work, str(package))
    assert sorted(os.listdir(package)) == ["draft", "eval_prompts.jsonl", "recipe", "target"]
    assert "corpus.json" in os.listdir(package / "recipe")
    with pytest.raises(ValueError, match="count, prefix_tokens, new_tokens and batch must be positive"):
        recipe.self_generate(work, count=0)
    assert "draft/model.safetensors" in sizes and "target/model.safetensors" in sizes

    from transformers import AutoModelForCausalLM, AutoTokenizer
    target = AutoModelForCausalLM.from_pretrained(package / "target")
    draft = Eagle3DraftModel.from_pretrained(str(package / "draft"), target_config=target.config)
    assert draft.fc.weight.dtype == torch.bfloat16  # shipped in bf16
    draft = draft.to(target.dtype)
    tok = AutoTokenizer.from_pretrained(package / "target")
    out = SpeculativeGenerator(target, draft, TreeConfig.chain(2), tokenizer=tok).generate(
        prompts[0], max_new_tokens=4, return_dict_in_generate=True)
    assert 1 <= len(out.new_tokens[0]) <= 4
