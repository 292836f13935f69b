"""``eagle3 doctor``: why a draft's acceptance is low (``doctor/`` does the work)."""

from __future__ import annotations

import json

from ..doctor.run import MAX_STEPS as MAX_DOCTOR_STEPS
from . import types as T


def add_parser(sub) -> None:
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


def run(args) -> int:
    from ..doctor import diagnose
    from ..bench.generate_job import resolve_models

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
