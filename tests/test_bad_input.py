"""Bad input, swept over every option of every ``eagle3`` command and the arguments of the public
API. Each option gets each class of bad value it can take: zero, negative, too large, wrong
type, empty, a missing or unreadable path, a wrong model kind, a mismatched pair. Every one
must end in one clear line that names the argument and what was expected (exit code 2, or a
ValueError / TypeError from the API): never a traceback, never a value silently read as the
default, never a crash. ``test_every_option_is_swept`` keeps the sweep complete as options are
added."""

from __future__ import annotations

import argparse

import pytest

from eagle3_ext import cli

pytestmark = pytest.mark.usefixtures("deadline")

GEN = ["generate", "--max-new-tokens", "4"]
BENCH = ["bench", "--num-prompts", "1", "--batch-sizes", "1", "--max-new-tokens", "4", "--tree", "2,1,3",
         "--out", "{out}"]
TRAIN = ["train", "--target", "{tiny}", "--data", "{good_text}", "--out", "{out}", "--max-steps", "1", "--max-len",
         "32", "--batch-tokens", "256", "--no-specforge-export", "--no-vllm-export"]
FROM_CACHE = ["train", "--out", "{out}", "--max-steps", "1", "--no-specforge-export", "--no-vllm-export"]
DOCTOR = ["doctor", "--max-examples", "2", "--acceptance-prompts", "0", "--max-len", "32", "--prompt-tokens", "8"]
PAIR = ["--target", "{target}", "--draft", "{draft}"]
CONVERT = ["convert", "{a_file}", "{out}"]

