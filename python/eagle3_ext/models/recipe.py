"""The recipe of the bundled default pair: a small Llama target trained from scratch on the
Python standard library that ships with the interpreter, then its EAGLE-3 draft.

    python -m eagle3_ext.models.recipe corpus    --out WORK
    python -m eagle3_ext.models.recipe tokenizer --out WORK [--vocab-size 8192]
    python -m eagle3_ext.models.recipe target    --out WORK [--minutes 60] [--hidden 384 --layers 8 ...]
    python -m eagle3_ext.models.recipe evaluate  --out WORK                  (held-out loss and perplexity)
    python -m eagle3_ext.models.recipe generate  --out WORK [--count 1536]   (the target's own greedy text)
    eagle3 train --target WORK/target --data WORK/train.txt WORK/generated.jsonl --out WORK/draft ...
    python -m eagle3_ext.models.recipe prompts   --out WORK [--count 48]
    python -m eagle3_ext.models.recipe install   --out WORK     (copies target, draft, prompts into the package)

Held-out modules (``HELD_OUT``) never enter the training text: they are the evaluation set and
the source of the benchmark prompts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import sysconfig
import time
from typing import Dict, Sequence

import torch

from ..draft import Eagle3DraftModel

SKIPPED_DIRS = {"test", "tests", "site-packages", "idlelib", "__pycache__", "lib2to3", "turtledemo", "tkinter",
                "ensurepip", "pydoc_data"}
HELD_OUT = ("json", "csv", "textwrap", "fractions", "statistics", "heapq", "bisect", "shlex", "glob", "fnmatch")


def collect_corpus(out: str, stdlib: str | None = None, held_out: Sequence[str] = HELD_OUT) -> Dict[str, object]:
    """Writes train.txt and eval.txt (files separated by blank lines) and corpus.json."""
    root = stdlib or sysconfig.get_paths()["stdlib"]
    train, held, files = [], [], []
    for path, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for name in sorted(names):
            if not name.endswith(".py"):
                continue
            full = os.path.join(path, name)
            rel = os.path.relpath(full, root)
            module = rel.split(os.sep)[0].removesuffix(".py")
            try:
                with open(full, encoding="utf-8") as f:
                    text = f.read()
            except (UnicodeDecodeError, OSError):
                continue
            (held if module in held_out else train).append(text)
            files.append({"file": rel, "bytes": len(text.encode()), "split": "eval" if module in held_out else "train"})
    if not train or not held:
        raise ValueError(f"no Python sources found under {root} (train {len(train)}, held out {len(held)})")
    os.makedirs(out, exist_ok=True)
    for name, texts in (("train.txt", train), ("eval.txt", held)):
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            f.write("\n\n".join(texts))
    # The source directory by name only (its location is the machine's business).
    manifest = {"stdlib": os.path.basename(os.path.normpath(root)), "python": sys.version.split()[0], "held_out": list(held_out),
                "train_files": len(train), "eval_files": len(held),
                "train_bytes": sum(x["bytes"] for x in files if x["split"] == "train"),
                "eval_bytes": sum(x["bytes"] for x in files if x["split"] == "eval"), "files": files}
    with open(os.path.join(out, "corpus.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def train_tokenizer(out: str, vocab_size: int = 8192) -> str:
    """A byte-level BPE tokenizer trained on train.txt, saved to OUT/tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    with open(os.path.join(out, "train.txt"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    tok.train_from_iterator(lines, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    path = os.path.join(out, "tokenizer")
    fast.save_pretrained(path)
    return path


def _token_ids(tok, path: str) -> torch.Tensor:
    """The whole file as one int64 token sequence."""
    with open(path, encoding="utf-8") as f:
        return torch.tensor(tok(f.read())["input_ids"], dtype=torch.long)


def _windows(ids: torch.Tensor, seq_len: int, name: str, at_least: int = 1) -> torch.Tensor:
    """Consecutive, non-overlapping [n, seq_len + 1] windows (inputs plus the shifted targets)."""
    n = ids.numel() // (seq_len + 1)
    if n < at_least:
        raise ValueError(f"{name} gives {n} windows of {seq_len + 1} tokens; at least {at_least} are needed")
    return ids[: n * (seq_len + 1)].view(n, seq_len + 1)


def _next_token_loss(model, x: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    logits = model(input_ids=x[:, :-1]).logits
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten(), reduction=reduction)


def train_target(out: str, minutes: float = 60.0, hidden: int = 384, layers: int = 8, heads: int = 6,
                 kv_heads: int = 2, intermediate: int = 960, seq_len: int = 256, batch: int = 16,
                 lr: float = 1e-3, max_steps: int | None = None, seed: int = 0, tie_embeddings: bool = True) -> Dict[str, object]:
    """Trains a LlamaForCausalLM from scratch on train.txt for ``minutes`` (or ``max_steps``)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(os.path.join(out, "tokenizer"))
    ids = _token_ids(tok, os.path.join(out, "train.txt"))
    data = _windows(ids, seq_len, "train.txt", at_least=batch)
    windows = data.shape[0]
    config = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=2048, rope_theta=10000.0, tie_word_embeddings=tie_embeddings,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
    model = LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    rng = random.Random(seed)
    budget = minutes * 60
    started = time.time()
    step, losses = 0, []
    total = max_steps or 10**9
    model.train()
    while step < total and time.time() - started < budget:
        rows = torch.tensor([rng.randrange(windows) for _ in range(batch)])
        x = data[rows]
        progress = min(1.0, (time.time() - started) / budget) if max_steps is None else step / total
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / 100) * 0.5 * (1 + math.cos(math.pi * progress))
        loss = _next_token_loss(model, x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        step += 1
        if step % 50 == 0:
            print(f"target step {step}: loss {sum(losses[-50:]) / len(losses[-50:]):.3f} "
                  f"({time.time() - started:.0f} s)", file=sys.stderr, flush=True)
    model.eval()
    path = os.path.join(out, "target")
    model.to(torch.bfloat16).save_pretrained(path)
    tok.save_pretrained(path)
    summary = {"steps": step, "seconds": time.time() - started, "final_loss": sum(losses[-50:]) / max(1, len(losses[-50:])),
               "parameters": sum(p.numel() for p in model.parameters()), "tokens_seen": step * batch * seq_len,
               "train_tokens": int(ids.numel())}
    with open(os.path.join(out, "target_training.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


def evaluate_target(out: str, seq_len: int = 256, batch: int = 16) -> Dict[str, object]:
    """The target's loss and perplexity on the held-out modules (eval.txt), as OUT/target_eval.json."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = os.path.join(out, "target")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    data = _windows(_token_ids(tok, os.path.join(out, "eval.txt")), seq_len, "eval.txt")
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, data.shape[0], batch):
            x = data[i:i + batch]
            total += float(_next_token_loss(model, x, reduction="sum"))
            count += x[:, 1:].numel()
    result = {"held_out_tokens": count, "held_out_loss": total / count, "held_out_perplexity": math.exp(total / count)}
    with open(os.path.join(out, "target_eval.json"), "w") as f:
        json.dump(result, f, indent=1)
    return result


def self_generate(out: str, count: int = 1536, prefix_tokens: int = 64, new_tokens: int = 256, batch: int = 32,
                  seed: int = 0) -> Dict[str, object]:
    """Greedy continuations by the target of random prefixes of train.txt, as OUT/generated.jsonl.

    The draft meets the target's own greedy text at inference; training on some of it (next to
    the corpus) puts the draft's inputs and the target's labels on that distribution."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if min(count, prefix_tokens, new_tokens, batch) < 1:
        raise ValueError(f"count, prefix_tokens, new_tokens and batch must be positive, got {count}, "
                         f"{prefix_tokens}, {new_tokens}, {batch}")
    path = os.path.join(out, "target")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    ids = _token_ids(tok, os.path.join(out, "train.txt"))
    if ids.numel() <= prefix_tokens:
        raise ValueError(f"train.txt has {ids.numel()} tokens, not more than one prefix of {prefix_tokens}")
    rng = random.Random(seed)
    starts = [rng.randrange(ids.numel() - prefix_tokens) for _ in range(count)]
    started = time.time()
    written = 0
    with open(os.path.join(out, "generated.jsonl"), "w") as f, torch.no_grad():
        for i in range(0, count, batch):
            prefixes = torch.stack([ids[s:s + prefix_tokens] for s in starts[i:i + batch]])
            seqs = model.generate(input_ids=prefixes, attention_mask=torch.ones_like(prefixes), do_sample=False,
                                  max_new_tokens=new_tokens, pad_token_id=tok.pad_token_id)
            for row in seqs.tolist():
                f.write(json.dumps({"text": tok.decode(row, skip_special_tokens=True)}) + "\n")
                written += 1
            print(f"generated {written}/{count} ({time.time() - started:.0f} s)", file=sys.stderr, flush=True)
    return {"sequences": written, "tokens": written * (prefix_tokens + new_tokens), "seconds": time.time() - started}


def make_prompts(out: str, count: int = 48, seed: int = 0) -> str:
    """Benchmark prompts from the held-out modules: the first lines of functions and classes."""
    with open(os.path.join(out, "eval.txt"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(("def ", "class ")) and line.rstrip().endswith(":")]
    rng = random.Random(seed)
    rng.shuffle(starts)
    # In shuffled order, so that the first N prompts are a random sample of the set.
    prompts = ["\n".join(lines[i:i + 3]) + "\n" for i in starts[:count]]
    if not prompts:
        raise ValueError("the held-out modules have no top-level def or class to prompt with")
    path = os.path.join(out, "eval_prompts.jsonl")
    with open(path, "w") as f:
        for p in prompts:
            f.write(json.dumps({"prompt": p}) + "\n")
    return path


def install(out: str, package_dir: str | None = None) -> Dict[str, int]:
    """Copies OUT/target and the prompts into the package's models/ and writes OUT/draft there in
    bfloat16 (training keeps fp32 master weights; bf16 halves what ships). Returns bytes per file."""
    dest = package_dir or os.path.dirname(os.path.abspath(__file__))
    for name in ("target", "draft"):
        if os.path.exists(os.path.join(dest, name)):
            shutil.rmtree(os.path.join(dest, name))
    shutil.copytree(os.path.join(out, "target"), os.path.join(dest, "target"))
    draft = Eagle3DraftModel.from_pretrained(os.path.join(out, "draft"))
    draft.to(torch.bfloat16).save_pretrained(os.path.join(dest, "draft"))
    shutil.copy(os.path.join(out, "eval_prompts.jsonl"), os.path.join(dest, "eval_prompts.jsonl"))
    # The record of how the pair was made: the corpus manifest and both training logs.
    record = os.path.join(dest, "recipe")
    os.makedirs(record, exist_ok=True)
    for src, name in (("corpus.json", "corpus.json"), ("target_training.json", "target_training.json"),
                      ("target_eval.json", "target_eval.json"),
                      (os.path.join("draft", "metrics.json"), "draft_training.json")):
        if os.path.exists(os.path.join(out, src)):
            shutil.copy(os.path.join(out, src), os.path.join(record, name))
    sizes = {}
    for root, _, names in os.walk(dest):
        for n in names:
            if n.endswith((".safetensors", ".json", ".jsonl")):
                full = os.path.join(root, n)
                sizes[os.path.relpath(full, dest)] = os.path.getsize(full)
    return sizes


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", choices=["corpus", "tokenizer", "target", "evaluate", "generate", "prompts",
                                        "install"])
    p.add_argument("--out", required=True)
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--max-steps", type=int)
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=960)
    p.add_argument("--untied", action="store_true", help="a separate lm_head (default: tied to the embedding, to fit the size cap)")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--count", type=int, help="prompts (default 48) or generated sequences (default 1536)")
    p.add_argument("--new-tokens", type=int, default=256, help="generate: tokens per continuation")
    p.add_argument("--stdlib", help="source directory (default: this interpreter's standard library)")
    args = p.parse_args(argv)
    if args.step == "corpus":
        m = collect_corpus(args.out, args.stdlib)
        print(f"train: {m['train_files']} files, {m['train_bytes']} bytes; eval: {m['eval_files']} files")
    elif args.step == "tokenizer":
        print(train_tokenizer(args.out, args.vocab_size))
    elif args.step == "target":
        print(json.dumps(train_target(args.out, args.minutes, args.hidden, args.layers, args.heads, args.kv_heads,
                                      args.intermediate, args.seq_len, args.batch, max_steps=args.max_steps,
                                      tie_embeddings=not args.untied)))
    elif args.step == "evaluate":
        print(json.dumps(evaluate_target(args.out)))
    elif args.step == "generate":
        print(json.dumps(self_generate(args.out, args.count or 1536, new_tokens=args.new_tokens)))
    elif args.step == "prompts":
        print(make_prompts(args.out, args.count or 48))
    else:
        sizes = install(args.out)
        weights = sum(v for k, v in sizes.items() if k.endswith(".safetensors"))
        print(json.dumps({"files": sizes, "weights_bytes": weights}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
