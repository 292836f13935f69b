"""SpeculativeGenerator: EAGLE-3 speculative decoding around any Hugging Face causal LM.

One round, per the module layout of this package: capture (hooks on the target) -> fc
(``draft.project_aux``) -> draft tree (``drafting``) -> verify (``target.TargetRunner.verify``
and ``tree.verify_greedy`` / ``verify_sampling``) -> accept -> compact (``TargetRunner.commit``
and the draft cache's ``keep``). Greedy output is token-identical to the target's own greedy
decoding; sampling emits tokens with exactly the target's (filtered) distribution.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Union

import torch

from ..distributed import tp
from ..draft import Eagle3DraftModel, fingerprint
from ..draft.aux_layers import describe_fix
from ..tree import verify_greedy, verify_sampling
from .architecture import check_served
from .capture import AuxHiddenCapture
from .config import SamplingConfig, TreeConfig, filtered_probs
from .drafting import DraftInputs, build_tree, draft_steps, extend
from .stats import GenerationStats
from .target import TargetRunner

logger = logging.getLogger(__name__)


class CaptureMismatchError(ValueError):
    """The captured target states do not match the draft's activation fingerprint."""


@dataclass
class GenerationOutput:
    """sequences[b]: the new tokens of request b (prompt excluded); text[b] when a tokenizer is
    known; stats over the whole call."""

    sequences: List[List[int]]
    stats: GenerationStats
    text: Optional[List[str]] = None
    finish_reasons: List[str] = field(default_factory=list)


