"""The API half of the bad-input sweep (tests/test_bad_input.py has the command line): every
public function and configuration with each class of bad value, each answered by a ValueError
or TypeError (FileNotFoundError for a missing path) whose message names the argument and what
was expected."""

from __future__ import annotations

import pytest
import torch

import eagle3_ext
from eagle3_ext import CompileOptions, Eagle3DraftConfig, Eagle3DraftModel, SpeculativeGenerator, TreeConfig, ops
from eagle3_ext.doctor import diagnose
from eagle3_ext.preflight import memory
from eagle3_ext.bench.suite import BenchConfig, run_bench
from eagle3_ext.models import bundled_paths
from eagle3_ext.train import TrainConfig, train

pytestmark = pytest.mark.usefixtures("deadline")


@pytest.fixture(scope="module")
def gen():
    return SpeculativeGenerator.from_pretrained(*bundled_paths())


class Ctx:
    def __init__(self, gen, paths, out):
        self.gen, self.p, self.out = gen, paths, out
        self.target, self.draft = bundled_paths()

    def train(self, **bad):
        options = dict(target=self.p["tiny"], data=[self.p["good_text"]], out=self.out, max_steps=1, max_len=32,
                       batch_tokens=256, export_specforge=False, export_vllm=False, progress=False)
        return train(TrainConfig(**{**options, **bad}))

    def doctor(self, **bad):
        options = dict(target=self.target, draft=self.draft, max_examples=2, acceptance_prompts=0, max_len=32,
                       prompt_tokens=8)
        return diagnose(**{**options, **bad})

    def bench(self, **bad):
        options = dict(num_prompts=1, batch_sizes=[1], max_new_tokens=4, configs={"chain2": TreeConfig.chain(2)},
                       out=self.out)
        return run_bench(BenchConfig(**{**options, **bad}), progress=False)

    def generate(self, prompt="def f(x):", **kwargs):
        return self.gen.generate(prompt, **{"max_new_tokens": 4, **kwargs})


def _tensor_args(op):
    """Valid arguments of each op (a one-request tree of 4 nodes), to spoil one at a time."""
    if op == "fused_aux_fc":
        return [[torch.randn(2, 8)] * 3, torch.randn(4, 24), None]
    if op == "tree_attention":
        mask = torch.tril(torch.ones(1, 4, 4, dtype=torch.bool))
        return [torch.randn(1, 4, 2, 8), torch.randn(1, 16, 2, 8), torch.randn(1, 16, 2, 8),
                torch.tensor([3]), mask, 0.35]
    raise KeyError(op)


