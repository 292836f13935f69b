"""``eagle3 bench``: end-to-end speed against what one would use instead, in the same run.

For each batch size, over a set of prompts: plain Hugging Face greedy generate, Hugging Face
prompt lookup decoding (``prompt_lookup_num_tokens``, batch 1 only: transformers supports no
more), at batch 1 the stronger baselines of ``bench/peers.py`` (Hugging Face with a static cache
and torch.compile; llama.cpp where installed), and eagle3_ext with each tree configuration,
beside its roofline estimate (``roofline``). Per configuration: tokens/s, acceptance
length, per-depth acceptance, speedup against plain generate and whether the outputs are
identical to it. Writes bench.json, bench.md and bench.png (speedup and acceptance per
configuration). ``sweep`` tries depth / topk / num_draft_tokens combinations at batch 1 and
names the fastest for the machine it runs on.

Each temperature > 0 in ``temperatures`` adds a sampled run per batch size: plain Hugging Face
sampling with the same temperature / top-p / top-k as the baseline, and every configuration
sampling with them. Sampled outputs are not token-identical to the baseline's (there is no
divergence check); instead each configuration reports its acceptance bound (what exact lossless
verification of its trees keeps in expectation, decoding/acceptance_bound.py), per depth too,
and acceptance / bound.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, field
from itertools import zip_longest
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from .. import validation
from ..api.config import TreeConfig
from ..api.generator import SpeculativeGenerator
from ..api.inputs import chat_prompt, uses_chat
from ..api.stats import GenerationStats
from ..compiled.options import CompileOptions, compile_options
from ..dtypes import check_dtype_name
from ..errors import BadInputError, BadInputTypeError
from ..models import bundled_eval_prompts
from ..peers import llama_cpp_build
from ..peers.llama_cpp import missing_reason as llama_cpp_missing_reason
from . import llama_cpp, peers
from .baseline import hf_generate
from .divergence import first_divergence, fp32_reference
from .generate_job import load_pair, resolve_models
from .roofline import MachineRates, estimate_round_cost, measure_machine, weights_read


DEFAULT_CONFIGS = {c.name: c for c in (TreeConfig.chain(5), TreeConfig(5, 4, 16, lookup_tokens=0),
                                        TreeConfig.chain(5, lookup_tokens=10), TreeConfig())}
# With a temperature the defaults also run what `eagle3 generate` drafts when sampling.
SAMPLED_DEFAULT = TreeConfig.chain(TreeConfig.SAMPLED_DEPTH, sampled=True)
SWEEP_DEPTHS = (2, 3, 4, 5, 6, 8)
SWEEP_TOPKS = (1, 2, 4, 8)
SWEEP_NODES = (4, 8, 16, 32, 64)
SWEEP_LOOKUPS = (0, 10)


@dataclass
class BenchConfig:
    target: Optional[str] = None
    draft: Optional[str] = None
    prompts: Optional[List[str]] = None       # texts; default: the prompts of the bundled evaluation set
    num_prompts: Optional[int] = None         # only the first N of them
    max_new_tokens: int = 128
    batch_sizes: Sequence[int] = (1, 4)
    configs: Dict[str, TreeConfig] = field(default_factory=lambda: dict(DEFAULT_CONFIGS))
    prompt_lookup_tokens: int = 10
    compiled_baseline: bool = True            # HF generate with a static cache and torch.compile (batch 1)
    llama_cpp: bool = True                    # llama.cpp's rows (bench/llama_cpp.py) where llama.cpp is built,
                                              # else its plain decoding where llama-cpp-python is installed
    llama_cpp_dir: Optional[str] = None       # the llama.cpp build (benchmarks/build_llama_cpp.sh); None: its
                                              # default folder
    compile: Union[bool, None, CompileOptions] = False  # also every configuration compiled (verify forward,
                                              # draft loop; True: CompileOptions(); False / None: not)
    out: str = "bench-results/e2e"
    dtype: str = "float32"
    draft_dtype: Optional[str] = None         # None: as the draft was saved
    temperatures: Sequence[float] = (0.0,)    # a run per temperature and batch size; 0 = greedy
    top_p: float = 1.0                        # the sampled runs' top-p (1.0 = off)
    top_k: int = 0                            # the sampled runs' top-k (0 = off)
    chat: Optional[bool] = None               # each prompt as a user turn of the chat template; None:
                                              # where the target's tokenizer has a template
    categories: Optional[List[str]] = None    # one per prompt: each category runs as a prompt set of its own,
                                              # every method measured on it (a JSONL file's "category" fields)

    def validate(self) -> List[str]:
        """Raises TypeError / ValueError naming the first bad field; returns the prompts to run."""
        if self.prompts is not None:
            if not isinstance(self.prompts, (list, tuple)) or not self.prompts:
                raise BadInputTypeError(f"prompts must be None (the bundled set) or a non-empty list of strings, got "
                                        f"{self.prompts!r}")
            for i, prompt in enumerate(self.prompts):
                validation.text(f"prompts[{i}]", prompt)
        prompts = list(self.prompts) if self.prompts is not None else bundled_eval_prompts()
        if self.num_prompts is not None:
            validation.integer("num_prompts", self.num_prompts, 1, len(prompts))
            prompts = prompts[:self.num_prompts]
        if self.categories is not None:
            if self.prompts is None or not isinstance(self.categories, (list, tuple)) or \
                    len(self.categories) != len(self.prompts):
                raise BadInputTypeError(f"categories must be None or a list of one category name per prompt (given "
                                        f"prompts), got {self.categories!r}")
            for i, category in enumerate(self.categories):
                validation.text(f"categories[{i}]", category)
        validation.integer("max_new_tokens", self.max_new_tokens, 1)
        validation.integer("prompt_lookup_tokens", self.prompt_lookup_tokens, 1)
        validation.boolean("compiled_baseline", self.compiled_baseline)
        validation.boolean("llama_cpp", self.llama_cpp)
        if self.llama_cpp_dir is not None:
            validation.text("llama_cpp_dir", self.llama_cpp_dir)
        compile_options(self.compile)
        if isinstance(self.batch_sizes, (int, str)) or not self.batch_sizes:
            raise BadInputTypeError(f"batch_sizes must be a non-empty list of integers, got {self.batch_sizes!r}")
        for i, bs in enumerate(self.batch_sizes):
            # A batch larger than the prompts would silently run smaller batches.
            validation.integer(f"batch_sizes[{i}]", bs, 1, len(prompts))
        if not isinstance(self.configs, dict) or not self.configs:
            raise BadInputTypeError(f"configs must be a non-empty dict of name -> TreeConfig, got {self.configs!r}")
        for name, tree in self.configs.items():
            if not isinstance(tree, TreeConfig):
                raise BadInputTypeError(f"configs[{name!r}] must be a TreeConfig, got {type(tree).__name__}")
        validation.output_dir("out", self.out)
        check_dtype_name("dtype", self.dtype)
        check_dtype_name("draft_dtype", self.draft_dtype)
        self._validate_sampling()
        if self.chat is not None:
            validation.boolean("chat", self.chat)
        return prompts

    def _validate_sampling(self) -> None:
        validation.distinct_items("temperatures", self.temperatures, "a non-empty list of numbers >= 0 (0 = greedy)",
                                  lambda name, t: validation.number(name, t, 0), why=" (one run each)")
        validation.number("top_p", self.top_p, 0, 1, exclusive_minimum=True)
        validation.integer("top_k", self.top_k, 0)
        if (self.top_p != 1.0 or self.top_k != 0) and not any(t > 0 for t in self.temperatures):
            raise BadInputError(f"top_p={self.top_p:g} / top_k={self.top_k} filter the sampled runs, but temperatures "
                                f"{list(self.temperatures)} run greedy only; add a temperature > 0")


def prompt_sets(prompts: List[str], categories: Optional[Sequence[str]]) -> List[Tuple[Optional[str], List[str]]]:
    """(category, its prompts) in the order the categories first appear; without categories one
    set of every prompt, named None."""
    if categories is None:
        return [(None, prompts)]
    labels = list(categories)[:len(prompts)]
    return [(c, [p for p, label in zip(prompts, labels) if label == c]) for c in dict.fromkeys(labels)]


def run_bench(cfg: BenchConfig, progress: bool = True) -> Dict[str, Any]:

    prompts = cfg.validate()
    target_dir, draft_dir = resolve_models(cfg.target, cfg.draft, cfg.dtype)
    target, draft, tok = load_pair(target_dir, draft_dir, cfg.dtype, cfg.draft_dtype)
    chat = uses_chat(cfg.chat, tok)
    if chat:
        prompts = [chat_prompt(p, tok) for p in prompts]
    gens = {name: SpeculativeGenerator(target, draft, tree, tokenizer=tok) for name, tree in cfg.configs.items()}
    compiled = compile_options(cfg.compile)
    if compiled is not None:  # beside each configuration, the same with its verify forward and draft loop compiled
        gens.update({f"{name}+compiled": SpeculativeGenerator(target, draft, tree, tokenizer=tok, compile=compiled)
                     for name, tree in cfg.configs.items()})
    sets = prompt_sets(prompts, cfg.categories)
    for gen in gens.values():  # every call of the run, checked before the first one runs
        for _, subset in sets:
            for bs in cfg.batch_sizes:
                for start in range(0, len(subset), bs):
                    gen.check_inputs(subset[start:start + bs], max_new_tokens=cfg.max_new_tokens)
    first = next(iter(gens.values()))
    first.check_capture()  # a mismatched pair stops here, before any method (a peer included) is measured
    for gen in gens.values():
        gen.capture_check = first.capture_check
    report: Dict[str, Any] = {"target": target_dir, "draft": draft_dir, "prompts": len(prompts),
                              "dtype": str(target.dtype).removeprefix("torch."),
                              "draft_dtype": str(draft.fc.weight.dtype).removeprefix("torch."),
                              "max_new_tokens": cfg.max_new_tokens, "chat": chat, "threads": torch.get_num_threads(),
                              "runs": []}
    hf_generate(target, tok, prompts[:1], 4)  # warm-up
    rates = measure_machine(target.dtype, str(target.device))
    report["machine"] = {**asdict(rates), "target_weights": weights_read(target), "draft_weights": weights_read(draft)}
    try:
        for category, subset in sets:
            for bs in cfg.batch_sizes:
                for temperature in cfg.temperatures:
                    if temperature == 0:
                        run = _bench_batch(cfg, bs, subset, (target_dir, draft_dir, draft), target, tok, gens, rates,
                                           progress)
                    else:
                        run = _bench_sampled(cfg, bs, float(temperature), subset, target, tok, gens, rates, progress)
                    if category is not None:
                        run = {"category": category, "prompts": len(subset), **run}
                    report["runs"].append(run)
    except KeyboardInterrupt:
        if not report["runs"]:
            raise
        report["interrupted"] = True  # the batch sizes that finished are kept
        write_outputs(report, cfg.out)
        raise KeyboardInterrupt(f"the finished batch sizes are in {cfg.out}/bench.json") from None
    write_outputs(report, cfg.out)
    return report


def _bench_batch(cfg: BenchConfig, bs: int, prompts: List[str], models: tuple, target, tok, gens,
                 rates: MachineRates, progress: bool) -> Dict[str, Any]:
    """Every method at batch size ``bs``: {"batch_size", "results"}."""
    groups = [prompts[i:i + bs] for i in range(0, len(prompts), bs)]
    rows: Dict[str, Dict[str, Any]] = {}
    left_out: Dict[str, str] = {}
    base_tokens, base_time, base_outputs, base_steps = 0, 0.0, [], 0
    for group in groups:
        out, t = hf_generate(target, tok, group, cfg.max_new_tokens)
        base_outputs += out
        base_tokens += sum(len(o) for o in out)
        base_steps += max(len(o) for o in out)  # one forward per new token of the longest row
        base_time += t
    decode_step_s = base_time / max(1, base_steps)
    rows["hf_generate"] = {"method": "hf_generate", "tokens_per_s": base_tokens / base_time, "speedup": 1.0,
                           "acceptance_length": 1.0, "identical": True}
    if bs == 1:
        lookup_tokens, lookup_time, same = 0, 0.0, True
        for group, ref in zip(groups, base_outputs):
            out, t = hf_generate(target, tok, group, cfg.max_new_tokens,
                                  prompt_lookup_num_tokens=cfg.prompt_lookup_tokens)
            lookup_tokens += len(out[0])
            lookup_time += t
            same &= out[0] == ref
        rows["hf_prompt_lookup"] = {"method": "hf_prompt_lookup", "tokens_per_s": lookup_tokens / lookup_time,
                                    "speedup": (lookup_tokens / lookup_time) / (base_tokens / base_time),
                                    "acceptance_length": None, "identical": same}
        rows.update(_peer_rows(cfg, models, target, tok, groups, base_outputs, base_tokens / base_time,
                               left_out, progress))
    for name, gen in gens.items():
        if gen.tree.sampled:  # a sampling configuration: greedy, it would be the plain chain again
            continue
        warm = _warm_up(gen, groups, cfg.max_new_tokens)
        results = [gen.generate(group, max_new_tokens=cfg.max_new_tokens, return_dict_in_generate=True)
                   for group in groups]
        s = GenerationStats.combine([r.stats for r in results])
        outputs = [t for r in results for t in r.new_tokens]
        rows[name] = {**_config_row(name, gen, s, warm, base_tokens / base_time, decode_step_s, target,
                                    rates, bs),
                      **_compare(target, tok, prompts, outputs, base_outputs)}
        if progress:
            print(f"batch {bs} {name}: {s.tokens_per_s:.1f} tokens/s, speedup {rows[name]['speedup']:.2f}x, "
                  f"acceptance length {s.acceptance_length:.2f}, round {_cost_cell(rows[name]['round_cost'])}, "
                  f"identical {_identical_cell(rows[name])}", file=sys.stderr, flush=True)
    return {"batch_size": bs, "temperature": 0.0, "results": list(rows.values()),
            **({"left_out": left_out} if left_out else {})}


def _bench_sampled(cfg: BenchConfig, bs: int, temperature: float, prompts: List[str], target, tok, gens,
                   rates: MachineRates, progress: bool) -> Dict[str, Any]:
    """Sampling at ``temperature`` (with cfg.top_p / top_k) at batch size ``bs``: plain Hugging
    Face sampling, then every configuration with its acceptance bound. Group i samples from
    seed i on both sides; the outputs differ from the baseline's by design (no divergence check)."""
    sample = dict(do_sample=True, temperature=temperature, top_p=cfg.top_p, top_k=cfg.top_k)
    groups = [prompts[i:i + bs] for i in range(0, len(prompts), bs)]
    base_tokens, base_time, base_steps = 0, 0.0, 0
    for seed, group in enumerate(groups):
        out, t = hf_generate(target, tok, group, cfg.max_new_tokens, seed=seed, **sample)
        base_tokens += sum(len(o) for o in out)
        base_steps += max(len(o) for o in out)
        base_time += t
    decode_step_s = base_time / max(1, base_steps)
    rows: Dict[str, Dict[str, Any]] = {"hf_generate": {
        "method": "hf_generate", "tokens_per_s": base_tokens / base_time, "speedup": 1.0, "acceptance_length": 1.0,
        "identical": None}}
    for name, gen in gens.items():
        warm = _warm_up(gen, groups, cfg.max_new_tokens, seed=0, **sample)
        results = [gen.generate(group, max_new_tokens=cfg.max_new_tokens, seed=seed, return_dict_in_generate=True,
                                **sample) for seed, group in enumerate(groups)]
        s = GenerationStats.combine([r.stats for r in results])
        row = _config_row(name, gen, s, warm, base_tokens / base_time, decode_step_s, target, rates, bs)
        row.update(acceptance_bound=s.acceptance_bound, bound_ratio=s.bound_ratio,
                   depth_acceptance_bound=s.depth_acceptance_bound, identical=None)
        rows[name] = row
        if progress:
            print(f"batch {bs} temperature {temperature:g} {name}: {s.tokens_per_s:.1f} tokens/s, speedup "
                  f"{row['speedup']:.2f}x, acceptance length {s.acceptance_length:.2f} of bound "
                  f"{s.acceptance_bound:.2f} ({s.bound_ratio:.2f}), round {_cost_cell(row['round_cost'])}",
                  file=sys.stderr, flush=True)
    return {"batch_size": bs, "temperature": temperature, "top_p": cfg.top_p, "top_k": cfg.top_k,
            "results": list(rows.values())}


