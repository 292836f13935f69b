"""``eagle3 generate``: speculative generation, optionally beside plain decoding measured in the same
run (``bench/generate_job.py`` does the work)."""

from __future__ import annotations

import argparse
import json
import sys

from ..api.config import TreeConfig
from ..api.settings import MAX_SEED
from ..validation import read_text_file
from . import types as T
from .common import add_dtype_options, add_models, resolve_pair


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="speculative generation with a target and its EAGLE-3 draft")
    add_models(p)
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
    p.add_argument("--lookup-corpus", action="store_true",
                   help="hybrid drafting also from the n-gram table the draft ships (lookup_ngrams.safetensors) "
                        "where the request's own tokens match little")
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
    add_dtype_options(p)
    p.add_argument("--tp-timeout", type=T.number(0, exclusive_minimum=True), default=120.0,
                   help="under torchrun: seconds before a collective waiting on a dead or hung rank fails")
    p.add_argument("--check-ranks", action="store_true",
                   help="under torchrun: verify that every rank produced the same tokens")
    p.add_argument("--no-strict-capture", action="store_true",
                   help="warn instead of failing when the captured states do not match the draft's fingerprint")
    p.add_argument("--compile", nargs="?", const="always", choices=["always", "auto"],
                   help="run the verify forward and the draft loop as torch.compile graphs over static caches "
                        "(compiles first); 'auto': only when an earlier run left the compiled verify on disk "
                        "(a float32 target on CPU), else eager")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    from ..distributed import init_from_env, rank, shutdown
    from ..api import CompileOptions
    from ..bench.generate_job import GenerateRequest, output_ok, run_generate

    init_from_env(args.tp_timeout)  # a no-op outside torchrun
    resolve_pair(args)
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
                              lookup_ngram=args.lookup_ngram, lookup_corpus=args.lookup_corpus,
                              chain=args.chain,
                              sampled_draft=args.sampled_draft, attention=args.attention,
                              seed=args.seed, baseline=args.baseline, chat=args.chat, dtype=args.dtype,
                              draft_dtype=args.draft_dtype,
                              check_ranks=args.check_ranks, strict_capture=not args.no_strict_capture,
                              compile=CompileOptions() if args.compile else False,
                              compile_if_on_disk=args.compile == "auto")
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
        corpus = (f"; from the draft's n-gram table {report['corpus_accepted']} of {report['corpus_proposed']}"
                  if tree["lookup_corpus"] else "")
        lookup = (f" lookup {tree['lookup_tokens']} ({report['lookup_accepted']} of {report['lookup_proposed']} "
                  f"lookup tokens accepted{corpus})" if tree["lookup_tokens"] else "")
        line = (f"tree depth {tree['depth']} topk {tree['topk']} nodes {tree['num_draft_tokens']}{lookup}: "
                f"{report['new_tokens']} tokens in {report['target_forwards']} target forwards, acceptance length "
                f"{report['acceptance_length']:.2f}{_bound_text(report)}, {report['tokens_per_s']:.1f} tokens/s")
        if args.baseline:
            line += (f"; plain decoding {report['baseline_tokens_per_s']:.1f} tokens/s, speedup "
                     f"{report['speedup']:.2f}x")
            if report.get("identical") is not None:
                line += ", outputs identical" if report["identical"] else _divergence_text(report.get("divergence"))
        print(line, file=sys.stderr)
        if report["compile_note"] is not None:
            print(report["compile_note"], file=sys.stderr)
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