# (function, argument, class, call, exception, text the message must hold)
CASES = [
    # --- TreeConfig -----------------------------------------------------------------------------
    ("TreeConfig", "depth", "zero", lambda c: TreeConfig(depth=0), ValueError, "TreeConfig.depth must be an integer"),
    ("TreeConfig", "depth", "negative", lambda c: TreeConfig(depth=-1), ValueError, "TreeConfig.depth must be"),
    ("TreeConfig", "depth", "too large", lambda c: TreeConfig(depth=65), ValueError, "in [1, 64], got 65"),
    ("TreeConfig", "depth", "wrong type", lambda c: TreeConfig(depth="5"), TypeError, "got '5' (str)"),
    ("TreeConfig", "depth", "wrong type", lambda c: TreeConfig(depth=5.0), TypeError, "got 5.0 (float)"),
    ("TreeConfig", "topk", "zero", lambda c: TreeConfig(topk=0), ValueError, "TreeConfig.topk must be an integer"),
    ("TreeConfig", "topk", "too large", lambda c: TreeConfig(topk=100), ValueError, "in [1, 64], got 100"),
    ("TreeConfig", "topk", "wrong type", lambda c: TreeConfig(topk=True), TypeError, "TreeConfig.topk"),
    ("TreeConfig", "num_draft_tokens", "zero", lambda c: TreeConfig(num_draft_tokens=0), ValueError, "[2, 29], got 0"),
    ("TreeConfig", "num_draft_tokens", "too large", lambda c: TreeConfig(2, 1, 5, lookup_tokens=0), ValueError,
     "num_draft_tokens must be an integer in [2, 3], got 5: the root and the drafted candidates"),
    ("TreeConfig", "num_draft_tokens", "too large", lambda c: TreeConfig(2, 1, 20, lookup_tokens=10), ValueError,
     "num_draft_tokens must be an integer in [2, 13], got 20: the root and the drafted candidates"),
    ("TreeConfig", "lookup_tokens", "negative", lambda c: TreeConfig(lookup_tokens=-1), ValueError,
     "TreeConfig.lookup_tokens must be an integer in [0, 64], got -1"),
    ("TreeConfig", "lookup_tokens", "too large", lambda c: TreeConfig(lookup_tokens=65), ValueError,
     "TreeConfig.lookup_tokens must be an integer in [0, 64], got 65"),
    ("TreeConfig", "lookup_tokens", "wrong type", lambda c: TreeConfig(lookup_tokens="10"), TypeError,
     "TreeConfig.lookup_tokens"),
    ("TreeConfig", "lookup_ngram", "zero", lambda c: TreeConfig(lookup_ngram=0), ValueError,
     "TreeConfig.lookup_ngram must be an integer in [1, 16], got 0"),
    ("TreeConfig", "lookup_ngram", "wrong type", lambda c: TreeConfig(lookup_ngram=2.0), TypeError,
     "TreeConfig.lookup_ngram"),
    ("TreeConfig", "lookup_corpus", "wrong type", lambda c: TreeConfig(lookup_corpus="no"), TypeError,
     "TreeConfig.lookup_corpus must be a bool, got 'no'"),
    ("TreeConfig", "lookup_corpus", "mismatched pair", lambda c: TreeConfig(lookup_tokens=0, num_draft_tokens=12,
                                                                           lookup_corpus=True), ValueError,
     "TreeConfig.lookup_corpus needs lookup_tokens > 0"),
    ("TreeConfig", "num_draft_tokens", "too large", lambda c: TreeConfig(20, 10, 2000), ValueError, "[2, 1024]"),
    ("TreeConfig", "num_draft_tokens", "wrong type", lambda c: TreeConfig(num_draft_tokens=None), TypeError,
     "TreeConfig.num_draft_tokens"),
    # --- SpeculativeGenerator and from_pretrained ----------------------------------------------
    ("SpeculativeGenerator", "target", "wrong type", lambda c: SpeculativeGenerator("model", c.gen.draft), TypeError,
     "target must be a transformers causal LM"),
    ("SpeculativeGenerator", "draft", "wrong type", lambda c: SpeculativeGenerator(c.gen.target, c.gen.target),
     TypeError, "draft must be an Eagle3DraftModel, got"),
    ("SpeculativeGenerator", "tree", "wrong type", lambda c: SpeculativeGenerator(c.gen.target, c.gen.draft, (5, 4)),
     TypeError, "tree must be a TreeConfig, got tuple"),
    ("SpeculativeGenerator", "tokenizer", "wrong type",
     lambda c: SpeculativeGenerator(c.gen.target, c.gen.draft, tokenizer="gpt2"), TypeError, "tokenizer must be"),
    ("SpeculativeGenerator", "attention", "wrong type",
     lambda c: SpeculativeGenerator(c.gen.target, c.gen.draft, attention="flash"), ValueError,
     "attention must be 'tree' or 'sdpa', got 'flash'"),
    ("SpeculativeGenerator", "strict", "wrong type",
     lambda c: SpeculativeGenerator(c.gen.target, c.gen.draft, strict="no"), TypeError, "strict must be True or"),
    ("SpeculativeGenerator", "compile", "wrong type",
     lambda c: SpeculativeGenerator(c.gen.target, c.gen.draft, compile=1), TypeError,
     "compile must be True, False, None or a CompileOptions, got 1 (int)"),
    ("SpeculativeGenerator", "compile", "wrong type",
     lambda c: SpeculativeGenerator(c.gen.target, c.gen.draft, compile={"autotune": False}), TypeError,
     "compile must be True, False, None or a CompileOptions"),
    ("SpeculativeGenerator", "check_ranks", "wrong type",
     lambda c: SpeculativeGenerator(c.gen.target, c.gen.draft, check_ranks=None), TypeError,
     "check_ranks must be True or False, got None"),
    ("SpeculativeGenerator", "compile", "mismatched pair",
     lambda c: SpeculativeGenerator(c.gen.target, c.gen.draft, attention="sdpa", compile=True), ValueError,
     "compile=True needs attention='tree'"),
    ("from_pretrained", "compile", "wrong type",
     lambda c: SpeculativeGenerator.from_pretrained(c.p["missing"], c.draft, compile="yes"), TypeError,
     "compile must be True, False, None or a CompileOptions, got 'yes' (str)"),  # before the models load
    # --- CompileOptions -------------------------------------------------------------------------
    ("CompileOptions", "autotune", "wrong type", lambda c: CompileOptions(autotune=1), TypeError,
     "CompileOptions.autotune must be True, False or None, got 1 (int)"),
    ("CompileOptions", "cpp_wrapper", "wrong type", lambda c: CompileOptions(cpp_wrapper="no"), TypeError,
     "CompileOptions.cpp_wrapper must be True or False, got 'no' (str)"),
    ("CompileOptions", "cuda_graphs", "wrong type", lambda c: CompileOptions(cuda_graphs=None), TypeError,
     "CompileOptions.cuda_graphs must be True or False, got None"),
    ("CompileOptions", "packages", "wrong type", lambda c: CompileOptions(packages=0), TypeError,
     "CompileOptions.packages must be True or False, got 0 (int)"),
    ("CompileOptions", "package_dir", "wrong type", lambda c: CompileOptions(package_dir=3), TypeError,
     "CompileOptions.package_dir must be a path (str or os.PathLike), got int"),
    ("CompileOptions", "package_dir", "empty", lambda c: CompileOptions(package_dir=""), ValueError,
     "CompileOptions.package_dir must be a non-empty path, got ''"),
    ("from_pretrained", "target", "missing path", lambda c: SpeculativeGenerator.from_pretrained(c.p["missing"],
                                                                                              c.draft),
     FileNotFoundError, "target directory"),
    ("from_pretrained", "target", "wrong model kind", lambda c: SpeculativeGenerator.from_pretrained(c.draft, c.draft),
     ValueError, "holds an EAGLE-3 draft, not a target model"),
    ("from_pretrained", "target", "wrong model kind",
     lambda c: SpeculativeGenerator.from_pretrained(c.p["t5_dir"], c.draft), ValueError, "not a causal language"),
    ("from_pretrained", "target", "unreadable path",
     lambda c: SpeculativeGenerator.from_pretrained(c.p["corrupt_target"], c.draft), ValueError,
     "the weights cannot be read"),
    ("from_pretrained", "target", "wrong type", lambda c: SpeculativeGenerator.from_pretrained(42, c.draft),
     TypeError, "target must be a directory or a transformers causal LM, got int"),
    ("from_pretrained", "draft", "missing path",
     lambda c: SpeculativeGenerator.from_pretrained(c.target, c.p["missing"]), FileNotFoundError, "draft directory"),
    ("from_pretrained", "draft", "wrong model kind", lambda c: SpeculativeGenerator.from_pretrained(c.target, c.target),
     ValueError, "not an EAGLE-3 draft"),
    ("from_pretrained", "draft", "unreadable path",
     lambda c: SpeculativeGenerator.from_pretrained(c.target, c.p["truncated_draft"]), ValueError,
     "cannot be read (truncated or corrupt?)"),
    ("from_pretrained", "draft", "mismatched pair",
     lambda c: SpeculativeGenerator.from_pretrained(c.target, c.p["deeper_target_draft"]), ValueError,
     "trained on a target with 12 layers"),
    ("from_pretrained", "draft", "wrong type", lambda c: SpeculativeGenerator.from_pretrained(c.target, 3.5),
     TypeError, "draft must be a directory or an Eagle3DraftModel, got float"),
    ("from_pretrained", "dtype", "wrong type", lambda c: SpeculativeGenerator.from_pretrained(c.target, c.draft,
                                                                                          dtype="float64"),
     ValueError, "dtype must be one of float32, bfloat16, float16, got 'float64'"),
    ("from_pretrained", "dtype", "wrong type", lambda c: SpeculativeGenerator.from_pretrained(c.target, c.draft,
                                                                                          dtype=torch.float64),
     ValueError, "dtype must be one of float32, bfloat16, float16 (or its torch.dtype), got torch.float64"),
    ("from_pretrained", "dtype", "wrong type", lambda c: SpeculativeGenerator.from_pretrained(c.target, c.draft,
                                                                                          dtype=16),
     TypeError, "dtype must be a dtype name"),
    ("from_pretrained", "draft_dtype", "wrong type",
     lambda c: SpeculativeGenerator.from_pretrained(c.target, c.draft, draft_dtype="int8"), ValueError,
     "draft_dtype must be one of"),
    ("from_pretrained", "device", "wrong type",
     lambda c: SpeculativeGenerator.from_pretrained(c.target, c.draft, device="tpu"), ValueError,
     "device 'tpu' is not a device torch knows"),
    ("from_pretrained", "device", "wrong type",
     lambda c: SpeculativeGenerator.from_pretrained(c.target, c.draft, device=0.5), TypeError, "device must be"),
    ("from_pretrained", "tree", "wrong type",
     lambda c: SpeculativeGenerator.from_pretrained(c.target, c.draft, tree={"depth": 3}), TypeError,
     "tree must be a TreeConfig, got dict"),
    # --- generate -------------------------------------------------------------------------------
    ("generate", "input_ids", "wrong type", lambda c: c.gen.generate(None), TypeError, "input_ids must be a tensor"),
    ("generate", "input_ids", "wrong type", lambda c: c.gen.generate(3.5), TypeError, "got float"),
    ("generate", "input_ids", "empty", lambda c: c.gen.generate([]), TypeError, "input_ids must be a tensor"),
    ("generate", "input_ids", "empty", lambda c: c.gen.generate([[]], max_new_tokens=4), ValueError,
     "prompt 0 is empty"),
    ("generate", "input_ids", "empty", lambda c: c.generate(""), ValueError, "prompt 0 is empty"),
    ("generate", "input_ids", "wrong type", lambda c: c.gen.generate(torch.ones(1, 3)), TypeError,
     "input_ids must be an int64 or int32 tensor of token ids, got torch.float32"),
    ("generate", "input_ids", "wrong type", lambda c: c.gen.generate(torch.ones(1, 1, 3, dtype=torch.long)),
     ValueError, "input_ids must be [B, L] or [L], got shape [1, 1, 3]"),
    ("generate", "input_ids", "too large", lambda c: c.gen.generate([[5, 10 ** 7]]), ValueError,
     "prompt 0 has token ids outside the target vocabulary"),
    ("generate", "input_ids", "negative", lambda c: c.gen.generate([[5, -1]]), ValueError,
     "prompt 0 has token ids outside the target vocabulary"),
    ("generate", "input_ids", "too large", lambda c: c.gen.generate([[5] * 3000]), ValueError,
     "prompt 0 has 3000 tokens, longer than the target's context (2048"),
    ("generate", "input_ids", "wrong type", lambda c: c.gen.generate([[1, 2], 7]), TypeError,
     "prompt 1: expected a string, a list of token ids or chat messages, got int"),
    ("generate", "attention_mask", "mismatched pair",
     lambda c: c.gen.generate(torch.ones(1, 3, dtype=torch.long), torch.ones(1, 4, dtype=torch.long)), ValueError,
     "attention_mask must be"),
    ("generate", "attention_mask", "wrong type",
     lambda c: c.gen.generate(torch.ones(1, 3, dtype=torch.long), [[1, 1, 1]]), TypeError,
     "attention_mask must be a tensor, got list"),
    ("generate", "attention_mask", "mismatched pair", lambda c: c.gen.generate("x", torch.ones(1, 1)), ValueError,
     "attention_mask goes with an input_ids tensor"),
    ("generate", "max_new_tokens", "zero", lambda c: c.generate(max_new_tokens=0), ValueError, "max_new_tokens"),
    ("generate", "max_new_tokens", "negative", lambda c: c.generate(max_new_tokens=-2), ValueError, "max_new_tokens"),
    ("generate", "max_new_tokens", "too large", lambda c: c.generate(max_new_tokens=10 ** 6), ValueError,
     "beyond the target's context (2048, its max_position_embeddings); lower max_new_tokens to"),
    ("generate", "max_new_tokens", "wrong type", lambda c: c.generate(max_new_tokens="8"), (TypeError, ValueError),
     "max_new_tokens"),
    ("generate", "max_new_tokens", "wrong type", lambda c: c.generate(max_new_tokens=2.5), (TypeError, ValueError),
     "max_new_tokens"),
    ("generate", "min_new_tokens", "negative", lambda c: c.generate(min_new_tokens=-1), ValueError,
     "min_new_tokens"),
    ("generate", "min_new_tokens", "wrong type", lambda c: c.generate(min_new_tokens="2"), (TypeError, ValueError),
     "min_new_tokens"),
    ("generate", "max_length", "zero", lambda c: c.gen.generate("def", max_length=0), ValueError, "max_length"),
    ("generate", "do_sample", "wrong type", lambda c: c.generate(do_sample="yes"), TypeError,
     "do_sample must be True or False, got 'yes'"),
    ("generate", "temperature", "negative", lambda c: c.generate(do_sample=True, temperature=-1.0), ValueError,
     "temperature must be a number >= 0, got -1"),
    ("generate", "temperature", "zero", lambda c: c.generate(do_sample=True, temperature=0.0), ValueError,
     "do_sample=True needs temperature > 0"),
    ("generate", "temperature", "too large", lambda c: c.generate(do_sample=True, temperature=float("inf")),
     ValueError, "temperature must be a number >= 0, got inf"),
    ("generate", "temperature", "wrong type", lambda c: c.generate(do_sample=True, temperature="hot"),
     (TypeError, ValueError), "temperature"),
    ("generate", "top_p", "zero", lambda c: c.generate(do_sample=True, top_p=0.0), ValueError,
     "top_p must be a number in (0, 1], got 0"),
    ("generate", "top_p", "too large", lambda c: c.generate(do_sample=True, top_p=1.5), ValueError, "top_p"),
    ("generate", "top_k", "negative", lambda c: c.generate(do_sample=True, top_k=-1), ValueError, "top_k"),
    ("generate", "top_k", "wrong type", lambda c: c.generate(do_sample=True, top_k=2.5), (TypeError, ValueError),
     "top_k"),
    ("generate", "seed", "negative", lambda c: c.generate(seed=-1), ValueError, "generate: seed must be an integer"),
    ("generate", "seed", "too large", lambda c: c.generate(seed=2 ** 64), ValueError, "generate: seed must be"),
    ("generate", "seed", "wrong type", lambda c: c.generate(seed="42"), TypeError, "generate: seed must be"),
    ("generate", "eos_token_id", "wrong type", lambda c: c.generate(eos_token_id="</s>"), TypeError,
     "eos_token_id must be an int or a list of ints"),
    ("generate", "stop_strings", "empty", lambda c: c.generate(stop_strings=[""]), TypeError,
     "stop_strings must be non-empty strings"),
    ("generate", "stop_strings", "wrong type", lambda c: c.generate(stop_strings=[3]), TypeError, "stop_strings"),
    ("generate", "logits_processor", "wrong type", lambda c: c.generate(logits_processor=3), TypeError,
     "logits_processor must be a LogitsProcessorList"),
    ("generate", "stopping_criteria", "wrong type", lambda c: c.generate(stopping_criteria=3), TypeError,
     "stopping_criteria must be a StoppingCriteriaList"),
    ("generate", "streamer", "wrong type", lambda c: c.generate(streamer=print), TypeError,
     "streamer must have put() and end() methods"),
    ("generate", "generation_config", "wrong type", lambda c: c.generate(generation_config={"max_new_tokens": 3}),
     TypeError, "generation_config must be a transformers GenerationConfig, got dict"),
    ("generate", "kwargs", "wrong type", lambda c: c.generate(max_tokens=5), TypeError,
     "unexpected keyword arguments ['max_tokens']"),
    ("generate", "num_beams", "too large", lambda c: c.generate(num_beams=4), ValueError,
     "num_beams=4 is not supported by speculative decoding"),
    ("generate", "batch", "too large", lambda c: c.gen.generate(["def f():"] * 10 ** 5, max_new_tokens=2000),
     ValueError, "generate at most"),
    # --- train ----------------------------------------------------------------------------------
    ("train", "target", "missing path", lambda c: c.train(target=c.p["missing"]), FileNotFoundError,
     "target directory"),
    ("train", "target", "wrong model kind", lambda c: c.train(target=c.draft), ValueError,
     "holds an EAGLE-3 draft, not a target model"),
    ("train", "target", "empty", lambda c: c.train(target=""), ValueError, "target must be a non-empty path"),
    ("train", "target", "wrong type", lambda c: c.train(target=None), TypeError, "target must be a path"),
    ("train", "data", "empty", lambda c: c.train(data=[]), TypeError, "data must be a non-empty list of file paths"),
    ("train", "data", "wrong type", lambda c: c.train(data=c.p["good_text"]), TypeError, "data must be a non-empty"),
    ("train", "data", "missing path", lambda c: c.train(data=[c.p["missing"]]), FileNotFoundError,
     "data[0]: "),
    ("train", "data", "unreadable path", lambda c: c.train(data=[c.p["empty_dir"]]), ValueError,
     "is a directory, expected a file"),
    ("train", "data", "wrong type", lambda c: c.train(data=[c.p["binary_file"]]), ValueError, ":3: a NUL byte"),
    ("train", "data", "wrong type", lambda c: c.train(data=[c.p["no_assistant_jsonl"]]), ValueError,
     "no_assistant.jsonl:1: the conversation has no assistant message"),
    ("train", "out", "empty", lambda c: c.train(out=""), ValueError, "out must be a non-empty path"),
    ("train", "out", "unreadable path", lambda c: c.train(out=c.p["a_file"]), ValueError,
     "is a file, expected a directory to write into"),
    ("train", "aux_layers", "empty", lambda c: c.train(aux_layers=[]), TypeError, "aux_layers must be None"),
    ("train", "aux_layers", "negative", lambda c: c.train(aux_layers=[1, -2, 3]), ValueError, "aux_layers[1]"),
    ("train", "aux_layers", "too large", lambda c: c.train(aux_layers=[1, 2, 40]), ValueError, "outside [0, 4]"),
    ("train", "aux_layers", "wrong type", lambda c: c.train(aux_layers=["low", 2, 3]), TypeError, "aux_layers[0]"),
    ("train", "draft_vocab_size", "zero", lambda c: c.train(draft_vocab_size=0), ValueError, "draft_vocab_size"),
    ("train", "draft_vocab_size", "too large", lambda c: c.train(draft_vocab_size=10 ** 6), ValueError,
     "draft_vocab_size 1000000 is larger than the target vocabulary"),
    ("train", "ttt_steps", "zero", lambda c: c.train(ttt_steps=0), ValueError, "ttt_steps must be an integer in"),
    ("train", "ttt_steps", "too large", lambda c: c.train(ttt_steps=100), ValueError, "ttt_steps"),
    ("train", "ttt_steps", "wrong type", lambda c: c.train(ttt_steps=7.0), TypeError, "ttt_steps"),
    ("train", "epochs", "zero", lambda c: c.train(epochs=0), ValueError, "epochs must be a positive integer"),
    ("train", "lr", "zero", lambda c: c.train(lr=0.0), ValueError, "lr must be a positive number, got 0"),
    ("train", "lr", "negative", lambda c: c.train(lr=-1e-3), ValueError, "lr must be a positive number"),
    ("train", "lr", "wrong type", lambda c: c.train(lr="1e-3"), TypeError, "lr must be a positive number"),
    ("train", "lr", "too large", lambda c: c.train(lr=float("nan")), ValueError, "lr must be a positive number"),
    ("train", "warmup_steps", "negative", lambda c: c.train(warmup_steps=-1), ValueError, "warmup_steps"),
    ("train", "batch_tokens", "zero", lambda c: c.train(batch_tokens=0), ValueError, "batch_tokens"),
    ("train", "batch_tokens", "mismatched pair", lambda c: c.train(batch_tokens=16), ValueError,
     "batch_tokens (16) must hold one sequence of max_len (32) tokens"),
    ("train", "max_len", "zero", lambda c: c.train(max_len=0), ValueError, "max_len must be an integer >= 4"),
    ("train", "max_len", "too large", lambda c: c.train(max_len=4096, batch_tokens=4096), ValueError,
     "max_len 4096 is longer than the target's context"),
    ("train", "dtype", "wrong type", lambda c: c.train(dtype="float64"), ValueError, "dtype must be one of"),
    ("train", "amp", "wrong type", lambda c: c.train(amp="float32"), ValueError, "amp must be one of"),
    ("train", "eval_every", "zero", lambda c: c.train(eval_every=0), ValueError, "eval_every"),
    ("train", "val_max_examples", "zero", lambda c: c.train(val_max_examples=0), ValueError, "val_max_examples"),
    ("train", "val_fraction", "zero", lambda c: c.train(val_fraction=0.0), ValueError, "val_fraction"),
    ("train", "val_fraction", "too large", lambda c: c.train(val_fraction=1.0), ValueError, "val_fraction"),
    ("train", "max_steps", "zero", lambda c: c.train(max_steps=0), ValueError, "max_steps must be a positive"),
    ("train", "seed", "negative", lambda c: c.train(seed=-1), ValueError, "seed must be an integer in [0"),
    ("train", "resume", "missing path", lambda c: c.train(resume=True), FileNotFoundError,
     "resume: no checkpoint under"),
    ("train", "norm flags", "mismatched pair", lambda c: c.train(fc_norm=True, norm_before_fc=True), ValueError,
     "fc_norm (one RMSNorm per aux state) and norm_before_fc"),
    # --- diagnose -------------------------------------------------------------------------------
    ("diagnose", "target", "missing path", lambda c: c.doctor(target=c.p["missing"]), FileNotFoundError,
     "target directory"),
    ("diagnose", "target", "wrong model kind", lambda c: c.doctor(target=c.draft), ValueError,
     "holds an EAGLE-3 draft"),
    ("diagnose", "draft", "wrong model kind", lambda c: c.doctor(draft=c.target), ValueError, "not an EAGLE-3 draft"),
    ("diagnose", "draft", "unreadable path", lambda c: c.doctor(draft=c.p["corrupt_draft"]), ValueError,
     "cannot be read"),
    ("diagnose", "data", "empty", lambda c: c.doctor(data=[]), TypeError, "data must be None"),
    ("diagnose", "data", "wrong type", lambda c: c.doctor(data=c.p["good_text"]), TypeError, "data must be None"),
    ("diagnose", "data", "missing path", lambda c: c.doctor(data=[c.p["missing"]]), FileNotFoundError, "data[0]"),
    ("diagnose", "steps", "zero", lambda c: c.doctor(steps=0), ValueError, "doctor: steps must be an integer in"),
    ("diagnose", "steps", "too large", lambda c: c.doctor(steps=17), ValueError, "[1, 16], got 17"),
    ("diagnose", "steps", "wrong type", lambda c: c.doctor(steps="3"), TypeError, "doctor: steps"),
    ("diagnose", "max_len", "too small", lambda c: c.doctor(max_len=7), ValueError, "max_len must be an integer >= 8"),
    ("diagnose", "max_len", "too large", lambda c: c.doctor(max_len=10 ** 5), ValueError,
     "longer than the target's context"),
    ("diagnose", "max_examples", "zero", lambda c: c.doctor(max_examples=0), ValueError, "max_examples"),
    ("diagnose", "prompt_tokens", "too large", lambda c: c.doctor(prompt_tokens=32), ValueError,
     "prompt_tokens (32) must be below max_len (32)"),
    ("diagnose", "acceptance_prompts", "negative", lambda c: c.doctor(acceptance_prompts=-1), ValueError,
     "acceptance_prompts"),
    # --- run_bench ------------------------------------------------------------------------------
    ("run_bench", "prompts", "empty", lambda c: c.bench(prompts=[]), TypeError, "prompts must be None"),
    ("run_bench", "prompts", "empty", lambda c: c.bench(prompts=["def f():", " "]), ValueError, "prompts[1]"),
    ("run_bench", "prompts", "wrong type", lambda c: c.bench(prompts="def f():"), TypeError, "prompts must be None"),
    ("run_bench", "num_prompts", "zero", lambda c: c.bench(num_prompts=0), ValueError, "num_prompts must be"),
    ("run_bench", "num_prompts", "too large", lambda c: c.bench(num_prompts=10 ** 6), ValueError, "num_prompts"),
    ("run_bench", "max_new_tokens", "zero", lambda c: c.bench(max_new_tokens=0), ValueError, "max_new_tokens"),
    ("run_bench", "max_new_tokens", "too large", lambda c: c.bench(max_new_tokens=10 ** 5), ValueError,
     "beyond the target's context"),
    ("run_bench", "batch_sizes", "empty", lambda c: c.bench(batch_sizes=[]), TypeError, "batch_sizes must be a"),
    ("run_bench", "batch_sizes", "zero", lambda c: c.bench(batch_sizes=[1, 0]), ValueError, "batch_sizes[1]"),
    ("run_bench", "batch_sizes", "too large", lambda c: c.bench(batch_sizes=[2]), ValueError,
     "batch_sizes[0] must be an integer in [1, 1], got 2"),
    ("run_bench", "batch_sizes", "wrong type", lambda c: c.bench(batch_sizes=4), TypeError, "batch_sizes must be"),
    ("run_bench", "configs", "empty", lambda c: c.bench(configs={}), TypeError, "configs must be a non-empty dict"),
    ("run_bench", "configs", "wrong type", lambda c: c.bench(configs={"t": (5, 4, 16)}), TypeError,
     "configs['t'] must be a TreeConfig"),
    ("run_bench", "out", "unreadable path", lambda c: c.bench(out=c.p["a_file"]), ValueError, "is a file"),
    ("run_bench", "dtype", "wrong type", lambda c: c.bench(dtype="fp8"), ValueError, "dtype must be one of"),
    ("run_bench", "compiled_baseline", "wrong type", lambda c: c.bench(compiled_baseline="no"), TypeError,
     "compiled_baseline must be True or False, got 'no' (str)"),
    ("run_bench", "llama_cpp", "wrong type", lambda c: c.bench(llama_cpp=1), TypeError,
     "llama_cpp must be True or False, got 1 (int)"),
    ("run_bench", "compile", "wrong type", lambda c: c.bench(compile="on"), TypeError,
     "compile must be True, False, None or a CompileOptions, got 'on' (str)"),
    ("run_bench", "temperatures", "negative", lambda c: c.bench(temperatures=[0.7, -1.0]), ValueError,
     "temperatures[1] must be a number >= 0, got -1"),
    ("run_bench", "temperatures", "wrong type", lambda c: c.bench(temperatures=0.7), TypeError,
     "temperatures must be a non-empty list of numbers >= 0 (0 = greedy), got 0.7"),
    ("run_bench", "temperatures", "empty", lambda c: c.bench(temperatures=[]), TypeError,
     "temperatures must be a non-empty list"),
    ("run_bench", "temperatures", "mismatched pair", lambda c: c.bench(temperatures=[1.0, 1.0]), ValueError,
     "temperatures must be distinct (one run each), got [1.0, 1.0]"),
    ("run_bench", "top_p", "zero", lambda c: c.bench(temperatures=[0.7], top_p=0.0), ValueError,
     "top_p must be a number in (0, 1], got 0"),
    ("run_bench", "top_p", "wrong type", lambda c: c.bench(temperatures=[0.7], top_p="0.9"), TypeError,
     "top_p must be a number in (0, 1]"),
    ("run_bench", "top_k", "negative", lambda c: c.bench(temperatures=[0.7], top_k=-2), ValueError,
     "top_k must be a non-negative integer, got -2"),
    ("run_bench", "top_k", "mismatched pair", lambda c: c.bench(top_k=5), ValueError,
     "top_p=1 / top_k=5 filter the sampled runs, but temperatures [0.0] run greedy only"),
    # --- the draft model ------------------------------------------------------------------------
    ("Eagle3DraftModel.from_pretrained", "path", "missing path",
     lambda c: Eagle3DraftModel.from_pretrained(c.p["missing"]), FileNotFoundError, "draft directory"),
    ("Eagle3DraftModel.from_pretrained", "path", "wrong model kind",
     lambda c: Eagle3DraftModel.from_pretrained(c.target), ValueError, "not an EAGLE-3 draft"),
    ("Eagle3DraftModel.from_pretrained", "path", "wrong model kind",
     lambda c: Eagle3DraftModel.from_pretrained(c.p["empty_dir"]), FileNotFoundError, "has no config.json"),
    ("Eagle3DraftModel.from_pretrained", "path", "unreadable path",
     lambda c: Eagle3DraftModel.from_pretrained(c.p["corrupt_draft"]), ValueError, "cannot be read"),
    ("Eagle3DraftModel.save_pretrained", "format", "wrong type",
     lambda c: c.gen.draft.save_pretrained(c.out, format="gguf"), ValueError, "format"),
    ("Eagle3DraftConfig", "hidden_size", "zero", lambda c: Eagle3DraftConfig(0, 128, 4, 2, 100, 50), ValueError,
     "Eagle3DraftConfig.hidden_size must be a positive integer, got 0"),
    ("Eagle3DraftConfig", "hidden_size", "wrong type", lambda c: Eagle3DraftConfig("64", 128, 4, 2, 100, 50),
     TypeError, "Eagle3DraftConfig.hidden_size"),
    ("Eagle3DraftConfig", "num_key_value_heads", "mismatched pair",
     lambda c: Eagle3DraftConfig(64, 128, 4, 3, 100, 50), ValueError, "not a multiple of num_key_value_heads=3"),
    ("Eagle3DraftConfig", "draft_vocab_size", "too large", lambda c: Eagle3DraftConfig(64, 128, 4, 2, 100, 500),
     ValueError, "draft_vocab_size=500 is larger than the target vocabulary"),
    ("resolve_aux_layer_ids", "config", "wrong type", lambda c: eagle3_ext.resolve_aux_layer_ids("config.json", 6),
     TypeError, "config must be a checkpoint's config.json as a dict, got str"),
    ("resolve_aux_layer_ids", "config", "wrong type",
     lambda c: eagle3_ext.resolve_aux_layer_ids({"eagle_aux_hidden_state_layer_ids": ["low", 2, 3]}, 6),
     ValueError, "eagle_aux_hidden_state_layer_ids"),
    ("resolve_aux_layer_ids", "num_target_layers", "zero", lambda c: eagle3_ext.resolve_aux_layer_ids({}, 0),
     ValueError, "num_target_layers must be a positive integer, got 0"),
    # --- ops (the op test files sweep every shape, dtype and value fault; here the Python types) --
    ("fused_aux_fc", "aux_hidden", "wrong type", lambda c: ops.fused_aux_fc(torch.randn(2, 8), torch.randn(4, 8)),
     TypeError, "eagle3.fused_aux_fc: aux_hidden must be a list of torch.Tensor, got Tensor"),
    ("fused_aux_fc", "weight", "wrong type", lambda c: ops.fused_aux_fc([torch.randn(2, 8)], [[1.0] * 8]),
     TypeError, "weight must be a torch.Tensor, got list"),
    ("fused_aux_fc", "aux_hidden", "wrong type",
     lambda c: ops.fused_aux_fc([torch.ones(2, 8, dtype=torch.int32)], torch.randn(4, 8)), TypeError,
     "must be float32, float16 or bfloat16, got Int"),
    ("fused_aux_fc", "weight", "mismatched pair", lambda c: ops.fused_aux_fc([torch.randn(2, 8)] * 3,
                                                                            torch.randn(4, 16)),
     ValueError, "weight expects 16 = 2 x 8"),
    ("tree_attention", "scale", "wrong type", lambda c: ops.tree_attention(*_tensor_args("tree_attention")[:5], "0.3"),
     TypeError, "eagle3.tree_attention: scale must be a float, got str"),
    ("tree_attention", "validate", "wrong type",
     lambda c: ops.tree_attention(*_tensor_args("tree_attention"), validate=1), TypeError,
     "eagle3.tree_attention: validate must be True, False or None, got 1 (int)"),
    ("cuda_validation", "on", "wrong type", lambda c: ops.cuda_validation("yes").__enter__(), TypeError,
     "cuda_validation: on must be True or False, got 'yes' (str)"),
    ("set_cpu_isa", "isa", "wrong type", lambda c: ops.set_cpu_isa(2), TypeError,
     "set_cpu_isa: isa must be one of 'generic', 'avx2', 'avx512' or None, got 2 (int)"),
    ("set_cpu_isa", "isa", "unknown name", lambda c: ops.set_cpu_isa("AVX2"), ValueError,
     "set_cpu_isa: isa must be one of 'generic', 'avx2', 'avx512' or None, got 'AVX2'"),
    ("tree_attention", "window", "negative",
     lambda c: ops.tree_attention(*_tensor_args("tree_attention"), window=-1), ValueError, "window must be 0"),
    ("tree_attention", "window", "wrong type",
     lambda c: ops.tree_attention(*_tensor_args("tree_attention"), window=1.5), TypeError, "window must be an int"),
    ("tree_attention", "cache_lens", "too large",
     lambda c: ops.tree_attention(*_tensor_args("tree_attention")[:3], torch.tensor([14]),
                                  *_tensor_args("tree_attention")[4:]), ValueError, "S_max = 16"),
    ("tree_attention_paged", "block_table", "wrong type",
     lambda c: ops.tree_attention_paged(torch.randn(1, 4, 2, 8), torch.randn(4, 4, 2, 8), torch.randn(4, 4, 2, 8),
                                        [[0, 1]], torch.tensor([3]), torch.ones(1, 4, 4, dtype=torch.bool), 0.3),
     TypeError, "block_table must be a torch.Tensor, got list"),
    ("build_tree_kernel_efficient", "topk", "wrong type",
     lambda c: ops.build_tree_kernel_efficient(*[torch.zeros(1, dtype=torch.long)] * 8, 2.0, 3, 4), TypeError,
     "eagle3.build_tree_kernel_efficient: topk must be an int, got float"),
    ("verify_tree_greedy", "predicts", "wrong type",
     lambda c: ops.verify_tree_greedy(None, *[torch.zeros(1, dtype=torch.long)] * 7), TypeError,
     "predicts must be a torch.Tensor, got NoneType"),
    ("tree_speculative_sampling_target_only", "threshold_single", "wrong type",
     lambda c: ops.tree_speculative_sampling_target_only(*[torch.zeros(1)] * 11, threshold_single="1"), TypeError,
     "threshold_single must be a float, got str"),
    ("tree_speculative_sampling_target_only", "deterministic", "wrong type",
     lambda c: ops.tree_speculative_sampling_target_only(*[torch.zeros(1)] * 11, deterministic=1), TypeError,
     "deterministic must be a bool, got int"),
    ("tree_speculative_sampling_draft_probs", "draft_probs", "wrong type",
     lambda c: ops.tree_speculative_sampling_draft_probs(*[torch.zeros(1)] * 10, [[0.5, 0.5]]), TypeError,
     "eagle3.tree_speculative_sampling_draft_probs: draft_probs must be a torch.Tensor, got list"),
    ("tree_speculative_sampling_draft_probs", "uniform_samples", "wrong type",
     lambda c: ops.tree_speculative_sampling_draft_probs(*[torch.zeros(1)] * 7, 0.5, *[torch.zeros(1)] * 3),
     TypeError, "uniform_samples must be a torch.Tensor, got float"),
    ("tree_speculative_sampling_draft_probs", "deterministic", "wrong type",
     lambda c: ops.tree_speculative_sampling_draft_probs(*[torch.zeros(1)] * 11, deterministic="yes"), TypeError,
     "deterministic must be a bool, got str"),
]