def _warm_up(gen, groups: List[List[str]], max_new_tokens: int, **kwargs) -> GenerationStats:
    """A configuration's warm-up. Eager: the first group, a few tokens. Compiled: every group at
    full length (the graphs a call needs depend on its prompt and on which lookup trees its
    rounds build; a greedy timed call repeats its warm-up exactly), then the first group's first
    2^i prompts for every smaller power of two (the batch sizes a compiled batch shrinks
    through), so that every graph compiles here, as an engine compiles before serving; what
    still compiles in the timed calls (sampled runs draw other trees) is in their time and in
    compile_s."""
    if gen.compiled is None:
        return gen.generate(groups[0], max_new_tokens=4, return_dict_in_generate=True, **kwargs).stats
    group = groups[0]
    calls = list(groups) + [group[:1 << i] for i in reversed(range(len(group).bit_length())) if 1 << i < len(group)]
    return GenerationStats.combine([gen.generate(g, max_new_tokens=max_new_tokens, return_dict_in_generate=True,
                                                 **kwargs).stats for g in calls])


def _config_row(name: str, gen, s: GenerationStats, warm: GenerationStats, base_rate: float, decode_step_s: float,
                target, rates: MachineRates, bs: int) -> Dict[str, Any]:
    """One configuration's row: speed against the baseline's rate (tokens/s), acceptance, the
    round's cost in the baseline's decode steps and its roofline estimate."""
    tree = gen.tree
    return {"method": name, "depth": tree.depth, "topk": tree.topk, "num_draft_tokens": tree.num_draft_tokens,
            "tokens_per_s": s.tokens_per_s, "speedup": s.tokens_per_s / base_rate,
            "acceptance_length": s.acceptance_length, "depth_acceptance": s.depth_acceptance,
            "lookup_tokens": tree.lookup_tokens, "lookup_proposed": s.lookup_proposed,
            "lookup_accepted": s.lookup_accepted, "corpus_proposed": s.corpus_proposed,
            "corpus_accepted": s.corpus_accepted, "round_cost": round_cost(s, decode_step_s, tree),
            "roofline": estimate_round_cost(target, gen.draft, tree, rates, bs),
            "compiled": gen.compiled is not None, "compile_s": warm.compile_time_s + s.compile_time_s,
            "timed_compile_s": s.compile_time_s}