# (base command line, option, class of bad value, the arguments that carry it, text the error must hold)
CLI_CASES = [
    # --- generate ---------------------------------------------------------------------------------
    (GEN, "--target", "missing path", ["--target", "{missing}", "--draft", "{draft}"], "--target: {missing} does not"),
    (GEN, "--target", "unreadable path", ["--target", "{a_file}", "--draft", "{draft}"], "is a file, expected a dir"),
    (GEN, "--target", "empty", ["--target", "", "--draft", "{draft}"], "--target: expected a non-empty"),
    (GEN, "--target", "wrong model kind", ["--target", "{draft}", "--draft", "{draft}"],
     "holds an EAGLE-3 draft, not a target model"),
    (GEN, "--target", "wrong model kind", ["--target", "{empty_dir}", "--draft", "{draft}"],
     "has no config.json: not a target model directory"),
    (GEN, "--target", "wrong model kind", ["--target", "{t5_dir}", "--draft", "{draft}"],
     "is not a causal language model"),
    (GEN, "--target", "unreadable path", ["--target", "{bad_json_dir}", "--draft", "{draft}"], "is not valid JSON"),
    (GEN, "--target", "unreadable path", ["--target", "{json_list_dir}", "--draft", "{draft}"],
     "expected an object of model settings"),
    (GEN, "--target", "unreadable path", ["--target", "{binary_config_dir}", "--draft", "{draft}"],
     "is not UTF-8 text"),
    (GEN, "--target", "unreadable path", ["--target", "{corrupt_target}", "--draft", "{draft}"],
     "the weights cannot be read (truncated or corrupt?)"),
    (GEN, "--target", "unreadable path", ["--target", "{truncated_target}", "--draft", "{draft}"],
     "the weights cannot be read (truncated or corrupt?)"),
    (GEN, "--target", "unreadable path", ["--target", "{no_tokenizer_target}", "--draft", "{draft}"],
     "no usable tokenizer"),
    (GEN, "--target", "mismatched pair", ["--target", "{other_target}", "--draft", "{draft}"],
     "the target differs from the one the draft was trained with"),
    (GEN, "--target", "mismatched pair", ["--target", "{target}"], "give both --target and --draft"),
    (GEN, "--draft", "missing path", ["--target", "{target}", "--draft", "{missing}"], "--draft: {missing} does not"),
    (GEN, "--draft", "unreadable path", ["--target", "{target}", "--draft", "{a_file}"], "is a file, expected a dir"),
    (GEN, "--draft", "empty", ["--target", "{target}", "--draft", ""], "--draft: expected a non-empty"),
    (GEN, "--draft", "wrong model kind", ["--target", "{target}", "--draft", "{target}"], "not an EAGLE-3 draft"),
    (GEN, "--draft", "wrong model kind", ["--target", "{target}", "--draft", "{empty_dir}"],
     "has no config.json: not a draft model directory"),
    (GEN, "--draft", "unreadable path", ["--target", "{target}", "--draft", "{corrupt_draft}"],
     "cannot be read (truncated or corrupt?)"),
    (GEN, "--draft", "unreadable path", ["--target", "{target}", "--draft", "{truncated_draft}"],
     "cannot be read (truncated or corrupt?)"),
    (GEN, "--draft", "mismatched pair", ["--target", "{target}", "--draft", "{deeper_target_draft}"],
     "the draft was trained on a target with 12 layers"),
    (GEN, "--prompt", "empty", ["--prompt", ""], "--prompt: expected a non-empty"),
    (GEN, "--prompt", "empty", ["--prompt", "   "], "--prompt: expected a non-empty"),
    (GEN, "--prompt-file", "missing path", ["--prompt-file", "{missing}"], "--prompt-file: {missing} does not exist"),
    (GEN, "--prompt-file", "unreadable path", ["--prompt-file", "{empty_dir}"], "is a directory, expected a file"),
    (GEN, "--prompt-file", "empty", ["--prompt-file", "{empty_file}"], "--prompt-file: {empty_file} is empty"),
    (GEN, "--prompt-file", "wrong type", ["--prompt-file", "{binary_file}"], "{binary_file}:3: a NUL byte"),
    (GEN, "--prompt-file", "wrong type", ["--prompt-file", "{latin1_file}"], "{latin1_file}:2: byte 0xe9 is not UTF-8"),
    (GEN, "--max-new-tokens", "zero", ["--max-new-tokens", "0"], "--max-new-tokens: expected a positive integer"),
    (GEN, "--max-new-tokens", "negative", ["--max-new-tokens", "-3"], "--max-new-tokens: expected a positive"),
    (GEN, "--max-new-tokens", "wrong type", ["--max-new-tokens", "1.5"], "--max-new-tokens: expected a positive"),
    (GEN, "--max-new-tokens", "too large", ["--max-new-tokens", "100000"],
     "beyond the target's context (2048, its max_position_embeddings); lower max_new_tokens to"),
    (GEN, "--temperature", "negative", ["--temperature", "-0.5"], "--temperature: expected a number >= 0"),
    (GEN, "--temperature", "wrong type", ["--temperature", "warm"], "--temperature: expected a number >= 0"),
    (GEN, "--temperature", "too large", ["--temperature", "inf"], "--temperature: expected a number >= 0"),
    (GEN, "--temperature", "wrong type", ["--temperature", "nan"], "--temperature: expected a number >= 0"),
    (GEN, "--top-p", "zero", ["--top-p", "0"], "--top-p: expected a number in (0, 1]"),
    (GEN, "--top-p", "negative", ["--top-p", "-0.1"], "--top-p: expected a number in (0, 1]"),
    (GEN, "--top-p", "too large", ["--top-p", "1.5"], "--top-p: expected a number in (0, 1]"),
    (GEN, "--top-p", "wrong type", ["--top-p", "most"], "--top-p: expected a number in (0, 1]"),
    (GEN, "--top-k", "negative", ["--top-k", "-1"], "--top-k: expected a non-negative integer"),
    (GEN, "--top-k", "wrong type", ["--top-k", "2.5"], "--top-k: expected a non-negative integer"),
    (GEN, "--depth", "zero", ["--depth", "0"], "--depth: expected an integer in [1, 64], got 0"),
    (GEN, "--depth", "negative", ["--depth", "-2"], "--depth: expected an integer in [1, 64]"),
    (GEN, "--depth", "too large", ["--depth", "65"], "--depth: expected an integer in [1, 64]"),
    (GEN, "--depth", "wrong type", ["--depth", "deep"], "--depth: expected an integer in [1, 64]"),
    (GEN, "--topk", "zero", ["--topk", "0"], "--topk: expected an integer in [1, 64]"),
    (GEN, "--topk", "negative", ["--topk", "-1"], "--topk: expected an integer in [1, 64]"),
    (GEN, "--topk", "too large", ["--topk", "1000"], "--topk: expected an integer in [1, 64]"),
    (GEN, "--topk", "wrong type", ["--topk", "x"], "--topk: expected an integer in [1, 64]"),
    (GEN, "--num-draft-tokens", "zero", ["--num-draft-tokens", "0"], "--num-draft-tokens: expected an integer in [2"),
    (GEN, "--num-draft-tokens", "negative", ["--num-draft-tokens", "-4"], "--num-draft-tokens: expected an integer"),
    (GEN, "--num-draft-tokens", "too large", ["--num-draft-tokens", "5000"], "expected an integer in [2, 1024]"),
    (GEN, "--num-draft-tokens", "too large", ["--depth", "2", "--topk", "1", "--num-draft-tokens", "20"],
     "TreeConfig.num_draft_tokens must be an integer in [2, 13], got 20"),
    (GEN, "--num-draft-tokens", "wrong type", ["--num-draft-tokens", "many"], "--num-draft-tokens: expected"),
    (GEN, "--lookup-tokens", "negative", ["--lookup-tokens", "-1"], "--lookup-tokens: expected an integer in [0, 64]"),
    (GEN, "--lookup-tokens", "too large", ["--lookup-tokens", "65"], "--lookup-tokens: expected an integer in [0, 64]"),
    (GEN, "--lookup-tokens", "wrong type", ["--lookup-tokens", "ten"], "--lookup-tokens: expected an integer"),
    (GEN, "--lookup-ngram", "zero", ["--lookup-ngram", "0"], "--lookup-ngram: expected an integer in [1, 16], got 0"),
    (GEN, "--lookup-ngram", "too large", ["--lookup-ngram", "17"], "--lookup-ngram: expected an integer in [1, 16]"),
    (GEN, "--lookup-ngram", "wrong type", ["--lookup-ngram", "2.5"], "--lookup-ngram: expected an integer"),
    (GEN, "--chain", "mismatched pair", ["--chain", "--topk", "4"], "--chain drafts with topk 1, got --topk 4"),
    (GEN, "--chain", "mismatched pair", ["--chain", "--depth", "3", "--num-draft-tokens", "9"],
     "--chain verifies depth + 1 + lookup tokens = 14 tokens, got --num-draft-tokens 9"),
    (GEN, "--chain", "wrong type", ["--chain=yes"], "--chain: ignored explicit argument 'yes'"),
    (GEN, "--sampled-draft", "mismatched pair", ["--sampled-draft", "--lookup-tokens", "4"],
     "--sampled-draft drafts a chain of --depth tokens without lookup"),
    (GEN, "--sampled-draft", "wrong type", ["--sampled-draft=yes"], "--sampled-draft: ignored explicit argument"),
    (GEN, "--lookup-corpus", "wrong type", ["--lookup-corpus=yes"], "--lookup-corpus: ignored explicit argument"),
    (GEN, "--lookup-corpus", "mismatched pair", ["--lookup-corpus", "--lookup-tokens", "0"],
     "TreeConfig.lookup_corpus needs lookup_tokens > 0"),
    (GEN, "--lookup-corpus", "mismatched pair", ["--lookup-corpus", "--sampled-draft", "--temperature", "1"],
     "--sampled-draft drafts a chain of --depth tokens without lookup"),
    (GEN, "--lookup-corpus", "wrong model kind", ["--lookup-corpus"],
     "TreeConfig.lookup_corpus=True, but the draft ships no n-gram table (lookup_ngrams.safetensors)"),
    (GEN, "--attention", "wrong type", ["--attention", "flash"], "--attention: invalid choice: 'flash'"),
    (GEN, "--seed", "negative", ["--seed", "-1"], "--seed: expected an integer in [0, 9.22337e+18]"),
    (GEN, "--seed", "too large", ["--seed", str(2**64)], "--seed: expected an integer in [0"),
    (GEN, "--seed", "wrong type", ["--seed", "abc"], "--seed: expected an integer in [0"),
    (GEN, "--baseline", "wrong type", ["--baseline=1"], "--baseline: ignored explicit argument '1'"),
    (GEN, "--dtype", "wrong type", ["--dtype", "float64"], "--dtype: invalid choice: 'float64'"),
    (GEN, "--dtype", "empty", ["--dtype", ""], "--dtype: invalid choice: ''"),
    (GEN, "--draft-dtype", "wrong type", ["--draft-dtype", "int8"], "--draft-dtype: invalid choice: 'int8'"),
    (GEN, "--tp-timeout", "zero", ["--tp-timeout", "0"], "--tp-timeout: expected a positive number"),
    (GEN, "--tp-timeout", "negative", ["--tp-timeout", "-5"], "--tp-timeout: expected a positive number"),
    (GEN, "--tp-timeout", "wrong type", ["--tp-timeout", "soon"], "--tp-timeout: expected a positive number"),
    (GEN, "--tp-timeout", "too large", ["--tp-timeout", "inf"], "--tp-timeout: expected a positive number"),
    (GEN, "--check-ranks", "wrong type", ["--check-ranks=no"], "--check-ranks: ignored explicit argument"),
    (GEN, "--no-strict-capture", "wrong type", ["--no-strict-capture=0"], "--no-strict-capture: ignored explicit"),
    (GEN, "--json", "wrong type", ["--json=1"], "--json: ignored explicit argument '1'"),
    (GEN, "--compile", "wrong type", ["--compile=1"], "--compile: invalid choice: '1'"),
    (GEN, "--target", "missing path", ["--target", "{missing}.gguf", "--draft", "{draft}"],
     "--target: {missing}.gguf does not exist"),
    (GEN, "--pair", "wrong type", ["--pair", "llama"], "--pair: invalid choice: 'llama'"),
    (GEN, "--pair", "mismatched pair", ["--pair", "toy"] + PAIR, "--pair names both models"),
    (GEN, "--no-chat", "wrong type", ["--chat=1"], "ignored explicit argument '1'"),
    (GEN, "--no-chat", "wrong model kind", ["--chat"], "chat prompts need a tokenizer with a chat template"),
    # --- bench ------------------------------------------------------------------------------------
    (BENCH, "--target", "missing path", ["--target", "{missing}", "--draft", "{draft}"],
     "--target: {missing} does not"),
    (BENCH, "--target", "wrong model kind", ["--target", "{draft}", "--draft", "{draft}"], "holds an EAGLE-3 draft"),
    (BENCH, "--target", "mismatched pair", ["--target", "{other_target}", "--draft", "{draft}"],
     "the target differs from the one the draft was trained with"),
    (BENCH, "--draft", "missing path", ["--target", "{target}", "--draft", "{missing}"], "--draft: {missing} does not"),
    (BENCH, "--draft", "wrong model kind", ["--target", "{target}", "--draft", "{target}"], "not an EAGLE-3 draft"),
    (BENCH, "--draft", "unreadable path", ["--target", "{target}", "--draft", "{truncated_draft}"],
     "cannot be read (truncated or corrupt?)"),
    (BENCH, "--prompts", "missing path", ["--prompts", "{missing}"], "--prompts: {missing} does not exist"),
    (BENCH, "--llama-cpp-dir", "missing path", ["--llama-cpp-dir", "{missing}"],
     "--llama-cpp-dir: {missing} does not exist"),
    (BENCH, "--llama-cpp-dir", "wrong type", ["--llama-cpp-dir", "{empty_file}"], "is a file, expected a directory"),
    (BENCH, "--prompts", "unreadable path", ["--prompts", "{empty_dir}"], "is a directory, expected a file"),
    (BENCH, "--prompts", "empty", ["--prompts", "{empty_file}"], "prompts: {empty_file} is empty"),
    (BENCH, "--prompts", "wrong type", ["--prompts", "{binary_file}"], "a NUL byte: this is a binary file"),
    (BENCH, "--prompts", "wrong type", ["--prompts", "{prompts_no_key}"],
     "{prompts_no_key}:2: expected an object with a non-empty \"prompt\" string"),
    (BENCH, "--prompts", "wrong type", ["--prompts", "{prompts_bad_json}"], "{prompts_bad_json}:1: not valid JSON"),
    (BENCH, "--num-prompts", "zero", ["--num-prompts", "0"], "--num-prompts: expected a positive integer"),
    (BENCH, "--num-prompts", "negative", ["--num-prompts", "-1"], "--num-prompts: expected a positive integer"),
    (BENCH, "--num-prompts", "too large", ["--num-prompts", "100000"], "num_prompts must be an integer in [1, "),
    (BENCH, "--num-prompts", "wrong type", ["--num-prompts", "all"], "--num-prompts: expected a positive integer"),
    (BENCH, "--max-new-tokens", "zero", ["--max-new-tokens", "0"], "--max-new-tokens: expected a positive integer"),
    (BENCH, "--max-new-tokens", "negative", ["--max-new-tokens", "-8"], "--max-new-tokens: expected a positive"),
    (BENCH, "--max-new-tokens", "too large", ["--max-new-tokens", "100000"], "beyond the target's context (2048"),
    (BENCH, "--max-new-tokens", "wrong type", ["--max-new-tokens", "x"], "--max-new-tokens: expected a positive"),
    (BENCH, "--batch-sizes", "zero", ["--batch-sizes", "1", "0"], "--batch-sizes: expected a positive integer"),
    (BENCH, "--batch-sizes", "negative", ["--batch-sizes", "-4"], "--batch-sizes: expected a positive integer"),
    (BENCH, "--batch-sizes", "too large", ["--batch-sizes", "4"], "batch_sizes[0] must be an integer in [1, 1], got 4"),
    (BENCH, "--batch-sizes", "wrong type", ["--batch-sizes", "big"], "--batch-sizes: expected a positive integer"),
    (BENCH, "--tree", "wrong type", ["--tree", "5,4"],
     "--tree takes DEPTH,TOPK,NODES or DEPTH,TOPK,NODES,LOOKUP_TOKENS, optionally followed by ,sampled "
     "(or after LOOKUP_TOKENS by ,corpus), got '5,4'"),
    (BENCH, "--tree", "wrong type", ["--tree", "a,b,c"],
     "--tree takes DEPTH,TOPK,NODES or DEPTH,TOPK,NODES,LOOKUP_TOKENS, optionally followed by ,sampled "
     "(or after LOOKUP_TOKENS by ,corpus), got 'a,b,c'"),
    (BENCH, "--tree", "negative", ["--tree", "2,1,3,-1"],
     "TreeConfig.lookup_tokens must be an integer in [0, 64], got -1"),
    (BENCH, "--tree", "zero", ["--tree", "0,1,2"], "TreeConfig.depth must be an integer in [1, 64], got 0"),
    (BENCH, "--tree", "mismatched pair", ["--tree", "3,2,6,sampled"], "TreeConfig.sampled needs a chain without lookup"),
    (BENCH, "--tree", "negative", ["--tree", "3,-1,4"], "TreeConfig.topk must be an integer in [1, 64], got -1"),
    (BENCH, "--tree", "too large", ["--tree", "2,1,10"], "TreeConfig.num_draft_tokens must be an integer in [2, 3]"),
    (BENCH, "--sweep", "wrong type", ["--sweep=1"], "--sweep: ignored explicit argument '1'"),
    (BENCH, "--temperature", "negative", ["--temperature", "0.7", "-1"], "--temperature: expected a number >= 0"),
    (BENCH, "--temperature", "wrong type", ["--temperature", "warm"], "--temperature: expected a number >= 0"),
    (BENCH, "--temperature", "too large", ["--temperature", "inf"], "--temperature: expected a number >= 0"),
    (BENCH, "--temperature", "empty", ["--temperature"], "--temperature: expected at least one argument"),
    (BENCH, "--temperature", "mismatched pair", ["--temperature", "0.7", "0.7"],
     "temperatures must be distinct (one run each), got [0.7, 0.7]"),
    (BENCH, "--top-p", "zero", ["--temperature", "0.7", "--top-p", "0"], "--top-p: expected a number in (0, 1]"),
    (BENCH, "--top-p", "negative", ["--top-p", "-0.5"], "--top-p: expected a number in (0, 1]"),
    (BENCH, "--top-p", "too large", ["--top-p", "1.5"], "--top-p: expected a number in (0, 1]"),
    (BENCH, "--top-p", "wrong type", ["--top-p", "most"], "--top-p: expected a number in (0, 1]"),
    (BENCH, "--top-p", "mismatched pair", ["--top-p", "0.9"],
     "top_p=0.9 / top_k=0 filter the sampled runs, but temperatures [0.0] run greedy only"),
    (BENCH, "--top-k", "negative", ["--top-k", "-1"], "--top-k: expected a non-negative integer"),
    (BENCH, "--top-k", "wrong type", ["--top-k", "2.5"], "--top-k: expected a non-negative integer"),
    (BENCH, "--top-k", "mismatched pair", ["--temperature", "0", "--top-k", "5"],
     "top_p=1 / top_k=5 filter the sampled runs, but temperatures [0.0] run greedy only"),
    (BENCH, "--out", "unreadable path", ["--out", "{a_file}"], "--out: {a_file} is a file, expected a directory"),
    (BENCH, "--out", "empty", ["--out", ""], "--out: expected a non-empty"),
    (BENCH, "--dtype", "wrong type", ["--dtype", "fp8"], "--dtype: invalid choice: 'fp8'"),
    (BENCH, "--draft-dtype", "wrong type", ["--draft-dtype", "half"], "--draft-dtype: invalid choice: 'half'"),
    (BENCH, "--json", "wrong type", ["--json=yes"], "--json: ignored explicit argument 'yes'"),
    (BENCH, "--no-compiled-baseline", "wrong type", ["--no-compiled-baseline=1"],
     "--no-compiled-baseline: ignored explicit argument '1'"),
    (BENCH, "--compile", "wrong type", ["--compile=yes"], "--compile: ignored explicit argument 'yes'"),
    (BENCH, "--no-llama-cpp", "wrong type", ["--no-llama-cpp=no"], "--no-llama-cpp: ignored explicit argument 'no'"),
    (BENCH, "--pair", "wrong type", ["--pair", "smol"], "--pair: invalid choice: 'smol'"),
    (BENCH, "--pair", "mismatched pair", ["--pair", "toy"] + PAIR, "--pair names both models"),
    (BENCH, "--no-chat", "wrong type", ["--no-chat=0"], "ignored explicit argument '0'"),
    (BENCH, "--no-chat", "wrong model kind", ["--chat"], "chat prompts need a tokenizer with a chat template"),
    (BENCH, "--by-category", "wrong type", ["--by-category=1"], "--by-category: ignored explicit argument '1'"),
    (BENCH, "--by-category", "mismatched pair", ["--by-category"], "--by-category needs --prompts"),
    (BENCH, "--by-category", "wrong format", ["--by-category", "--prompts", "{good_text}"],
     'prompt 1 has no "category"'),
    # --- convert ----------------------------------------------------------------------------------
    (CONVERT, "--dtype", "wrong type", ["--dtype", "fp8"], "--dtype: invalid choice: 'fp8'"),
    (CONVERT, "--json", "wrong type", ["--json=1"], "--json: ignored explicit argument '1'"),
    (CONVERT, "gguf", "wrong model kind", [], "gguf file {a_file} is not a file named *.gguf"),
    (["convert", "{missing}.gguf", "{out}"], "gguf", "missing path", [], "{missing}.gguf does not exist"),
    # --- train ------------------------------------------------------------------------------------
    (TRAIN, "--target", "missing path", ["--target", "{missing}"], "--target: {missing} does not exist"),
    (TRAIN, "--target", "unreadable path", ["--target", "{a_file}"], "is a file, expected a directory"),
    (TRAIN, "--target", "empty", ["--target", ""], "--target: expected a non-empty"),
    (TRAIN, "--target", "wrong model kind", ["--target", "{draft}"], "holds an EAGLE-3 draft, not a target model"),
    (TRAIN, "--target", "wrong model kind", ["--target", "{t5_dir}"], "is not a causal language model"),
    (TRAIN, "--target", "unreadable path", ["--target", "{truncated_target}"], "the weights cannot be read"),
    (TRAIN, "--data", "missing path", ["--data", "{missing}"], "--data: {missing} does not exist"),
    (TRAIN, "--data", "unreadable path", ["--data", "{empty_dir}"], "is a directory, expected a file"),
    (TRAIN, "--data", "empty", ["--data", "{empty_file}"], "training data file: {empty_file} is empty"),
    (TRAIN, "--data", "wrong type", ["--data", "{binary_file}"], "{binary_file}:3: a NUL byte"),
    (TRAIN, "--data", "wrong type", ["--data", "{latin1_file}"], "{latin1_file}:2: byte 0xe9 is not UTF-8"),
    (TRAIN, "--data", "too small", ["--data", "{short_text}"], "yields no example of at least 3 tokens"),
    (TRAIN, "--data", "wrong type", ["--data", "{missing_key_jsonl}"],
     "{missing_key_jsonl}:2: expected a \"text\" string, a \"messages\" list or an \"input_ids\" list"),
    (TRAIN, "--data", "wrong type", ["--data", "{no_assistant_jsonl}"],
     "{no_assistant_jsonl}:1: the conversation has no assistant message to learn from"),
    (TRAIN, "--data", "wrong type", ["--data", "{bad_json_jsonl}"], "{bad_json_jsonl}:2: not valid JSON"),
    (TRAIN, "--data", "wrong type", ["--data", "{array_jsonl}"], "{array_jsonl}:1: expected a JSON object, got list"),
    (TRAIN, "--data", "wrong type", ["--data", "{bad_messages_jsonl}"],
     "{bad_messages_jsonl}:1: \"messages\" must be a non-empty list of"),
    (TRAIN, "--data", "too large", ["--data", "{out_of_vocab_jsonl}"],
     "token id 999999 in the data is outside the target's vocabulary"),
    (TRAIN, "--out", "unreadable path", ["--out", "{a_file}"], "--out: {a_file} is a file, expected a directory"),
    (TRAIN, "--out", "empty", ["--out", ""], "--out: expected a non-empty"),
    (TRAIN, "--aux-layers", "negative", ["--aux-layers", "1", "-1", "2"], "--aux-layers: expected a non-negative"),
    (TRAIN, "--aux-layers", "wrong type", ["--aux-layers", "low"], "--aux-layers: expected a non-negative integer"),
    (TRAIN, "--aux-layers", "too large", ["--aux-layers", "1", "2", "99"], "include [99], outside [0, 4]"),
    (TRAIN, "--aux-layers", "mismatched pair", ["--aux-layers", "2", "2", "3"], "aux_layers must be distinct"),
    (TRAIN, "--draft-vocab-size", "zero", ["--draft-vocab-size", "0"], "--draft-vocab-size: expected a positive"),
    (TRAIN, "--draft-vocab-size", "negative", ["--draft-vocab-size", "-5"], "--draft-vocab-size: expected a positive"),
    (TRAIN, "--draft-vocab-size", "too large", ["--draft-vocab-size", "1000000"],
     "draft_vocab_size 1000000 is larger than the target vocabulary"),
    (TRAIN, "--draft-vocab-size", "wrong type", ["--draft-vocab-size", "big"], "--draft-vocab-size: expected a"),
    (TRAIN, "--ttt-steps", "zero", ["--ttt-steps", "0"], "--ttt-steps: expected an integer in [1, 32], got 0"),
    (TRAIN, "--ttt-steps", "negative", ["--ttt-steps", "-7"], "--ttt-steps: expected an integer in [1, 32]"),
    (TRAIN, "--ttt-steps", "too large", ["--ttt-steps", "33"], "--ttt-steps: expected an integer in [1, 32]"),
    (TRAIN, "--ttt-steps", "wrong type", ["--ttt-steps", "seven"], "--ttt-steps: expected an integer in [1, 32]"),
    (TRAIN, "--epochs", "zero", ["--epochs", "0"], "--epochs: expected a positive integer, got 0"),
    (TRAIN, "--epochs", "negative", ["--epochs", "-1"], "--epochs: expected a positive integer"),
    (TRAIN, "--epochs", "wrong type", ["--epochs", "1.5"], "--epochs: expected a positive integer"),
    (TRAIN, "--lr", "zero", ["--lr", "0"], "--lr: expected a positive number, got 0"),
    (TRAIN, "--lr", "negative", ["--lr", "-0.001"], "--lr: expected a positive number"),
    (TRAIN, "--lr", "too large", ["--lr", "inf"], "--lr: expected a positive number"),
    (TRAIN, "--lr", "wrong type", ["--lr", "fast"], "--lr: expected a positive number"),
    (TRAIN, "--batch-tokens", "zero", ["--batch-tokens", "0"], "--batch-tokens: expected a positive integer"),
    (TRAIN, "--batch-tokens", "negative", ["--batch-tokens", "-1"], "--batch-tokens: expected a positive integer"),
    (TRAIN, "--batch-tokens", "mismatched pair", ["--batch-tokens", "16"],
     "batch_tokens (16) must hold one sequence of max_len (32) tokens"),
    (TRAIN, "--batch-tokens", "wrong type", ["--batch-tokens", "4k"], "--batch-tokens: expected a positive integer"),
    (TRAIN, "--max-len", "zero", ["--max-len", "0"], "--max-len: expected an integer >= 4, got 0"),
    (TRAIN, "--max-len", "too small", ["--max-len", "3"], "--max-len: expected an integer >= 4"),
    (TRAIN, "--max-len", "negative", ["--max-len", "-1"], "--max-len: expected an integer >= 4"),
    (TRAIN, "--max-len", "too large", ["--max-len", "4096", "--batch-tokens", "4096"],
     "max_len 4096 is longer than the target's context (512 positions"),
    (TRAIN, "--max-len", "wrong type", ["--max-len", "long"], "--max-len: expected an integer >= 4"),
    (TRAIN, "--dtype", "wrong type", ["--dtype", "float64"], "--dtype: invalid choice: 'float64'"),
    (TRAIN, "--amp", "wrong type", ["--amp", "float32"], "--amp: invalid choice: 'float32'"),
    (TRAIN, "--eval-every", "zero", ["--eval-every", "0"], "--eval-every: expected a positive integer"),
    (TRAIN, "--eval-every", "negative", ["--eval-every", "-10"], "--eval-every: expected a positive integer"),
    (TRAIN, "--eval-every", "wrong type", ["--eval-every", "often"], "--eval-every: expected a positive integer"),
    (TRAIN, "--val-examples", "zero", ["--val-examples", "0"], "--val-examples: expected a positive integer"),
    (TRAIN, "--val-examples", "negative", ["--val-examples", "-1"], "--val-examples: expected a positive integer"),
    (TRAIN, "--val-examples", "wrong type", ["--val-examples", "x"], "--val-examples: expected a positive integer"),
    (TRAIN, "--max-steps", "zero", ["--max-steps", "0"], "--max-steps: expected a positive integer, got 0"),
    (TRAIN, "--max-steps", "negative", ["--max-steps", "-1"], "--max-steps: expected a positive integer"),
    (FROM_CACHE, "--from-cache", "missing path", ["--from-cache", "{missing}"],
     "--from-cache: {missing} does not exist"),
    (FROM_CACHE, "--from-cache", "wrong type", ["--from-cache", "{empty_dir}"], "is not a training cache: it has no "
     "manifest.json"),
    (TRAIN, "--from-cache", "mismatched pair", ["--from-cache", "{empty_dir}"],
     "--from-cache replaces --target and --data"),
    (FROM_CACHE, "--target", "missing", [], "--target and --data are required (or --from-cache"),
    (TRAIN, "--tp-size", "zero", ["--tp-size", "0"], "--tp-size: expected a positive integer, got 0"),
    (TRAIN, "--tp-size", "wrong type", ["--tp-size", "two"], "--tp-size: expected a positive integer"),
    (TRAIN, "--tp-size", "too large", ["--tp-size", "2"], "tp_size must divide the number of processes (1), got 2"),
    (TRAIN, "--device", "wrong type", ["--device", "gpu7"], "device 'gpu7' is not a device torch knows"),
    (TRAIN, "--max-steps", "wrong type", ["--max-steps", "1e3"], "--max-steps: expected a positive integer"),
    (TRAIN, "--seed", "negative", ["--seed", "-3"], "--seed: expected an integer in [0"),
    (TRAIN, "--seed", "too large", ["--seed", str(2**70)], "--seed: expected an integer in [0"),
    (TRAIN, "--seed", "wrong type", ["--seed", "x"], "--seed: expected an integer in [0"),
    (TRAIN, "--resume", "missing path", ["--resume"], "resume: no checkpoint under"),
    (TRAIN, "--resume", "wrong type", ["--resume=1"], "--resume: ignored explicit argument '1'"),
    (TRAIN, "--init-from", "missing path", ["--init-from", "{missing}"], "--init-from: {missing} does not exist"),
    (TRAIN, "--init-from", "wrong type", ["--init-from", "{empty_dir}"], "{empty_dir}"),
    (TRAIN, "--compile", "wrong type", ["--compile=1"], "--compile: ignored explicit argument '1'"),
    (TRAIN, "--no-specforge-export", "wrong type", ["--no-specforge-export=0"], "ignored explicit argument '0'"),
    (TRAIN, "--no-vllm-export", "wrong type", ["--no-vllm-export=0"], "ignored explicit argument '0'"),
    (TRAIN, "--norm-before-residual", "wrong type", ["--norm-before-residual=1"], "ignored explicit argument '1'"),
    (TRAIN, "--fc-norm", "mismatched pair", ["--fc-norm", "--norm-before-fc"],
     "--norm-before-fc: not allowed with argument --fc-norm"),
    (TRAIN, "--norm-before-fc", "wrong type", ["--norm-before-fc=on"], "ignored explicit argument 'on'"),
    (TRAIN, "--norm-output", "wrong type", ["--norm-output=on"], "ignored explicit argument 'on'"),
    (TRAIN, "--json", "wrong type", ["--json=1"], "--json: ignored explicit argument '1'"),
    # --- doctor -----------------------------------------------------------------------------------
    (DOCTOR, "--target", "missing path", ["--target", "{missing}", "--draft", "{draft}"], "--target: {missing} does"),
    (DOCTOR, "--target", "wrong model kind", ["--target", "{draft}", "--draft", "{draft}"], "holds an EAGLE-3 draft"),
    (DOCTOR, "--target", "unreadable path", ["--target", "{corrupt_target}", "--draft", "{draft}"],
     "the weights cannot be read"),
    (DOCTOR, "--target", "mismatched pair", ["--target", "{target}"], "give both --target and --draft"),
    (DOCTOR, "--draft", "missing path", ["--target", "{target}", "--draft", "{missing}"], "--draft: {missing} does"),
    (DOCTOR, "--draft", "wrong model kind", ["--target", "{target}", "--draft", "{target}"], "not an EAGLE-3 draft"),
    (DOCTOR, "--draft", "unreadable path", ["--target", "{target}", "--draft", "{corrupt_draft}"],
     "cannot be read (truncated or corrupt?)"),
    (DOCTOR, "--data", "missing path", ["--data", "{missing}"], "--data: {missing} does not exist"),
    (DOCTOR, "--data", "empty", ["--data", "{empty_file}"], "{empty_file} is empty"),
    (DOCTOR, "--data", "wrong type", ["--data", "{binary_file}"], "{binary_file}:3: a NUL byte"),
    (DOCTOR, "--steps", "zero", ["--steps", "0"], "--steps: expected an integer in [1, 16], got 0"),
    (DOCTOR, "--steps", "negative", ["--steps", "-1"], "--steps: expected an integer in [1, 16]"),
    (DOCTOR, "--steps", "too large", ["--steps", "17"], "--steps: expected an integer in [1, 16]"),
    (DOCTOR, "--steps", "wrong type", ["--steps", "3.0"], "--steps: expected an integer in [1, 16]"),
    (DOCTOR, "--max-examples", "zero", ["--max-examples", "0"], "--max-examples: expected a positive integer"),
    (DOCTOR, "--max-examples", "negative", ["--max-examples", "-2"], "--max-examples: expected a positive integer"),
    (DOCTOR, "--max-examples", "wrong type", ["--max-examples", "x"], "--max-examples: expected a positive integer"),
    (DOCTOR, "--max-len", "zero", ["--max-len", "0"], "--max-len: expected an integer >= 8"),
    (DOCTOR, "--max-len", "negative", ["--max-len", "-128"], "--max-len: expected an integer >= 8"),
    (DOCTOR, "--max-len", "too large", ["--max-len", "100000"], "doctor: max_len 100000 is longer than the target's"),
    (DOCTOR, "--max-len", "wrong type", ["--max-len", "x"], "--max-len: expected an integer >= 8"),
    (DOCTOR, "--prompt-tokens", "zero", ["--prompt-tokens", "0"], "--prompt-tokens: expected an integer >= 2"),
    (DOCTOR, "--prompt-tokens", "negative", ["--prompt-tokens", "-1"], "--prompt-tokens: expected an integer >= 2"),
    (DOCTOR, "--prompt-tokens", "too large", ["--prompt-tokens", "32"], "prompt_tokens (32) must be below max_len"),
    (DOCTOR, "--prompt-tokens", "wrong type", ["--prompt-tokens", "x"], "--prompt-tokens: expected an integer >= 2"),
    (DOCTOR, "--no-self-generate", "wrong type", ["--no-self-generate=1"], "ignored explicit argument '1'"),
    (DOCTOR, "--acceptance-prompts", "negative", ["--acceptance-prompts", "-1"],
     "--acceptance-prompts: expected a non-negative integer"),
    (DOCTOR, "--acceptance-prompts", "wrong type", ["--acceptance-prompts", "x"], "--acceptance-prompts: expected"),
    (DOCTOR, "--write-fingerprint", "wrong type", ["--write-fingerprint=1"], "ignored explicit argument '1'"),
    (DOCTOR, "--json", "wrong type", ["--json=1"], "--json: ignored explicit argument '1'"),
]

