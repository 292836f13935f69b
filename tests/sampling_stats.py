"""Statistics for the losslessness tests of speculative sampling: a tiny 8-token target with a
related draft, the exact joint distribution of short continuations by enumeration, sampled
counts, and Pearson's chi-square against the exact distribution."""

import torch

from eagle3_ext import Eagle3DraftModel
from eagle3_ext.api import SpeculativeGenerator, TreeConfig
from eagle3_ext.train.trainer import draft_config_for

VOCAB = 8


def make_small_vocab_pair():
    import transformers

    torch.manual_seed(3)
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64,
                                   tie_word_embeddings=False)
    target = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(4.0)
    draft = Eagle3DraftModel(draft_config_for(cfg, [1, 2, 3], VOCAB))
    with torch.no_grad():
        draft.t2d[:] = True
        draft.lm_head.weight.copy_(target.lm_head.weight * 0.5)  # related but different proposals
    return target, draft


def exact_joint(target, prompt, length, temperature, processor=None):
    """P(t1..t_length | prompt) for every sequence, by enumeration; ``processor`` (a Hugging
    Face logits processor) is applied to each step's logits before the temperature, as
    Hugging Face's generate orders them."""
    probs = {(): 1.0}
    for _ in range(length):
        seqs = list(probs)
        ids = torch.tensor([prompt + list(s) for s in seqs])
        with torch.no_grad():
            logits = target(ids).logits[:, -1].float()
            if processor is not None:
                logits = processor(ids, logits)
            p = (logits / temperature).softmax(-1)
        probs = {s + (v,): probs[s] * float(p[i, v]) for i, s in enumerate(seqs) for v in range(VOCAB)}
    return probs


def sample_joint(target, draft, prompt, length, temperature, trials, batch=2500, seed=0, tree=None, compile=False,
                 **generate_kwargs):
    tree = TreeConfig(depth=3, topk=2, num_draft_tokens=6) if tree is None else tree
    gen = SpeculativeGenerator(target, draft, tree, attention="tree" if compile else "sdpa", compile=compile)
    counts = {}
    for i in range(trials // batch):
        out = gen.generate([prompt] * batch, max_new_tokens=length, do_sample=True, temperature=temperature,
                           top_k=0, eos_token_id=[], seed=seed + i, return_dict_in_generate=True, **generate_kwargs)
        for s in out.new_tokens:
            counts[tuple(s)] = counts.get(tuple(s), 0) + 1
    return counts


def chi_square(counts, probs, trials, min_expected=20):
    """Pearson statistic and degrees of freedom over cells with enough expected mass (the rest
    pooled into one cell)."""
    stat, dof, pooled_obs, pooled_exp = 0.0, -1, 0, 0.0
    for seq, p in probs.items():
        exp = p * trials
        obs = counts.get(seq, 0)
        if exp >= min_expected:
            stat += (obs - exp) ** 2 / exp
            dof += 1
        else:
            pooled_obs += obs
            pooled_exp += exp
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        dof += 1
    return stat, dof


def chi_square_bound(dof):
    # Upper 1e-4 quantile of chi-square(dof), Wilson-Hilferty approximation.
    z = 3.719
    return dof * (1 - 2 / (9 * dof) + z * (2 / (9 * dof)) ** 0.5) ** 3