def _peer_rows(cfg: BenchConfig, models: tuple, target, tok, groups, base_outputs, base_rate: float,
               left_out: Dict[str, str], progress: bool) -> Dict[str, Dict[str, Any]]:
    """The batch-1 baselines of bench/peers.py that this run asks for and this machine has; why a
    peer is missing goes to ``left_out``."""
    rows = {}
    if cfg.compiled_baseline:
        row = peers.compiled_baseline_row(target, tok, groups, cfg.max_new_tokens, base_outputs, base_rate)
        row.update(_compare(target, tok, [g[0] for g in groups], row.pop("outputs"), base_outputs))
        rows["hf_static_compile"] = row
    target_dir, draft_dir, draft = models
    if not cfg.llama_cpp:
        left_out["llama_cpp"] = "not requested"
    elif (missing := llama_cpp_build.missing_reason(cfg.llama_cpp_dir)) is None:
        ids = [tok(g[0]).input_ids for g in groups]
        try:
            rows.update(llama_cpp.llama_cpp_rows(
                llama_cpp_build.find_build(cfg.llama_cpp_dir), target_dir, draft_dir, draft, ids, cfg.max_new_tokens,
                base_outputs, base_rate, torch.get_num_threads(), llama_cpp.source_gguf(cfg.target, target_dir),
                progress=progress, left_out=left_out))
        except llama_cpp_build.ConversionError as e:  # a target llama.cpp does not take: the rows are left out
            left_out["llama_cpp"] = str(e)
            if progress:
                print(f"llama.cpp rows left out: {e}", file=sys.stderr, flush=True)
    elif (fallback := llama_cpp_missing_reason(target_dir)) is None:  # plain decoding by llama-cpp-python
        rows["llama_cpp"] = peers.llama_cpp_row(target_dir, target, tok, groups, cfg.max_new_tokens,
                                                      base_outputs, base_rate)
    else:
        left_out["llama_cpp"] = f"{missing}; and for llama-cpp-python's plain decoding: {fallback}"
        if progress:
            print(f"llama.cpp rows left out: {left_out['llama_cpp']}", file=sys.stderr, flush=True)
    for row in rows.values():
        if progress:
            print(f"batch 1 {row['method']}: {row['tokens_per_s']:.1f} tokens/s, speedup {row['speedup']:.2f}x, "
                  f"identical {_identical_cell(row)}", file=sys.stderr, flush=True)
    return rows