# Options whose 0 is a documented value, not an error: --temperature 0 is greedy (generate and
# bench), --top-k 0 and --seed 0 are what Hugging Face calls them, --acceptance-prompts 0 skips the measurement,
# --aux-layers 0 is the embedding output (hidden_states[0]), --lookup-tokens 0 turns lookup off.
ZERO_IS_A_VALUE = {"--temperature", "--top-k", "--seed", "--acceptance-prompts", "--aux-layers", "--lookup-tokens"}


def _fill(items, values):
    return [item.format(**values) for item in items]


def _case_id(case):
    base, option, kind, args, _ = case
    return f"{base[0]} {option} {kind}: {' '.join(args)[:40]}"


def run_cli(argv, capsys):
    """main(argv) in this process: any exception escaping it fails the test (a traceback)."""
    rc = cli.main(argv)
    captured = capsys.readouterr()
    return rc, captured.err


@pytest.mark.parametrize("case", CLI_CASES, ids=[_case_id(c) for c in CLI_CASES])
def test_cli_bad_input_is_one_clear_line(case, bad_paths, tmp_path, capsys):
    base, option, kind, args, expected = case
    values = {**bad_paths, "out": str(tmp_path / "out")}
    rc, err = run_cli(_fill(base, values) + _fill(args, values), capsys)
    assert rc == 2, f"exit code {rc} (a bad value that ran anyway?); stderr:\n{err[-2000:]}"
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"eagle3 {base[0]}: error: "), last
    assert expected.format(**values) in last, last


