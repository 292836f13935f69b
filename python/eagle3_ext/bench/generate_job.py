"""``eagle3 generate``: load a target and its draft, generate, optionally compare with plain
Hugging Face decoding measured in the same run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Union

from ..api.config import SamplingConfig, TreeConfig
from ..api.generator import SpeculativeGenerator
from ..api.inputs import chat_prompt, encode_prompt, uses_chat
from ..api.settings import MAX_SEED
from ..compiled.options import CompileOptions, compile_options
from ..compiled.verify import verify_on_disk
from ..distributed import tp
from ..dtypes import check_dtype_name
from ..errors import BadInputError
from ..models import bundled_paths
from ..models.gguf_target import resolve_target
from ..preflight.loading import load_pair_for_generation
from ..validation import boolean, choice, integer, text
from .baseline import hf_generate
from .divergence import first_divergence


DEFAULT_PROMPT = "def fibonacci(n):\n"
# Asked of a chat target (one whose tokenizer has a chat template) when no prompt is given.
DEFAULT_CHAT_PROMPT = "Write a Python function that tells whether a number is prime, and explain how it works."


@dataclass
class GenerateRequest:
    target: Optional[str] = None
    draft: Optional[str] = None
    prompt: Optional[str] = None
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    depth: Optional[int] = None
    topk: Optional[int] = None
    num_draft_tokens: Optional[int] = None
    lookup_tokens: Optional[int] = None  # 0: hybrid drafting off
    lookup_ngram: Optional[int] = None
    lookup_corpus: bool = False         # also the draft's n-gram table where it ships one (TreeConfig)
    chain: bool = False
    sampled_draft: bool = False         # a chain of tokens drawn from the draft, p/q-verified (sampling)
    attention: str = "tree"
    seed: int = 0
    baseline: bool = False
    dtype: str = "float32"
    draft_dtype: Optional[str] = None   # None: as the draft was saved
    check_ranks: bool = False
    strict_capture: bool = True         # the capture guard raises (False: warns)
    compile: Union[bool, None, CompileOptions] = False  # the verify forward and the draft loop compiled
                                        # (True: CompileOptions(); False / None: not compiled)
    compile_if_on_disk: bool = False    # with compile: only when the verify's compiled form is on disk
                                        # (compiled.verify.verify_on_disk), else eager
    chat: Optional[bool] = None         # the prompt as a user turn of the chat template (None: if the
                                        # tokenizer has one)

    def __post_init__(self) -> None:
        if self.prompt is not None:
            text("prompt", self.prompt)
        integer("max_new_tokens", self.max_new_tokens, 1)
        SamplingConfig(self.temperature, self.top_p, self.top_k)
        integer("seed", self.seed, 0, MAX_SEED)
        choice("attention", self.attention, ("tree", "sdpa"))
        compile_options(self.compile)
        boolean("compile_if_on_disk", self.compile_if_on_disk)
        boolean("sampled_draft", self.sampled_draft)
        boolean("lookup_corpus", self.lookup_corpus)
        check_dtype_name("dtype", self.dtype)
        check_dtype_name("draft_dtype", self.draft_dtype)
        self.tree()  # the tree options, checked now rather than after the models load

    def tree(self) -> TreeConfig:
        """The tree asked for; an option left None takes TreeConfig's default (0 is an error, not
        "the default")."""
        default = TreeConfig()
        untouched = all(v is None for v in (self.depth, self.topk, self.num_draft_tokens, self.lookup_tokens,
                                            self.lookup_ngram)) and not (self.chain or self.lookup_corpus)
        if self.temperature > 0 and untouched:  # sampling: the draft's own samples, p/q-verified
            return TreeConfig.chain(TreeConfig.SAMPLED_DEPTH, sampled=True)
        depth = default.depth if self.depth is None else self.depth
        lookup = default.lookup_tokens if self.lookup_tokens is None else self.lookup_tokens
        ngram = default.lookup_ngram if self.lookup_ngram is None else self.lookup_ngram
        if self.sampled_draft:
            depth = TreeConfig.SAMPLED_DEPTH if self.depth is None else self.depth
            if self.topk not in (None, 1) or self.lookup_tokens not in (None, 0) or self.lookup_corpus or \
                    self.num_draft_tokens not in (None, depth + 1):
                raise BadInputError(f"--sampled-draft drafts a chain of --depth tokens without lookup (topk 1, "
                                    f"lookup tokens 0, num_draft_tokens {depth + 1}, no --lookup-corpus), got --topk "
                                    f"{self.topk}, --lookup-tokens {self.lookup_tokens}, --num-draft-tokens "
                                    f"{self.num_draft_tokens}" + (", --lookup-corpus" if self.lookup_corpus else ""))
            return TreeConfig.chain(depth, sampled=True)
        if self.chain:
            if self.topk not in (None, 1):
                raise BadInputError(f"--chain drafts with topk 1, got --topk {self.topk}")
            if self.num_draft_tokens not in (None, depth + 1 + lookup):
                raise BadInputError(f"--chain verifies depth + 1 + lookup tokens = {depth + 1 + lookup} tokens, got "
                                    f"--num-draft-tokens {self.num_draft_tokens}")
            return TreeConfig(depth=depth, topk=1, num_draft_tokens=depth + 1 + lookup, lookup_tokens=lookup,
                              lookup_ngram=ngram, lookup_corpus=self.lookup_corpus)
        return TreeConfig(depth=depth, topk=default.topk if self.topk is None else self.topk,
                          num_draft_tokens=default.num_draft_tokens if self.num_draft_tokens is None
                          else self.num_draft_tokens, lookup_tokens=lookup, lookup_ngram=ngram,
                          lookup_corpus=self.lookup_corpus)


def resolve_models(target: Optional[str], draft: Optional[str], dtype: str = "float32"):
    """(target directory, draft directory): the bundled pair when neither is given; a ``.gguf``
    target becomes its converted directory in ``dtype`` (converted on first use)."""
    if (target is None) != (draft is None):
        raise BadInputError("give both --target and --draft, or neither for the bundled pair")
    if target is None:
        return bundled_paths()
    return resolve_target(target, dtype), draft


def load_pair(target_dir: str, draft_dir: str, dtype: str, draft_dtype: Optional[str] = None):
    """Target in ``dtype``; the draft in ``draft_dtype`` (None: as saved). The draft's dtype
    changes only how well it guesses, never the output: the target's numbers decide."""
    return load_pair_for_generation(target_dir, draft_dir, None, dtype, draft_dtype)