class SpeculativeGenerator:
    """Wraps ``target`` (a transformers AutoModelForCausalLM) with an EAGLE-3 ``draft``.

    Args:
        target: the model to accelerate; its outputs are what ``generate`` returns.
        draft: an Eagle3DraftModel trained for this target (validated here, before any token).
        tree: the draft tree per round; ``TreeConfig.chain(d)`` drafts a chain of d tokens.
        tokenizer: needed for string prompts, stop strings and text output.
        attention: "tree" runs the verify forward through eagle3.tree_attention (the
            "eagle3_tree" attention implementation); "sdpa" keeps the model's own attention and
            passes a 4D mask.
        check_ranks: under tensor parallelism, verify after each call that every rank produced
            the same tokens (an all-gather; default: the EAGLE3_CHECK_RANKS environment variable).
        strict: the capture guard. When the draft carries an activation fingerprint, the first
            ``generate`` runs the fingerprint's probe through the target and compares the
            captured states with it before any draft step; a mismatch (a capture of other layers
            than the draft was trained on, or another target) raises ``CaptureMismatchError``.
            ``strict=False`` turns that into a warning.
    """

    def __init__(self, target, draft: Eagle3DraftModel, tree: TreeConfig = TreeConfig(), tokenizer=None,
                 attention: str = "tree", check_ranks: Optional[bool] = None, strict: bool = True):
        if attention not in ("tree", "sdpa"):
            raise ValueError(f"attention must be 'tree' or 'sdpa', got {attention!r}")
        check_served(target.config)
        self.target = target.eval()
        self.draft = draft.eval()
        self.tree = tree
        self.tokenizer = tokenizer
        draft.validate_against_target(target.config)
        target_device = target.get_input_embeddings().weight.device
        if draft.fc.weight.device != target_device:
            raise ValueError(f"the draft is on {draft.fc.weight.device} but the target on {target_device}")
        draft.bind_embeddings(target.get_input_embeddings())
        self.capture = AuxHiddenCapture(target, draft.aux_layer_ids)
        self.use_tree_attention = attention == "tree"
        self._ensure_tree_attention()
        self.max_positions = int(getattr(target.config, "max_position_embeddings", 1 << 30))
        self.check_ranks = (os.environ.get("EAGLE3_CHECK_RANKS", "0") == "1") if check_ranks is None else check_ranks
        self.strict = strict
        self.capture_check: Optional[fingerprint.CaptureCheck] = None  # the guard's result, once it ran

    # --- inputs ----------------------------------------------------------------------------
    def _prompt_ids(self, prompts) -> List[List[int]]:
        if isinstance(prompts, torch.Tensor):
            if prompts.dim() == 1:
                prompts = prompts[None]
            if prompts.dim() != 2:
                raise ValueError(f"input_ids must be [B, L] or [L], got shape {list(prompts.shape)}")
            return [row.tolist() for row in prompts]
        if isinstance(prompts, str):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise ValueError("prompts must be a string, a non-empty list of strings or token lists, or a tensor")
        out = []
        for p in prompts:
            if isinstance(p, str):
                if self.tokenizer is None:
                    raise ValueError("string prompts need a tokenizer: SpeculativeGenerator(..., tokenizer=...)")
                out.append(self.tokenizer(p)["input_ids"])
            else:
                out.append([int(t) for t in p])
        return out

    def _check_prompts(self, ids: List[List[int]], max_new_tokens: int) -> None:
        vocab = self.target.config.vocab_size
        for b, p in enumerate(ids):
            if not p:
                raise ValueError(f"prompt {b} is empty; give at least one token")
            if max(p) >= vocab or min(p) < 0:
                raise ValueError(f"prompt {b} has token ids outside the target vocabulary [0, {vocab})")
            if len(p) >= self.max_positions:
                raise ValueError(f"prompt {b} has {len(p)} tokens, longer than the target's context "
                                 f"({self.max_positions} positions)")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")

    # --- generation ------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: Union[str, Sequence, torch.Tensor], max_new_tokens: int = 64,
                 temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                 eos_token_id: Union[None, int, Sequence[int]] = None, stop: Optional[Sequence[str]] = None,
                 streamer=None, seed: Optional[int] = None) -> GenerationOutput:
        """Generates up to ``max_new_tokens`` per prompt.

        ``prompts``: a string, a list of strings or token-id lists, or input_ids [B, L].
        ``eos_token_id`` defaults to the target's generation config; ``stop`` strings end a
        request after the token that completes one (needs a tokenizer). ``streamer`` gets
        ``put`` / ``end`` calls like Hugging Face streamers (batch 1).
        """
        sampling = SamplingConfig(temperature, top_p, top_k)
        self._ensure_tree_attention()
        ids = self._prompt_ids(prompts)
        self._check_prompts(ids, max_new_tokens)
        if stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer")
        if streamer is not None and len(ids) != 1:
            raise ValueError("a streamer takes one request; got a batch of %d" % len(ids))
        eos = self._eos_ids(eos_token_id)
        device = self.target.get_input_embeddings().weight.device
        gen = torch.Generator(device=device)
        gen.manual_seed(tp.shared_seed(seed))  # one seed on every tensor-parallel rank

        b = len(ids)
        longest = max(len(p) for p in ids)
        pad = self.target.config.pad_token_id or 0
        input_ids = torch.full((b, longest), pad, dtype=torch.long, device=device)
        attention_mask = torch.zeros(b, longest, dtype=torch.long, device=device)
        for i, p in enumerate(ids):
            input_ids[i, longest - len(p):] = torch.tensor(p, device=device)
            attention_mask[i, longest - len(p):] = 1
        if streamer is not None:
            streamer.put(input_ids[0].cpu())

        stats = GenerationStats(depth_accepted=[0] * self.tree.depth)
        started = time.perf_counter()
        stats.guard_time_s = self._guard_capture()
        runner = TargetRunner(self.target, self.capture, self.use_tree_attention)
        out = runner.prefill(input_ids, attention_mask)
        stats.target_forwards += 1
        self._check_capture_width(out.aux_hidden)
        roots = self._select(out.logits[:, -1], sampling, gen)                      # [B]
        emitted: List[List[int]] = [[int(t)] for t in roots.tolist()]
        # Pairs (feature j, token j + 1) of the prompt, left-aligned per request; the last real
        # pair is (last prompt feature, root).
        lengths = attention_mask.sum(-1)
        features = self.draft.project_aux(out.aux_hidden)
        next_tokens = torch.cat([input_ids[:, 1:], roots[:, None]], dim=1)
        start = longest - lengths
        cols = (start[:, None] + torch.arange(longest, device=device)).clamp(max=longest - 1)
        inputs = DraftInputs(
            features=torch.gather(features, 1, cols[..., None].expand(b, longest, features.shape[-1])),
            tokens=torch.gather(next_tokens, 1, cols), positions=torch.arange(longest, device=device).expand(b, longest),
            counts=lengths)
        capacity = longest + max_new_tokens + 2 * (self.tree.depth + 1) + self.tree.depth * self.tree.topk + 8
        dcache = self.draft.new_cache(b, capacity, device=device)

        finished = [False] * b
        reasons = [""] * b
        self._finish(emitted, finished, reasons, eos, stop, max_new_tokens)
        if streamer is not None:
            streamer.put(torch.tensor(emitted[0]))
        active = list(range(b))  # request index of each batch row; finished requests leave the batch
        while True:
            keep = [row for row, i in enumerate(active) if not finished[i]]
            if not keep:
                break
            if len(keep) < len(active):
                rows_kept = torch.tensor(keep, device=device)
                runner.select_rows(rows_kept)
                dcache.select_rows(rows_kept)
                inputs = DraftInputs(*(x.index_select(0, rows_kept) for x in
                                       (inputs.features, inputs.tokens, inputs.positions, inputs.counts)))
                roots = roots.index_select(0, rows_kept)
                active = [active[row] for row in keep]
            nb = len(active)
            t0 = time.perf_counter()
            root_logits, root_hidden = extend(self.draft, dcache, inputs)
            steps = draft_steps(self.draft, dcache, root_logits, root_hidden, runner.seq_lens, self.tree)
            dcache.rollback()
            t1 = time.perf_counter()
            tree = build_tree(roots, runner.seq_lens, steps, self.tree)
            t2 = time.perf_counter()
            vout = runner.verify(tree)
            t3 = time.perf_counter()
            if sampling.greedy:
                result = verify_greedy(tree, vout.logits.argmax(-1))
            else:
                result = verify_sampling(tree, filtered_probs(vout.logits, sampling), generator=gen)
            t4 = time.perf_counter()
            n = tree.num_draft_tokens
            rows = torch.arange(nb, device=device)[:, None]
            accept_local = torch.where(result.accept_index >= 0, result.accept_index - rows * n, -1).long()
            counts = result.accept_length.long() + 1
            runner.commit(accept_local, counts)
            stats.target_forwards += 1
            stats.rounds += 1
            stats.draft_time_s += t1 - t0
            stats.tree_build_time_s += t2 - t1
            stats.verify_time_s += t3 - t2
            stats.accept_time_s += t4 - t3

            m = int(counts.max())
            picked = accept_local[:, :m].clamp(min=0)
            node_features = [torch.gather(a, 1, picked[..., None].expand(nb, m, a.shape[-1])) for a in vout.aux_hidden]
            tokens = torch.zeros(nb, m, dtype=torch.long, device=device)
            for row, acc in enumerate(result.accepted_tokens):
                i = active[row]
                tokens[row, :len(acc)] = torch.tensor(acc, device=device)
                before = len(emitted[i])
                emitted[i].extend(acc)
                stats.request_rounds += 1
                stats.accepted_drafts += len(acc) - 1
                for d in range(len(acc) - 1):
                    stats.depth_accepted[d] += 1
                self._finish(emitted, finished, reasons, eos, stop, max_new_tokens, only=i, checked=before)
                if streamer is not None and len(emitted[i]) > before:
                    streamer.put(torch.tensor(emitted[i][before:]))
            positions = (runner.seq_lens - counts)[:, None] + torch.arange(m, device=device)
            inputs = DraftInputs(self.draft.project_aux(node_features), tokens, positions, counts)
            roots = tokens[torch.arange(nb, device=device), counts - 1]
            stats.compact_time_s += time.perf_counter() - t4
        if streamer is not None:
            streamer.end()
        if self.check_ranks:
            tp.check_ranks_agree(emitted)
        stats.total_time_s = time.perf_counter() - started
        stats.new_tokens = sum(len(e) for e in emitted)
        text = None
        if self.tokenizer is not None:
            text = [self.tokenizer.decode(e, skip_special_tokens=True) for e in emitted]
        return GenerationOutput(sequences=emitted, stats=stats, text=text, finish_reasons=reasons)

    @property
    def attention_path(self) -> str:
        """Which attention verifies: "tree" (eagle3.tree_attention) or "sdpa" (the model's own)."""
        return "tree" if self.use_tree_attention else "sdpa"

    def _ensure_tree_attention(self) -> None:
        # Anything may switch the target's attention back (a plain target.generate with SDPA,
        # user code); under SDPA the tree keywords would be ignored and every tree token would
        # see all earlier ones. So it is checked on every call, not only at construction.
        if not self.use_tree_attention:
            return
        from .. import hf_attention
        if getattr(self.target.config, "_attn_implementation", None) != hf_attention.ATTENTION_NAME:
            self.target.set_attn_implementation(hf_attention.register())

    def _guard_capture(self) -> float:
        """The capture guard (see ``strict``); returns the seconds it took (0 after the first call)."""
        fp = self.draft.config.fingerprint
        if fp is None or self.capture_check is not None:
            return 0.0
        self.capture_check = fingerprint.check(fp, self.target, self.draft.aux_layer_ids)
        if not self.capture_check.ok:
            message = f"capture check failed: {self.capture_check.describe()}"
            if self.capture_check.problem is None and None not in self.capture_check.looks_like:
                message += f". To read the trained layers, {describe_fix(self.capture_check.trained_ids)}"
            message += "; or pass strict=False (eagle3 generate --no-strict-capture) to run anyway"
            if self.strict:
                raise CaptureMismatchError(message)
            logger.warning(message)
        return self.capture_check.time_s

    def _check_capture_width(self, aux_hidden: List[torch.Tensor]) -> None:
        hidden = self.draft.config.target_hidden_size
        for index, state in zip(self.draft.aux_layer_ids, aux_hidden):
            if state.shape[-1] != hidden:
                raise ValueError(
                    f"the captured hidden state of layer index {index} has width {state.shape[-1]} but the target's "
                    f"hidden size is {hidden}: a sharded capture (a tensor-parallel layer output taken before its "
                    "all-reduce) cannot feed the draft")

    def _eos_ids(self, eos_token_id) -> List[int]:
        if eos_token_id is None:
            eos_token_id = getattr(getattr(self.target, "generation_config", None), "eos_token_id", None)
        if eos_token_id is None:
            return []
        return [int(eos_token_id)] if isinstance(eos_token_id, int) else [int(t) for t in eos_token_id]

    def _select(self, logits: torch.Tensor, sampling: SamplingConfig, gen: torch.Generator) -> torch.Tensor:
        if sampling.greedy:
            return logits.argmax(-1)
        return torch.multinomial(filtered_probs(logits, sampling), 1, generator=gen)[:, 0]

    def _finish(self, emitted, finished, reasons, eos, stop, max_new_tokens, only=None, checked=0) -> None:
        """Truncates request outputs at EOS, a stop string or max_new_tokens and marks them done;
        tokens before index ``checked`` were looked at in an earlier round."""
        for i in range(len(emitted)) if only is None else [only]:
            if finished[i]:
                continue
            seq = emitted[i]
            for j in range(checked, len(seq)):
                if seq[j] in eos:
                    del seq[j + 1:]
                    finished[i], reasons[i] = True, "eos"
                    break
            if not finished[i] and stop:
                for j in range(max(1, checked + 1), len(seq) + 1):
                    text = self.tokenizer.decode(seq[:j])
                    if any(s in text for s in stop):
                        del seq[j:]
                        finished[i], reasons[i] = True, "stop"
                        break
            if len(seq) >= max_new_tokens:
                del seq[max_new_tokens:]
                if not finished[i]:
                    finished[i], reasons[i] = True, "length"