def _actions(command):
    parser = argparse.ArgumentParser()
    cli.COMMANDS[command][0](parser.add_subparsers())
    sub = parser._subparsers._group_actions[0].choices[command]
    return [a for a in sub._actions if a.option_strings and "--help" not in a.option_strings]


def _is_numeric(action) -> bool:
    kind = getattr(action.type, "__name__", "")
    return kind.startswith(("a positive", "a non-negative", "an integer", "a number"))


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_every_option_is_swept(command):
    cases = [c for c in CLI_CASES if c[0][0] == command]
    options = {a.option_strings[-1] for a in _actions(command)}
    assert options - {c[1] for c in cases} == set(), "options without a bad-input case"
    # No option reads 0 as "not given": every numeric option is tried with 0, unless 0 is one
    # of its documented values.
    numeric = {a.option_strings[-1] for a in _actions(command) if _is_numeric(a)}
    tried_with_zero = {c[1] for c in cases if "0" in c[3]}
    assert numeric - tried_with_zero - ZERO_IS_A_VALUE == set()


def test_zero_values_that_mean_something_are_honoured(capsys):
    """--temperature 0 is greedy and --top-k 0 is no top-k: both run (they are not defaults
    standing in for a missing value; the defaults of --depth and friends are None)."""
    rc, err = run_cli(GEN + ["--temperature", "0", "--top-k", "0", "--seed", "0", "--lookup-tokens", "0", "--json"],
                      capsys)
    assert rc == 0, err[-2000:]
