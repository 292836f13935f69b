"""The requests of one ``generate`` call and the steps that advance them: ``prefill``, then
``round`` until every request is done, each ending in ``emit``.

One round, per the module layout of this package: capture (hooks on the target) -> fc
(``draft.project_aux``) -> draft tree (``drafting``, plus the lookup chains of ``lookup``
grafted on) -> verify (``TargetRunner.verify``, the
logits processors at every node, ``tree.verify_greedy`` / ``verify_sampling``; sampling also
measures the round's ``acceptance_bound``) -> accept ->
compact (``TargetRunner.commit`` and the draft cache's ``keep``). Finished requests leave the
batch; the rest keep their rows, ``active[row]`` naming the request of each row (compiled rounds
shrink the batch to powers of two only, filling the rows left over with ``mirror`` copies).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch

from ..tree import DraftTree, graft_chains, verify_greedy, verify_sampling, verify_sampling_draft_probs
from .acceptance_bound import acceptance_bound
from .config import filtered_probs
from .drafting import DraftInputs, DraftSampler, build_tree, candidate_scores, draft_steps, extend_eager
from .lookup import NgramLookup, draft_nodes_to_keep
from .processors import process_next, process_tree
from .settings import GenerateSettings
from .stats import GenerationStats
from .stopping import StopRule
from .compiled_verify import node_buckets, static_capacity
from .target import TargetRunner


@dataclass
class Request:
    prompt: List[int]
    rule: StopRule
    new: List[int] = field(default_factory=list)
    reason: str = ""
    checked: int = 0          # new tokens already looked at by the stop rule
    lookup: Optional[NgramLookup] = None   # hybrid drafting's n-gram index over prompt + new

    @property
    def finished(self) -> bool:
        return bool(self.reason)


class Batch:
    """Per-request state (``requests``) and per-row state of the requests still running
    (``active``, ``roots``, ``inputs``, the two KV caches)."""

    def __init__(self, generator, prompts: List[List[int]], settings: GenerateSettings, rng: torch.Generator,
                 echo: Optional[torch.Tensor] = None):
        """``echo`` [B, L]: the prompts as they appear in the output (what stopping criteria see
        before the new tokens); default, the prompts themselves."""
        self.gen = generator
        self.settings = settings
        self.rng = rng
        self.device = generator.target.get_input_embeddings().weight.device
        criteria = settings.stopping_criteria
        prefixes = ([None] * len(prompts) if criteria is None else
                    [torch.tensor(p, device=self.device) if echo is None else echo[i].to(self.device)
                     for i, p in enumerate(prompts)])
        self.requests = [Request(p, StopRule(settings.new_tokens_for(len(p)), settings.eos_token_ids,
                                             settings.stop_strings, settings.tokenizer, criteria, prefix))
                         for p, prefix in zip(prompts, prefixes)]
        self.active = list(range(len(prompts)))
        # Compiled rounds shrink the batch to powers of two only: rows left over hold copies of
        # running requests (mirrors), whose outputs are dropped (see _drop_finished).
        self.mirror = [False] * len(prompts)
        self.mirror_rows: Optional[torch.Tensor] = None  # self.mirror as a bool tensor, while any row is one
        tree = generator.tree
        if tree.lookup_tokens:
            for r in self.requests:
                r.lookup = NgramLookup(tree.lookup_ngram, tree.lookup_tokens)
                r.lookup.tokens.extend(r.prompt)
        self.stats = GenerationStats(depth_accepted=[0] * generator.tree.depth)
        capacity, compiled_verify = 0, None
        if generator.compiled is not None:
            capacity = static_capacity(max(len(p) for p in prompts), max(r.rule.limit for r in self.requests),
                                       tree.num_draft_tokens)
            compiled_verify = generator.compiled.verify
        self.runner = TargetRunner(generator.target, generator.capture, generator.use_tree_attention,
                                   compiled_verify, capacity, node_buckets(tree.num_draft_tokens, tree.lookup_tokens))
        self.roots: Optional[torch.Tensor] = None
        self.inputs: Optional[DraftInputs] = None
        self.dcache = None

    @property
    def done(self) -> bool:
        return all(r.finished for r in self.requests)

    # --- steps --------------------------------------------------------------------------------
    def prefill(self) -> None:
        """The target over the prompts (left-padded), the first new token of every request and
        the draft's inputs for the prompt pairs."""
        prompts = [r.prompt for r in self.requests]
        b, longest = len(prompts), max(len(p) for p in prompts)
        input_ids = torch.full((b, longest), self.settings.pad_token_id, dtype=torch.long, device=self.device)
        attention_mask = torch.zeros(b, longest, dtype=torch.long, device=self.device)
        for i, p in enumerate(prompts):
            input_ids[i, longest - len(p):] = torch.tensor(p, device=self.device)
            attention_mask[i, longest - len(p):] = 1
        out = self.runner.prefill(input_ids, attention_mask)
        self.stats.target_forwards += 1
        self.gen._check_capture_width(out.aux_hidden)
        scores = process_next(out.logits[:, -1], prompts, self.settings.logits_processor, self.settings.min_new_tokens,
                              [0] * b, self.settings.eos_token_ids)
        roots = self._select(scores)                                                       # [B]
        # Pairs (feature j, token j + 1) of each prompt, left-aligned per request; the last real
        # pair is (last prompt feature, root).
        lengths = attention_mask.sum(-1)
        features = self.gen.draft.project_aux(out.aux_hidden)
        next_tokens = torch.cat([input_ids[:, 1:], roots[:, None]], dim=1)
        cols = ((longest - lengths)[:, None] + torch.arange(longest, device=self.device)).clamp(max=longest - 1)
        self.inputs = DraftInputs(
            features=torch.gather(features, 1, cols[..., None].expand(b, longest, features.shape[-1])),
            tokens=torch.gather(next_tokens, 1, cols),
            positions=torch.arange(longest, device=self.device).expand(b, longest), counts=lengths)
        most_new = max(r.rule.limit for r in self.requests)
        slots = self.gen.draft_cache_slots(longest, most_new)
        if self.gen.compiled is not None:
            self.dcache = self.gen.compiled.draft.new_cache(self.gen.draft, b, slots)
        else:
            self.dcache = self.gen.draft.new_cache(b, slots, device=self.device)
        self.roots = roots
        for i, token in enumerate(roots.tolist()):
            self.emit(i, [int(token)])

    def round(self) -> None:
        """One draft-verify-accept-compact round over the running requests."""
        self._drop_finished()
        gen, stats, nb = self.gen, self.stats, len(self.active)
        t0 = time.perf_counter()
        sampler = None
        if gen.tree.sampled and not self.settings.sampling.greedy:
            sampler = DraftSampler(gen.draft, self.settings.sampling, self.rng, nb, gen.tree.depth)
        if gen.compiled is not None:
            steps = gen.compiled.draft.round(gen.draft, self.dcache, self.inputs, self.runner.seq_lens, gen.tree,
                                             sampler)
        else:
            root_logits, root_hidden = extend_eager(gen.draft, self.dcache, self.inputs)
            steps = draft_steps(gen.draft, self.dcache, root_logits, root_hidden, self.runner.seq_lens, gen.tree,
                                sampler)
        self.dcache.rollback()
        t1 = time.perf_counter()
        tree, placed = self._tree(steps)
        t2 = time.perf_counter()
        vout = self.runner.verify(tree)
        t3 = time.perf_counter()
        n = tree.num_draft_tokens
        scores = self._tree_scores(vout.logits, tree, nb, n)
        if self.settings.sampling.greedy:
            result = verify_greedy(tree, scores.argmax(-1))
            t4 = t5 = time.perf_counter()
        else:
            probs = filtered_probs(scores, self.settings.sampling)
            if sampler is not None:  # drawn tokens: verified with the draft's probabilities
                depths = tree.positions.view(nb, n) - self.runner.seq_lens[:, None]
                result = verify_sampling_draft_probs(tree, probs, sampler.draft_probs(depths, probs.shape[-1]),
                                                     generator=self.rng)
            else:
                result = verify_sampling(tree, probs, generator=self.rng)
            t4 = time.perf_counter()
            # What exact lossless verification keeps in expectation of this tree's tokens taken as
            # fixed: the target-only verifier's figure (a sampled chain's p/q verifier keeps more).
            real = [row for row in range(nb) if not self.mirror[row]]
            stats.add_bound(acceptance_bound(tree, probs).per_depth[real].sum(0).tolist(), len(real))
            t5 = time.perf_counter()
        rows = torch.arange(nb, device=self.device)[:, None]
        accept_local = torch.where(result.accept_index >= 0, result.accept_index - rows * n, -1).long()
        counts = result.accept_length.long() + 1
        if self.mirror_rows is not None:  # a mirror commits one token a round, never outgrowing the row it copies
            counts = torch.where(self.mirror_rows, 1, counts)
        self.runner.commit(accept_local, counts)
        m = int(counts.max())
        picked = accept_local[:, :m].clamp(min=0)
        node_features = [torch.gather(a, 1, picked[..., None].expand(nb, m, a.shape[-1])) for a in vout.aux_hidden]
        tokens = torch.zeros(nb, m, dtype=torch.long, device=self.device)
        for row, accepted in enumerate(result.accepted_tokens):
            if self.mirror[row]:
                tokens[row, 0] = accepted[0]
                continue
            tokens[row, :len(accepted)] = torch.tensor(accepted, device=self.device)
            stats.request_rounds += 1
            stats.accepted_drafts += len(accepted) - 1
            if len(accepted) - 1 > len(stats.depth_accepted):  # a lookup chain reached deeper
                stats.depth_accepted += [0] * (len(accepted) - 1 - len(stats.depth_accepted))
            for d in range(len(accepted) - 1):
                stats.depth_accepted[d] += 1
            if placed is not None and placed[row]:
                stats.lookup_proposed += len(placed[row])
                stats.lookup_accepted += self.requests[self.active[row]].lookup.record(placed[row], accepted)
            self.emit(self.active[row], accepted)
        positions = (self.runner.seq_lens - counts)[:, None] + torch.arange(m, device=self.device)
        self.inputs = DraftInputs(gen.draft.project_aux(node_features), tokens, positions, counts)
        self.roots = tokens[torch.arange(nb, device=self.device), counts - 1]
        stats.target_forwards += 1
        stats.rounds += 1
        stats.draft_time_s += t1 - t0
        stats.tree_build_time_s += t2 - t1
        stats.verify_time_s += t3 - t2
        stats.accept_time_s += t4 - t3
        stats.bound_time_s += t5 - t4
        stats.compact_time_s += time.perf_counter() - t5

    def emit(self, request: int, tokens: List[int]) -> None:
        """Appends a request's newly accepted tokens, up to its first stop (EOS, stop string,
        stopping criterion or length, whichever comes first); streams what was kept."""
        r = self.requests[request]
        if r.finished:
            return
        before = len(r.new)
        r.new.extend(tokens)
        stop = r.rule.scan(r.new, r.checked)
        r.checked = len(r.new)
        if stop is not None:
            keep, r.reason = stop
            del r.new[keep:]
        if r.lookup is not None:
            r.lookup.tokens.extend(r.new[before:])
        if self.settings.streamer is not None and len(r.new) > before:
            self._stream(request, r.new[before:])

    # --- helpers ------------------------------------------------------------------------------
    def _tree(self, steps) -> Tuple[DraftTree, Optional[List[List[int]]]]:
        """The round's tree: the draft's best candidates, and with lookup on, each request's
        lookup chain grafted on, the node budget split between the two by estimated acceptance.
        Returns the tree and the chain placed per row (None without lookup)."""
        cfg, seq_lens = self.gen.tree, self.runner.seq_lens
        budget = cfg.num_draft_tokens - 1
        drafted = min(budget, cfg.draft_candidates)
        lookups = [self.requests[i].lookup for i in self.active]
        chains = [lk.propose() for lk in lookups] if cfg.lookup_tokens else []
        if not any(chains):
            return build_tree(self.roots, seq_lens, steps, drafted + 1), None
        keep = draft_nodes_to_keep(candidate_scores(steps, drafted), [lk.scores(len(c)) for lk, c in
                                                                      zip(lookups, chains)], budget)
        # One tree width for the batch: the draft part as wide as the row that wants most of it,
        # the chains in what is left, so a verify never exceeds num_draft_tokens per row.
        n_draft = max(1, max(keep))
        tree = build_tree(self.roots, seq_lens, steps, n_draft + 1)
        return graft_chains(tree, chains, [budget - n_draft] * len(chains))

    def _select(self, scores: torch.Tensor) -> torch.Tensor:
        sampling = self.settings.sampling
        if sampling.greedy:
            return scores.argmax(-1)
        return torch.multinomial(filtered_probs(scores, sampling), 1, generator=self.rng)[:, 0]

    def _tree_scores(self, logits: torch.Tensor, tree, nb: int, n: int) -> torch.Tensor:
        s = self.settings
        if not s.logits_processor and not s.min_new_tokens:
            return logits
        requests = [self.requests[i] for i in self.active]
        depths = tree.positions.view(nb, n) - self.runner.seq_lens[:, None]
        return process_tree(logits, tree.draft_tokens, tree.tree_mask.view(nb, n, n), depths,
                            [r.prompt + r.new for r in requests], s.logits_processor, s.min_new_tokens,
                            [len(r.new) for r in requests], s.eos_token_ids)

    def _drop_finished(self) -> None:
        """Finished requests leave the batch. With compiled rounds the batch only shrinks to a
        power of two, so that a call needs graphs for a few batch sizes, not for every one: the
        rows left over are filled with mirrors of running requests, copies whose tokens are
        neither emitted nor counted (a mirror costs a row's arithmetic, so it is not kept at
        full size)."""
        if not any(self.requests[i].finished for i in self.active):
            return
        keep = [row for row, i in enumerate(self.active) if not self.requests[i].finished and not self.mirror[row]]
        self.mirror = [False] * len(keep)
        if self.gen.compiled is not None and keep:
            pad = min(len(self.active), 1 << (len(keep) - 1).bit_length()) - len(keep)
            keep = keep + [keep[j % len(keep)] for j in range(pad)]
            self.mirror += [True] * pad
        self.mirror_rows = torch.tensor(self.mirror, device=self.device) if any(self.mirror) else None
        rows = torch.tensor(keep, device=self.device)
        self.runner.select_rows(rows)
        self.dcache.select_rows(rows)
        self.inputs = DraftInputs(*(x.index_select(0, rows) for x in
                                    (self.inputs.features, self.inputs.tokens, self.inputs.positions,
                                     self.inputs.counts)))
        self.roots = self.roots.index_select(0, rows)
        self.active = [self.active[row] for row in keep]

    def _stream(self, request: int, tokens: List[int]) -> None:
        """Batch 1: the new tokens as a 1-D tensor (what Hugging Face's streamers take). Larger
        batches: a [B, n] tensor, request ``request``'s row holding its tokens, the others padding."""
        if len(self.requests) == 1:
            self.settings.streamer.put(torch.tensor(tokens))
            return
        row = torch.full((len(self.requests), len(tokens)), self.settings.pad_token_id, dtype=torch.long)
        row[request] = torch.tensor(tokens)
        self.settings.streamer.put(row)
