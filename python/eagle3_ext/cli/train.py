"""``eagle3 train``: train a draft (``train/trainer.py`` does the work); ``eagle3 train capture``,
``eagle3 train regenerate``, ``eagle3 train shrink-vocab`` and ``eagle3 train ngrams`` are commands of
their own (``train_capture.py``, ``train_regenerate.py``, ``train_shrink_vocab.py``, ``train_ngrams.py``),
routed by ``SUBCOMMANDS``."""

from __future__ import annotations

import argparse
import json

from ..api.settings import MAX_SEED
from ..dtypes import DTYPES
from ..errors import BadInputError
from ..train.trainer import MAX_TTT_STEPS
from . import train_capture, train_ngrams, train_regenerate, train_shrink_vocab
from . import types as T


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train an EAGLE-3 draft head for a Hugging Face target",
                       epilog="Data preparation: `eagle3 train capture ...` writes an offline cache of the "
                              "target's hidden states, `eagle3 train regenerate ...` rewrites chat data with the "
                              "target's own responses, `eagle3 train shrink-vocab ...` cuts a trained draft's "
                              "vocabulary, `eagle3 train ngrams ...` counts its n-gram table for hybrid drafting "
                              "(each has --help).")
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
    p.add_argument("--init-from", type=T.directory,
                   help="start from this draft's weights (any supported checkpoint layout; its vocabulary map, "
                        "layers and convention flags) with a fresh optimizer and schedule; with --resume, a "
                        "checkpoint in --out wins")
    p.add_argument("--compile", action="store_true",
                   help="fuse the per-step loss with torch.compile (about 8 s once; on a CPU the loss's passes "
                        "over the draft vocabulary then cost a quarter)")
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


def run(args) -> int:
    from ..distributed import init_from_env, rank, shutdown
    from ..train import TrainConfig, train

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
                         init_from=args.init_from, compile=args.compile,
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


SUBCOMMANDS = {
    "capture": ("run the target once and write the offline training cache `eagle3 train --from-cache` reads",
                train_capture.add_capture_arguments, train_capture.run_capture),
    "regenerate": ("rewrite the assistant turns of chat data with the target's own responses",
                   train_regenerate.add_regenerate_arguments, train_regenerate.run_regenerate),
    "shrink-vocab": ("cut a trained draft's vocabulary down to its most frequent tokens, without training again",
                     train_shrink_vocab.add_shrink_vocab_arguments, train_shrink_vocab.run_shrink_vocab),
    "ngrams": ("count the n-gram table hybrid drafting reads beside a draft, from the data it was trained on",
               train_ngrams.add_ngrams_arguments, train_ngrams.run_ngrams),
}


def run_subcommand(name: str, argv) -> int:
    """Parses and runs ``eagle3 train <name> argv``; errors are handled by cli.main."""
    description, add, run_it = SUBCOMMANDS[name]
    parser = argparse.ArgumentParser(prog=f"eagle3 train {name}", description=description)
    add(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    return run_it(args)