def compile_choice(req: GenerateRequest, target, draft, tokenizer, prompt: str):
    """(the ``compile=`` to build the generator with, a note on that choice or None). With
    ``compile_if_on_disk``, compiling a verify costs minutes on a small CPU and pays off only over
    many calls, so a run compiles only when an earlier one left the verify's compiled form on disk
    (``verify_on_disk``) and otherwise runs eager."""
    options = compile_options(req.compile)
    if options is None or not req.compile_if_on_disk:
        return options, None
    aux_ids = [int(i) for i in draft.aux_layer_ids]
    prompt_tokens = len(encode_prompt(prompt, tokenizer))
    if verify_on_disk(target, options, req.tree(), aux_ids, 1, prompt_tokens, req.max_new_tokens):
        return options, "compiled: the verify's compiled form was on disk"
    return None, ("eager: no compiled verify of this target, tree and length on disk (--compile builds it once, "
                  "minutes on a small CPU; later runs with --compile or --compile auto load it)")


def run_generate(req: GenerateRequest, progress: bool = True) -> Dict[str, Any]:

    target_dir, draft_dir = resolve_models(req.target, req.draft, req.dtype)
    target, draft, tokenizer = load_pair(target_dir, draft_dir, req.dtype, req.draft_dtype)
    chat = uses_chat(req.chat, tokenizer)
    question = req.prompt if req.prompt is not None else DEFAULT_CHAT_PROMPT if chat else DEFAULT_PROMPT
    prompt = chat_prompt(question, tokenizer) if chat else question
    options, compile_note = compile_choice(req, target, draft, tokenizer, prompt)
    gen = SpeculativeGenerator(target, draft, req.tree(), tokenizer=tokenizer, attention=req.attention,
                               check_ranks=req.check_ranks, strict=req.strict_capture, compile=options)
    streamer = None
    if progress and tp.rank() == 0:
        from transformers import TextStreamer
        if chat:  # the question, then the answer (the template's markup left out)
            print(f"user: {question}\nassistant: ", end="", flush=True)
        streamer = TextStreamer(tokenizer, skip_prompt=chat, skip_special_tokens=chat)
    sample: Dict[str, Any] = dict(do_sample=False, seed=req.seed)
    if req.temperature > 0:  # the sampling options only when sampling (transformers warns otherwise)
        sample.update(do_sample=True, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k)
    # A warm-up so one-time costs (allocator, first kernel calls, compilation) hit neither side;
    # compiled, as long as the real call so that every tree size compiles here.
    compiled = gen.compiled is not None
    warm = gen.generate(prompt, max_new_tokens=req.max_new_tokens if compiled else 4, return_dict_in_generate=True,
                        **sample)
    out = gen.generate(prompt, max_new_tokens=req.max_new_tokens, streamer=streamer, return_dict_in_generate=True,
                       **sample)
    stats = out.stats
    report: Dict[str, Any] = {
        "prompt": prompt, "chat": chat, "text": out.text[0], "tokens": out.new_tokens[0],
        "new_tokens": stats.new_tokens,
        "target_forwards": stats.target_forwards, "acceptance_length": stats.acceptance_length,
        "depth_acceptance": stats.depth_acceptance, "acceptance_bound": stats.acceptance_bound,
        "depth_acceptance_bound": stats.depth_acceptance_bound, "tokens_per_s": stats.tokens_per_s,
        "draft_time_s": stats.draft_time_s, "verify_time_s": stats.verify_time_s, "time_s": stats.total_time_s,
        "compiled": compiled, "compile_note": compile_note,
        "compile_time_s": warm.stats.compile_time_s + stats.compile_time_s,
        "lookup_proposed": stats.lookup_proposed, "lookup_accepted": stats.lookup_accepted,
        "corpus_proposed": stats.corpus_proposed, "corpus_accepted": stats.corpus_accepted,
        "tree": {"depth": gen.tree.depth, "topk": gen.tree.topk, "num_draft_tokens": gen.tree.num_draft_tokens,
                 "lookup_tokens": gen.tree.lookup_tokens, "lookup_ngram": gen.tree.lookup_ngram,
                 "lookup_corpus": gen.tree.lookup_corpus},
        "finish_reason": out.finish_reasons[0], "target": target_dir, "draft": draft_dir,
        "world_size": tp.world_size(),
        "attention": gen.attention_path,
        "attention_reason": ("every layer runs eagle3.tree_attention (windows, soft-caps, sinks and MLA included)"
                             if gen.attention_path == "tree" else "--attention sdpa was asked for: the model's own "
                             "attention with a 4D mask per layer type"),
        "capture_check": None if gen.capture_check is None else {
            "ok": gen.capture_check.ok, "message": gen.capture_check.describe(),
            "time_s": gen.capture_check.time_s},
    }
    if req.baseline:
        report.update(baseline(target, tokenizer, prompt, req, out.new_tokens[0], stats.total_time_s))
    return report