def round_cost(stats: GenerationStats, decode_step_s: float, tree: TreeConfig) -> Dict[str, float]:
    """A round's cost in plain decode steps of the same run (r = round time / decode-step time,
    the decode step being plain generate's time per forward at the same batch size), and its
    parts: draft forwards, tree building (and lookup grafting), the verify forward, acceptance
    (with sampling: filtering, softmax and the verify op), measuring the acceptance bound
    (sampling only; 0 when greedy), KV compaction, and the rest (prefill, the capture guard,
    bookkeeping), each per round. Also one draft forward's time (a round runs ``depth`` of
    them), to hold against its roofline."""
    rounds = max(1, stats.rounds)
    parts = {"draft": stats.draft_time_s, "tree": stats.tree_build_time_s, "verify": stats.verify_time_s,
             "accept": stats.accept_time_s, "bound": stats.bound_time_s, "compact": stats.compact_time_s,
             "other": stats.other_time_s + stats.guard_time_s}
    out = {name: t / rounds / decode_step_s for name, t in parts.items()}
    out["r"] = stats.total_time_s / rounds / decode_step_s
    out["decode_step_ms"] = decode_step_s * 1e3
    out["draft_step_ms"] = stats.draft_time_s / rounds / tree.depth * 1e3
    return out


def _compare(target, tok, prompts: List[str], ours: List[List[int]], theirs: List[List[int]]) -> Dict[str, Any]:
    """{"identical"}, and where outputs differ, each prompt's first divergence with its fp32 margin
    ("divergences") and whether every one is a near-tie ("lossless")."""
    if ours == theirs:
        return {"identical": True, "lossless": True}
    found, reference = [], fp32_reference(target)  # one fp32 copy for every prompt
    for i, (prompt, a, b) in enumerate(zip(prompts, ours, theirs)):
        d = first_divergence(target, tok(prompt).input_ids, a, b, reference=reference)
        if d is not None:
            found.append({"prompt": i, **d})
    return {"identical": not found, "lossless": all(d["near_tie"] for d in found), "divergences": found}


