"""Tiny Hugging Face targets made in the tests: random Llama-family models with a byte-level
BPE tokenizer trained on a few lines, saved to a directory like a real checkpoint."""

from __future__ import annotations

import os
import random

import torch

CORPUS_WORDS = ("def class return import for while if else elif try except with as lambda yield self "
                "print range len list dict set tuple None True False value key item index count total").split()


def corpus(lines: int = 400, seed: int = 0) -> str:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        n = rng.randint(4, 12)
        out.append(" ".join(rng.choice(CORPUS_WORDS) for _ in range(n)))
    return "\n".join(out) + "\n"


def make_tokenizer(text: str, vocab_size: int = 320):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(text.splitlines(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    fast.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}<eos>{% endfor %}")
    return fast


# Per-architecture settings of the tiny targets: a sliding window of 16 positions wherever the
# architecture has one (so that prompts + generations run past it), Gemma 2's soft-cap, small
# MoE and MLA shapes. Everything else comes from make_target.
ARCH_SETTINGS = {
    "llama": {}, "qwen2": {}, "olmo2": {}, "granite": {}, "phi3": {},
    "mistral": dict(sliding_window=16),
    "qwen3": dict(head_dim=16),
    "qwen3_moe": dict(head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
    "gemma": dict(head_dim=16),
    "gemma2": dict(head_dim=16, sliding_window=16, attn_logit_softcapping=20.0, final_logit_softcapping=None),
    "gemma3_text": dict(head_dim=16, sliding_window=16),
    "cohere2": dict(sliding_window=16, logit_scale=1.0),  # (its default 1/16 flattens the tiny target)
    "exaone4": dict(sliding_window=16, sliding_window_pattern=2),
    "gpt_oss": dict(head_dim=16, sliding_window=16, num_local_experts=4, num_experts_per_tok=2),
    "deepseek_v3": dict(num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16,
                        qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2,
                        moe_intermediate_size=32, first_k_dense_replace=1, n_group=1, topk_group=1),
}


def make_target(path: str, arch: str = "llama", layers: int = 6, hidden: int = 64, seed: int = 0,
                peaky: float = 8.0, text: str | None = None, residual_scale: float = 1.0):
    """Saves a random target of architecture ``arch`` (a key of ARCH_SETTINGS) and its tokenizer
    to ``path``; returns (model, tokenizer).

    ``residual_scale`` > 1 makes every layer change the residual stream more, so that the
    hidden states of neighbouring layers differ the way a trained model's do; < 1 makes the
    next token depend mostly on the current one (the context still moves it), which a draft
    learns in a few dozen steps, as a trained target's draft does."""
    import transformers

    tokenizer = make_tokenizer(text or corpus())
    # Room past the tokenizer, as real checkpoints have (some tokenizer classes add tokens).
    vocab = len(tokenizer) + 16
    settings = dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=512,
                    pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                    tie_word_embeddings=False)
    settings.update(ARCH_SETTINGS[arch])
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(arch, **settings)).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(peaky)  # sharp next-token distributions, like a trained model
        if residual_scale != 1.0:
            for name, p in model.named_parameters():
                if name.endswith(("o_proj.weight", "down_proj.weight", "down_proj")):
                    p.mul_(residual_scale)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model, tokenizer


def self_generated_jsonl(target, tokenizer, prompts: int = 96, new_tokens: int = 48) -> str:
    """JSONL of token ids: corpus lines continued greedily by the target itself, what a draft
    meets at inference (the bundled recipe trains on such text too). Token ids, not text: a
    random target emits ids whose decoded bytes would not tokenize back to them."""
    import json
    lines = corpus(prompts, seed=3).splitlines()
    enc = tokenizer(lines, return_tensors="pt", padding=True, padding_side="left")
    with torch.no_grad():
        out = target.generate(**enc, max_new_tokens=new_tokens, do_sample=False, eos_token_id=None,
                              pad_token_id=tokenizer.pad_token_id)
    rows = [row[mask.bool()].tolist() + gen.tolist() for row, mask, gen in
            zip(enc["input_ids"], enc["attention_mask"], out[:, enc["input_ids"].shape[1]:])]
    return "".join(json.dumps({"input_ids": r}) + "\n" for r in rows)


def make_training_inputs(workdir, layers: int = 4, lines: int = 300, seed: int = 3):
    """A tiny target in ``workdir/target`` and corpus text in ``workdir/data.txt``; returns
    ``workdir``."""
    make_target(os.path.join(str(workdir), "target"), layers=layers)
    with open(os.path.join(str(workdir), "data.txt"), "w") as f:
        f.write(corpus(lines, seed=seed))
    return workdir


def make_trained_pair(workdir, arch: str = "llama", layers: int = 6, steps: int = 40, self_generated: bool = False,
                      residual_scale: float = 1.0, **train_options):
    """A tiny target in ``workdir/target`` and an EAGLE-3 draft trained on it for ``steps`` steps
    in ``workdir/draft`` (acceptance clearly above 1), on corpus text or on the target's own
    continuations (``self_generated``); returns the target model and tokenizer."""
    from eagle3_ext.train import TrainConfig, train

    target, tok = make_target(os.path.join(workdir, "target"), arch=arch, layers=layers,
                              residual_scale=residual_scale)
    data = os.path.join(workdir, "data.jsonl" if self_generated else "data.txt")
    with open(data, "w") as f:
        f.write(self_generated_jsonl(target, tok) if self_generated else corpus(300, seed=1))
    options = dict(ttt_steps=3, epochs=10, lr=1e-2, warmup_steps=5, batch_tokens=512, max_len=64, eval_every=1000,
                   progress=False, max_steps=steps, export_specforge=False)
    options.update(train_options)
    train(TrainConfig(target=os.path.join(workdir, "target"), data=[data], out=os.path.join(workdir, "draft"),
                      **options))
    return target, tok


def loaded_trained_pair(workdir, **options):
    """``make_trained_pair(workdir, **options)`` with its draft loaded: (target, tokenizer, draft)."""
    from eagle3_ext import Eagle3DraftModel

    target, tok = make_trained_pair(workdir, **options)
    return target, tok, Eagle3DraftModel.from_pretrained(os.path.join(workdir, "draft"), target_config=target.config)


# --- random EAGLE-3 drafts (no target needed) ------------------------------------------------------

H, VOCAB, DRAFT_VOCAB = 64, 96, 48


def make_config(**over):
    from eagle3_ext import Eagle3DraftConfig

    cfg = dict(hidden_size=H, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
               vocab_size=VOCAB, draft_vocab_size=DRAFT_VOCAB, rope_theta=500000.0,
               rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
               aux_layer_ids=[2, 16, 29], aux_layer_ids_source="test", target_num_hidden_layers=32)
    cfg.update(over)
    return Eagle3DraftConfig(**cfg)


def make_draft(seed=0, **over):
    """A draft with random weights (norm weights near 1), a valid vocabulary map (draft id i is
    target id 2 i) and a random bound embedding."""
    from eagle3_ext import Eagle3DraftModel

    torch.manual_seed(seed)
    model = Eagle3DraftModel(make_config(**over))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.05 + (1.0 if p.dim() == 1 else 0.0))
        model.d2t.copy_(torch.arange(DRAFT_VOCAB))            # target id = 2 i
        model.t2d.zero_()
        model.t2d[torch.arange(DRAFT_VOCAB) * 2] = True
    model.bind_embeddings(torch.nn.Embedding(VOCAB, H))
    return model