def baseline(target, tokenizer, prompt: str, req: GenerateRequest, tokens, spec_time_s: float) -> Dict[str, Any]:
    """Plain Hugging Face generate with the same settings, timed the same way."""
    sampled = req.temperature > 0
    extra: Dict[str, Any] = dict(do_sample=True, temperature=req.temperature, top_p=req.top_p,
                                 top_k=req.top_k) if sampled else {}
    hf_generate(target, tokenizer, [prompt], 4)  # warm-up
    rows, elapsed = hf_generate(target, tokenizer, [prompt], len(tokens), stop_at_eos=False,
                                seed=req.seed if sampled else None, **extra)
    new = rows[0]
    result: Dict[str, Any] = {"baseline_tokens_per_s": len(new) / elapsed, "baseline_time_s": elapsed,
                              "speedup": elapsed / spec_time_s * len(tokens) / max(1, len(new))}
    result["identical"] = (new[: len(tokens)] == tokens) if not sampled else None
    if result["identical"] is False:
        result["divergence"] = first_divergence(target, tokenizer(prompt).input_ids, tokens, new)
    return result


def output_ok(report: Dict[str, Any]) -> bool:
    """Greedy outputs equal plain decoding's, or leave it only at a near-tie (bf16 / fp16)."""
    if report.get("identical") is not False:
        return True
    divergence = report.get("divergence")
    return bool(divergence and divergence["near_tie"])