def _case_id(case):
    return f"{case[0]} {case[1]} {case[2]}"


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_api_bad_input_is_a_clear_error(case, gen, bad_paths, tmp_path):
    _, argument, _, call, exception, expected = case
    with pytest.raises(exception) as info:
        call(Ctx(gen, bad_paths, str(tmp_path / "out")))
    assert expected in str(info.value), str(info.value)
    assert len(str(info.value).splitlines()) == 1, "one line"


def test_memory_prediction_counts_what_the_cache_holds(gen):
    """The KV bytes predicted per token equal what transformers' cache holds after a forward."""
    from transformers import DynamicCache

    target = gen.target
    cache = DynamicCache()
    with torch.no_grad():
        target(torch.arange(1, 11)[None], cache=cache, use_cache=True)
    held = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert held == 10 * memory.target_kv_bytes_per_token(target.config, target.dtype)


def test_memory_check_refuses_before_allocating(gen, monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1 << 20)  # 1 MiB free
    with pytest.raises(ValueError, match=r"need about .* GiB on cpu .* but 0.0 GiB are free; generate at most 0 "):
        gen.generate(["def f():"] * 64, max_new_tokens=512)
    monkeypatch.setattr(memory, "available_bytes", lambda device: None)  # unknown: no refusal
    assert gen.generate("def", max_new_tokens=2).shape[1] > 1