def _cost_cell(cost: Dict[str, float]) -> str:
    names = ("draft", "tree", "verify", "accept", "bound", "compact", "other")
    parts = " + ".join(f"{name} {cost[name]:.2f}" for name in names if name != "bound" or cost.get(name))
    return f"r {cost['r']:.2f} = {parts}"


def _identical_cell(row: Dict[str, Any]) -> str:
    if row["identical"] is None:  # another precision (llama.cpp's bf16, a quantized file): not compared
        return "not compared"
    if row["identical"]:
        return "yes"
    if row.get("lossless"):
        worst = max(row["divergences"], key=lambda d: d["margin"])
        return f"near-tie ({len(row['divergences'])} prompts, margin <= {worst['margin']:.3f})"
    return "NO"


def markdown(report: Dict[str, Any]) -> str:
    lines = [f"Target {report['target']}, draft {report['draft']}, {report['prompts']} prompts, "
             f"{report['max_new_tokens']} new tokens, {report['threads']} threads, target "
             f"{report.get('dtype', '?')}, draft {report.get('draft_dtype', '?')}.", ""]
    if "machine" in report:
        m = report["machine"]
        lines += [f"Measured here: memory bandwidth {m['bandwidth_gb_s']:.1f} GB/s, matmul "
                  f"{m['matmul_gflop_s']:.1f} GFLOP/s; one forward reads {m['target_weights']['bytes'] / 1e6:.1f} MB "
                  f"(target) and {m['draft_weights']['bytes'] / 1e6:.1f} MB (draft). The roofline r is what a round "
                  "would cost at those rates; the measured r's excess over it is framework overhead.", ""]
    lines += _category_markdown(report)
    for run in report["runs"]:
        if run.get("temperature"):
            lines += _sampled_markdown(run)
            continue
        lines += [f"**{_run_name(run)}**", "",
                  "| method | tokens/s | speedup vs HF generate | acceptance length | per-depth acceptance | "
                  "round cost in decode steps | roofline r | draft step ms (roofline) | identical |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in run["results"]:
            acc = "-" if r.get("acceptance_length") is None else f"{r['acceptance_length']:.2f}"
            depth = " ".join(f"{a:.2f}" for a in r.get("depth_acceptance", [])) or "-"
            cost = _cost_cell(r["round_cost"]) if "round_cost" in r else "-"
            roof = f"{r['roofline']['r']:.2f}" if "roofline" in r else "-"
            step = (f"{r['round_cost']['draft_step_ms']:.2f} ({r['roofline']['draft_step_ms']:.3f})"
                    if "roofline" in r else "-")
            lines.append(f"| {r['method']} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}x | {acc} | {depth} | "
                         f"{cost} | {roof} | {step} | {_identical_cell(r)} |")
        lines.append("")
        for r in run["results"]:
            if "recompiles" in r:
                lines.append(f"{r['method']}: compiled in {r['compile_s']:.1f} s (not in its time), "
                             f"{r['recompiles']} recompilations while timed, static cache length {r['cache_length']}.")
            elif r.get("compiled"):
                lines.append(f"{r['method']}: verify forward and draft loop compiled, {r['compile_s']:.1f} s of "
                             f"compilation, {r['timed_compile_s']:.1f} s of it in the timed calls (in their time).")
            if "llama_cpp" in r:  # a row of the llama.cpp build: which build, file and threads
                files = r.get("gguf") or f"draft {r.get('draft_gguf')}"
                kind = f", file type {r['file_type']}" if "file_type" in r else ""
                repack = (f", weight repacking off (--no-repack; repacked, {r['repacked_run']})"
                          if r.get("repack") is False else "")
                lines.append(f"{r['method']}: {r['llama_cpp']}, {r['threads']} threads, {files}{kind}{repack}.")
            if "sweep" in r:
                sweep = ", ".join(f"{name} {s['tokens_per_s']:.1f} tokens/s (acceptance {s['acceptance_length']:.2f})"
                                  for name, s in r["sweep"].items())
                lines.append(f"{r['method']}: --spec-draft-n-max {r['draft_max']} --spec-draft-p-min {r['p_min']:g} was "
                             f"fastest of {sweep}; the cross-check is {r['cross_check']}; llama.cpp read the draft's "
                             f"captured layers as {r['target_layers']}, trained on {r['draft_aux_layers']}.")
            if "convert_s" in r:
                lines.append(f"{r['method']}: the target as f32 GGUF ({r['convert_s']:.1f} s to convert or find), "
                             f"{r['threads']} threads.")
        for method, reason in run.get("left_out", {}).items():
            lines.append(f"{method} left out: {reason}.")
        lines.append("")
    return "\n".join(lines)


def _run_name(run: Dict[str, Any]) -> str:
    """"batch N", or with categories "CATEGORY (P prompts), batch N"."""
    name = f"batch {run['batch_size']}"
    return f"{run['category']} ({run['prompts']} prompts), {name}" if "category" in run else name


def _category_markdown(report: Dict[str, Any]) -> List[str]:
    """With categories: one table of every configuration per category at batch 1, greedy against
    plain generate, prompt lookup and the compiled static-cache baseline, and each temperature
    against plain sampling (all measured on the category's prompts, in this run)."""
    runs = [run for run in report["runs"] if "category" in run and run["batch_size"] == 1]
    if not runs:
        return []
    temperatures = sorted({run["temperature"] for run in runs if run["temperature"]})
    head = (["category", "method", "tokens/s", "vs HF generate", "vs HF prompt lookup", "vs HF static cache + compile",
             "acceptance length", "identical"]
            + [f"T = {t:g}: vs HF sampling (acceptance length)" for t in temperatures])
    lines = ["**Per category, batch 1** (greedy, then sampling; each category's rows measured on its prompts)", "",
             "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for category in dict.fromkeys(run["category"] for run in runs):
        mine = [run for run in runs if run["category"] == category]
        greedy = {r["method"]: r for run in mine if not run["temperature"] for r in run["results"]}
        sampled = {run["temperature"]: {r["method"]: r for r in run["results"]} for run in mine if run["temperature"]}
        methods = [m for m, r in greedy.items() if "round_cost" in r]
        methods += [m for rows in sampled.values() for m, r in rows.items() if "round_cost" in r and m not in methods]
        for method in dict.fromkeys(methods):
            r = greedy.get(method)
            if r is None:
                cells = ["-"] * 6
            else:
                def against(peer: str) -> str:
                    other = greedy.get(peer)
                    return f"{r['tokens_per_s'] / other['tokens_per_s']:.2f}x" if other else "-"
                cells = [f"{r['tokens_per_s']:.1f}", f"{r['speedup']:.2f}x", against("hf_prompt_lookup"),
                         against("hf_static_compile"), f"{r['acceptance_length']:.2f}", _identical_cell(r)]
            for t in temperatures:
                s = sampled.get(t, {}).get(method)
                cells.append(f"{s['speedup']:.2f}x ({s['acceptance_length']:.2f})" if s else "-")
            lines.append(f"| {category} | {method} | " + " | ".join(cells) + " |")
    return lines + [""]


def _sampled_markdown(run: Dict[str, Any]) -> List[str]:
    lines = [f"**{_run_name(run)}, sampling at temperature {run['temperature']:g}, top-p {run['top_p']:g}, "
             f"top-k {run['top_k'] or 'off'}**", "",
             "Against plain HF sampling with the same settings; not token-identical by design. The bound is what "
             "exact lossless verification of the same trees keeps in expectation with their tokens taken as fixed "
             "(what the target-only verifier keeps); per depth: measured (bound). A sampled chain draws its tokens "
             "from the draft and its p/q verifier keeps more than that, so its ratio exceeds 1.", "",
             "| method | tokens/s | speedup vs HF sampling | acceptance length | bound | acceptance / bound | "
             "per-depth acceptance (bound) | round cost in decode steps | roofline r |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in run["results"]:
        if "round_cost" not in r:  # the baseline
            lines.append(f"| {r['method']} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}x | - | - | - | - | - | - |")
            continue
        pairs = list(zip_longest(r["depth_acceptance"], r["depth_acceptance_bound"], fillvalue=0.0))
        while len(pairs) > 1 and max(pairs[-1]) < 0.005:  # depths only a lookup chain reached, never accepted
            pairs.pop()
        depth = " ".join(f"{a:.2f} ({b:.2f})" for a, b in pairs)
        bound_cells = f"{r['acceptance_bound']:.2f} | {r['bound_ratio']:.2f}"
        lines.append(f"| {r['method']} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}x | "
                     f"{r['acceptance_length']:.2f} | {bound_cells} | "
                     f"{depth or '-'} | {_cost_cell(r['round_cost'])} | {r['roofline']['r']:.2f} |")
    lines.append("")
    for r in run["results"]:
        if r.get("compiled"):
            lines.append(f"{r['method']}: verify forward and draft loop compiled, {r['compile_s']:.1f} s of "
                         f"compilation, {r['timed_compile_s']:.1f} s of it in the timed calls (in their time).")
    lines.append("")
    return lines


def plot(report: Dict[str, Any], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report["runs"]
    names: List[str] = []
    for run in runs:  # prompt lookup exists at batch 1 only: place bars by method, not by position
        names += [r["method"] for r in run["results"] if r["method"] not in names]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / max(1, len(runs))
    for i, run in enumerate(runs):
        by_name = {r["method"]: r for r in run["results"]}
        shown = [n for n in names if n in by_name]
        xs = [names.index(n) + i * width for n in shown]
        label = (f"{run['category']}, " if "category" in run else "") + f"batch {run['batch_size']}"
        label += f", T {run['temperature']:g}" if run.get("temperature") else ""
        axes[0].bar(xs, [by_name[n]["speedup"] for n in shown], width, label=label)
        axes[1].bar(xs, [by_name[n]["acceptance_length"] or 0 for n in shown], width, label=label)
    for ax, title in zip(axes, ("speedup vs HF generate", "acceptance length (tokens per target forward)")):
        ax.set_xticks([j + width * (len(runs) - 1) / 2 for j in range(len(names))])
        ax.set_xticklabels(names, rotation=30, ha="right")
        ax.set_title(title)
        ax.legend()
    axes[0].axhline(1.0, color="gray", linewidth=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(report: Dict[str, Any], out: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "bench.json"), "w") as f:
        json.dump(report, f, indent=2)
    with open(os.path.join(out, "bench.md"), "w") as f:
        f.write(markdown(report))
    plot(report, os.path.join(out, "bench.png"))


def sweep_configs(depths=SWEEP_DEPTHS, topks=SWEEP_TOPKS, nodes=SWEEP_NODES,
                  lookups=SWEEP_LOOKUPS) -> Dict[str, TreeConfig]:
    """Every valid (depth, topk, num_draft_tokens, lookup_tokens) of the grid; chains once per
    depth and lookup length."""
    out: Dict[str, TreeConfig] = {}
    for lookup in lookups:
        for d in depths:
            chain = TreeConfig.chain(d, lookup)
            out[chain.name] = chain
            for k in topks:
                if k == 1:
                    continue
                for n in nodes:
                    try:
                        tree = TreeConfig(d, k, n, lookup_tokens=lookup)
                    except ValueError:
                        continue
                    out[tree.name] = tree
    return out


def run_sweep(cfg: BenchConfig, progress: bool = True) -> Dict[str, Any]:
    """Batch 1 over the sweep grid (or cfg.configs when given); names the fastest."""
    cfg.batch_sizes = (1,)
    report = run_bench(cfg, progress)
    results = [r for r in report["runs"][0]["results"] if "round_cost" in r]  # not the baselines
    best = max(results, key=lambda r: r["tokens_per_s"])
    report["best"] = best
    with open(os.path.join(cfg.out, "bench.json"), "w") as f:
        json.dump(report, f, indent=2)
    return report
