"""What the capture guard costs: the fingerprint's probe forward and comparison, against a
prefill of the target and a whole speculative generation, measured interleaved in one run.

The guard runs once per SpeculativeGenerator (on its first generate), so the figure that
matters is its share of that first call; later calls pay nothing.

    python benchmarks/bench_capture_guard.py [--prompt-tokens 128] [--new-tokens 128] [--out F.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from timing import compare


def main() -> None:
    from transformers import AutoModelForCausalLM

    from eagle3_ext import Eagle3DraftModel
    from eagle3_ext.draft import fingerprint
    from eagle3_ext.api import SpeculativeGenerator, TreeConfig
    from eagle3_ext.models import bundled_paths

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--budget", type=float, default=10.0, help="seconds of timing")
    parser.add_argument("--out", help="write the figures as JSON")
    args = parser.parse_args()

    torch.set_num_threads(torch.get_num_threads())
    target_dir, draft_dir = bundled_paths()
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    draft = Eagle3DraftModel.from_pretrained(draft_dir, target_config=target.config)
    fp = draft.config.fingerprint
    if fp is None:
        raise SystemExit("the bundled draft carries no activation fingerprint")
    prompt = torch.randint(0, target.config.vocab_size, (1, args.prompt_tokens),
                           generator=torch.Generator().manual_seed(0))
    gen = SpeculativeGenerator(target, draft, TreeConfig(depth=5, topk=2, num_draft_tokens=16))

    def guard():
        fingerprint.check(fp, target, draft.aux_layer_ids)

    def prefill():
        with torch.no_grad():
            target(input_ids=prompt, use_cache=True)

    def generate():
        gen.generate(prompt, max_new_tokens=args.new_tokens)

    t = compare({"guard": guard, "prefill": prefill, "generate": generate}, "cpu", budget_s=args.budget)
    report = {name: timing.as_dict() for name, timing in t.items()}
    report["guard_over_prefill"] = t["guard"].median_s / t["prefill"].median_s
    report["guard_over_first_generate"] = t["guard"].median_s / (t["generate"].median_s + t["guard"].median_s)
    report["probe_tokens"] = len(fp["probe_ids"])
    report["prompt_tokens"], report["new_tokens"] = args.prompt_tokens, args.new_tokens
    print(f"guard {t['guard'].median_s * 1e3:.1f} ms ({report['probe_tokens']}-token probe); prefill of "
          f"{args.prompt_tokens} tokens {t['prefill'].median_s * 1e3:.1f} ms; generate {args.new_tokens} tokens "
          f"{t['generate'].median_s * 1e3:.0f} ms; guard / prefill {report['guard_over_prefill']:.2f}, share of the "
          f"first generate call {100 * report['guard_over_first_generate']:.1f}%, later calls 0")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
