"""Prompts asked as a user turn of the target's chat template (`generate --chat`, `bench
--chat`, on by default where the tokenizer has a template) and the bad inputs around them."""

import pytest
from transformers import AutoTokenizer

from eagle3_ext import cli
from eagle3_ext.bench.suite import BenchConfig
from eagle3_ext.api.inputs import chat_prompt
from eagle3_ext.models import bundled_paths

TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}" \
           "{% if add_generation_prompt %}<|assistant|>{% endif %}"


def test_chat_prompt_is_one_user_turn_and_the_generation_prompt():
    tok = AutoTokenizer.from_pretrained(bundled_paths()[0])
    tok.chat_template = TEMPLATE
    assert chat_prompt("What is 2 + 2?", tok) == "<|user|>What is 2 + 2?\n<|assistant|>"


def test_chat_prompt_needs_a_template():
    tok = AutoTokenizer.from_pretrained(bundled_paths()[0])  # the toy tokenizer has none
    with pytest.raises(ValueError, match="chat prompts need a tokenizer with a chat template"):
        chat_prompt("hello", tok)


def test_bench_chat_must_be_a_boolean():
    with pytest.raises(TypeError, match="chat"):
        BenchConfig(chat="yes").validate()


def test_generate_chat_on_a_target_without_a_template_is_bad_input(capsys):
    assert cli.main(["generate", "--chat", "--max-new-tokens", "4", "--prompt", "hi"]) == 2
    assert "chat prompts need a tokenizer with a chat template" in capsys.readouterr().err


def test_pair_and_target_together_are_bad_input(capsys):
    target, draft = bundled_paths()
    assert cli.main(["generate", "--pair", "toy", "--target", target, "--draft", draft]) == 2
    assert "--pair names both models" in capsys.readouterr().err
