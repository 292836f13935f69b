"""The requests of one ``generate`` call and the steps that advance them: ``prefill``, then
``round`` until every request is done, each ending in ``emit``.

A round (``Batch.round``) reads as its steps:

1. ``_draft``: the draft commits last round's accepted pairs (features from the target's capture
   hooks, through ``draft.project_aux``) and drafts (``drafting``; compiled: ``compiled/draft.py``);
2. ``_tree``: the tree of the draft's best candidates, with each request's prompt-lookup chain
   grafted on (``lookup``);
3. the target's verify forward over the tree (``TargetRunner.verify``);
4. ``_accept``: the logits processors at every node, then greedy or lossless sampling
   verification (``tree``); sampling also measures the round's ``acceptance_bound``;
5. ``_commit``: the accepted path stays in the target's cache (``TargetRunner.commit``), the
   tokens are emitted, and the accepted pairs become the draft's next inputs.

The running requests' per-row state is one ``Rows`` object (``rows.py``); finished requests leave
it between rounds (``_drop_finished``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch

from ..api.config import filtered_probs
from ..api.processors import process_next, process_tree
from ..api.settings import GenerateSettings
from ..api.stats import GenerationStats
from ..api.stopping import StopRule
from ..compiled.verify import static_capacity
from ..draft.lookup_corpus import FILE_NAME
from ..errors import BadInputError
from .acceptance_bound import acceptance_bound
from .drafting import DraftInputs, DraftSampler, build_tree, candidate_scores, draft_steps, extend_eager
from .lookup import NgramLookup, draft_nodes_to_keep
from .rows import Rows
from .target import TargetRunner
from .tree import DraftTree, graft_chains, verify_greedy, verify_sampling, verify_sampling_draft_probs


@dataclass
class Request:
    """One prompt of the call and what it has produced so far (``new``); finished once it has a
    stop ``reason``."""

    prompt: List[int]
    rule: StopRule
    new: List[int] = field(default_factory=list)
    reason: str = ""
    checked: int = 0          # new tokens already looked at by the stop rule
    lookup: Optional[NgramLookup] = None   # hybrid drafting's n-gram index over prompt + new

    @property
    def finished(self) -> bool:
        return bool(self.reason)


class _StepClock:
    """Adds the time since the previous lap to a ``GenerationStats`` field at each ``lap``."""

    def __init__(self, stats: GenerationStats):
        self.stats = stats
        self.last = time.perf_counter()

    def lap(self, field_name: str) -> None:
        now = time.perf_counter()
        setattr(self.stats, field_name, getattr(self.stats, field_name) + now - self.last)
        self.last = now


class Batch:
    """Per-request state (``requests``, ``stats``) and the per-row state of the requests still
    running (``rows``)."""

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
        tree = generator.tree
        if tree.lookup_corpus and generator.draft.lookup_corpus is None:
            raise BadInputError(f"TreeConfig.lookup_corpus=True, but the draft ships no n-gram table "
                                f"({FILE_NAME}); count one with `eagle3 train ngrams`")
        if tree.lookup_tokens:
            corpus = generator.draft.lookup_corpus if tree.lookup_corpus else None
            for r in self.requests:
                r.lookup = NgramLookup(tree.lookup_ngram, tree.lookup_tokens, corpus)
                r.lookup.tokens.extend(r.prompt)
        self.stats = GenerationStats(depth_accepted=[0] * generator.tree.depth)
        capacity, compiled_verify = 0, None
        if generator.compiled is not None:
            capacity = static_capacity(max(len(p) for p in prompts), max(r.rule.limit for r in self.requests),
                                       tree.num_draft_tokens)
            compiled_verify = generator.compiled.verify
        self.rows = Rows(list(range(len(prompts))), TargetRunner(generator.target, generator.capture,
                                                                 generator.use_tree_attention, compiled_verify, capacity))

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
        rows = self.rows
        out = rows.target.prefill(input_ids, attention_mask)
        self.stats.target_forwards += 1
        self.gen.check_capture_width(out.aux_hidden)
        scores = process_next(out.logits[:, -1], prompts, self.settings.logits_processor, self.settings.min_new_tokens,
                              [0] * b, self.settings.eos_token_ids)
        roots = self._select(scores)                                                       # [B]
        # Pairs (feature j, token j + 1) of each prompt, left-aligned per request; the last real
        # pair is (last prompt feature, root).
        lengths = attention_mask.sum(-1)
        features = self.gen.draft.project_aux(out.aux_hidden)
        next_tokens = torch.cat([input_ids[:, 1:], roots[:, None]], dim=1)
        cols = ((longest - lengths)[:, None] + torch.arange(longest, device=self.device)).clamp(max=longest - 1)
        rows.inputs = DraftInputs(
            features=torch.gather(features, 1, cols[..., None].expand(b, longest, features.shape[-1])),
            tokens=torch.gather(next_tokens, 1, cols),
            positions=torch.arange(longest, device=self.device).expand(b, longest), counts=lengths)
        most_new = max(r.rule.limit for r in self.requests)
        slots = self.gen.draft_cache_slots(longest, most_new)
        if self.gen.compiled is not None:
            rows.draft_cache = self.gen.compiled.draft.new_cache(self.gen.draft, b, slots)
        else:
            rows.draft_cache = self.gen.draft.new_cache(b, slots, device=self.device)
        rows.roots = roots
        for i, token in enumerate(roots.tolist()):
            self.emit(i, [int(token)])

    def round(self) -> None:
        """One round over the running requests: draft -> tree -> verify -> accept -> commit, each
        step timed into ``stats``."""
        self._drop_finished()
        clock = _StepClock(self.stats)
        sampler = self._sampler()
        steps = self._draft(sampler)
        clock.lap("draft_time_s")
        tree, placed = self._tree(steps)
        clock.lap("tree_build_time_s")
        verified = self.rows.target.verify(tree)
        clock.lap("verify_time_s")
        result, probs = self._accept(tree, verified.logits, sampler)
        clock.lap("accept_time_s")
        if probs is not None:  # sampling: what lossless verification could keep (not part of decoding)
            self._add_bound(tree, probs)
            clock.lap("bound_time_s")
        self._commit(tree, verified, result, placed)
        clock.lap("compact_time_s")
        self.stats.target_forwards += 1
        self.stats.rounds += 1

    def _sampler(self) -> Optional[DraftSampler]:
        """With a sampled tree and sampling on: what draws the draft's tokens (and keeps their
        probabilities for the p/q verifier); else None (the draft's top-k)."""
        if self.gen.tree.sampled and not self.settings.sampling.greedy:
            return DraftSampler(self.gen.draft, self.settings.sampling, self.rng, len(self.rows), self.gen.tree.depth)
        return None

    def _draft(self, sampler: Optional[DraftSampler]):
        """The draft commits last round's pairs, then runs its steps (eager or compiled); its
        cache then forgets the steps' tokens (the accepted ones come back as next round's pairs)."""
        gen, rows = self.gen, self.rows
        if gen.compiled is not None:
            steps = gen.compiled.draft.round(gen.draft, rows.draft_cache, rows.inputs, rows.seq_lens, gen.tree,
                                             sampler)
        else:
            root_logits, root_hidden = extend_eager(gen.draft, rows.draft_cache, rows.inputs)
            steps = draft_steps(gen.draft, rows.draft_cache, root_logits, root_hidden, rows.seq_lens, gen.tree,
                                sampler)
        rows.draft_cache.rollback()
        return steps

    def _tree(self, steps) -> Tuple[DraftTree, Optional[List[List[int]]]]:
        """The round's tree: the draft's best candidates, and with lookup on, each request's
        lookup chain grafted on, the node budget split between the two by estimated acceptance.
        Returns the tree and the chain placed per row (None without lookup)."""
        cfg, seq_lens = self.gen.tree, self.rows.seq_lens
        budget = cfg.num_draft_tokens - 1
        drafted = min(budget, cfg.draft_candidates)
        lookups = [self.requests[i].lookup for i in self.rows.active]
        chains = [lk.propose() for lk in lookups] if cfg.lookup_tokens else []
        if not any(chains):
            return build_tree(self.rows.roots, seq_lens, steps, drafted + 1), None
        keep = draft_nodes_to_keep(candidate_scores(steps, drafted), [lk.scores(len(c)) for lk, c in
                                                                      zip(lookups, chains)], budget)
        # One tree width for the batch: the draft part as wide as the row that wants most of it,
        # the chains in what is left, so a verify never exceeds num_draft_tokens per row.
        n_draft = max(1, max(keep))
        tree = build_tree(self.rows.roots, seq_lens, steps, n_draft + 1)
        return graft_chains(tree, chains, [budget - n_draft] * len(chains))

    def _accept(self, tree: DraftTree, logits: torch.Tensor, sampler: Optional[DraftSampler]):
        """Verification of the tree against the target's (processed) scores: greedy, or lossless
        sampling (the p/q verifier for tokens drawn from the draft). Returns the result and, when
        sampling, the target's probabilities at every node (None when greedy)."""
        nb, n = len(self.rows), tree.num_draft_tokens
        scores = self._tree_scores(logits, tree, nb, n)
        if self.settings.sampling.greedy:
            return verify_greedy(tree, scores.argmax(-1)), None
        probs = filtered_probs(scores, self.settings.sampling)
        if sampler is not None:  # drawn tokens: verified with the draft's probabilities
            depths = tree.positions.view(nb, n) - self.rows.seq_lens[:, None]
            result = verify_sampling_draft_probs(tree, probs, sampler.draft_probs(depths, probs.shape[-1]),
                                                 generator=self.rng)
        else:
            result = verify_sampling(tree, probs, generator=self.rng)
        return result, probs

    def _add_bound(self, tree: DraftTree, probs: torch.Tensor) -> None:
        """What exact lossless verification keeps in expectation of this tree's tokens taken as
        fixed: the target-only verifier's figure (a sampled chain's p/q verifier keeps more)."""
        real = self.rows.real
        self.stats.add_bound(acceptance_bound(tree, probs).per_depth[real].sum(0).tolist(), len(real))

    def _commit(self, tree: DraftTree, verified, result, placed: Optional[List[List[int]]]) -> None:
        """Keeps each row's accepted path in the target's cache, emits its tokens, and makes the
        accepted (feature, token) pairs the draft's next inputs."""
        rows, nb, n = self.rows, len(self.rows), tree.num_draft_tokens
        index = torch.arange(nb, device=self.device)
        accept_local = torch.where(result.accept_index >= 0, result.accept_index - index[:, None] * n, -1).long()
        counts = result.accept_length.long() + 1
        if rows.mirror_mask is not None:  # a mirror commits one token a round, never outgrowing the row it copies
            counts = torch.where(rows.mirror_mask, 1, counts)
        rows.target.commit(accept_local, counts)
        m = int(counts.max())
        picked = accept_local[:, :m].clamp(min=0)
        node_features = [torch.gather(a, 1, picked[..., None].expand(nb, m, a.shape[-1])) for a in verified.aux_hidden]
        tokens = torch.zeros(nb, m, dtype=torch.long, device=self.device)
        for row, accepted in enumerate(result.accepted_tokens):
            if rows.mirror[row]:
                tokens[row, 0] = accepted[0]
                continue
            tokens[row, :len(accepted)] = torch.tensor(accepted, device=self.device)
            self._record(row, accepted, placed[row] if placed is not None else None)
            self.emit(rows.active[row], accepted)
        positions = (rows.seq_lens - counts)[:, None] + torch.arange(m, device=self.device)
        rows.inputs = DraftInputs(self.gen.draft.project_aux(node_features), tokens, positions, counts)
        rows.roots = tokens[index, counts - 1]

    def _record(self, row: int, accepted: List[int], chain: Optional[List[int]]) -> None:
        """A real row's round in the stats: its accepted drafts per depth, and what its lookup
        chain (``chain``, placed in the tree) proposed and got accepted."""
        stats = self.stats
        stats.request_rounds += 1
        stats.accepted_drafts += len(accepted) - 1
        if len(accepted) - 1 > len(stats.depth_accepted):  # a lookup chain reached deeper
            stats.depth_accepted += [0] * (len(accepted) - 1 - len(stats.depth_accepted))
        for d in range(len(accepted) - 1):
            stats.depth_accepted[d] += 1
        if chain:
            lookup = self.requests[self.rows.active[row]].lookup
            matched = lookup.record(chain, accepted)
            stats.lookup_proposed += len(chain)
            stats.lookup_accepted += matched
            if lookup.from_corpus:
                stats.corpus_proposed += len(chain)
                stats.corpus_accepted += matched

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
    def _select(self, scores: torch.Tensor) -> torch.Tensor:
        sampling = self.settings.sampling
        if sampling.greedy:
            return scores.argmax(-1)
        return torch.multinomial(filtered_probs(scores, sampling), 1, generator=self.rng)[:, 0]

    def _tree_scores(self, logits: torch.Tensor, tree, nb: int, n: int) -> torch.Tensor:
        s = self.settings
        if not s.logits_processor and not s.min_new_tokens:
            return logits
        requests = [self.requests[i] for i in self.rows.active]
        depths = tree.positions.view(nb, n) - self.rows.seq_lens[:, None]
        return process_tree(logits, tree.draft_tokens, tree.tree_mask.view(nb, n, n), depths,
                            [r.prompt + r.new for r in requests], s.logits_processor, s.min_new_tokens,
                            [len(r.new) for r in requests], s.eos_token_ids)

    def _drop_finished(self) -> None:
        """Finished requests leave the batch. With compiled rounds the batch only shrinks to a
        power of two, so that a call needs graphs for a few batch sizes, not for every one: the
        rows left over are filled with mirrors of running requests, copies whose tokens are
        neither emitted nor counted (a mirror costs a row's arithmetic, so it is not kept at
        full size)."""
        rows = self.rows
        if not any(self.requests[i].finished for i in rows.active):
            return
        keep = [row for row, i in enumerate(rows.active) if not self.requests[i].finished and not rows.mirror[row]]
        mirror = [False] * len(keep)
        if self.gen.compiled is not None and keep:
            pad = min(len(rows), 1 << (len(keep) - 1).bit_length()) - len(keep)
            keep = keep + [keep[j % len(keep)] for j in range(pad)]
            mirror += [True] * pad
        rows.select(keep, mirror)

    def _stream(self, request: int, tokens: List[int]) -> None:
        """Batch 1: the new tokens as a 1-D tensor (what Hugging Face's streamers take). Larger
        batches: a [B, n] tensor, request ``request``'s row holding its tokens, the others padding."""
        if len(self.requests) == 1:
            self.settings.streamer.put(torch.tensor(tokens))
            return
        row = torch.full((len(self.requests), len(tokens)), self.settings.pad_token_id, dtype=torch.long)
        row[request] = torch.tensor(tokens)
        self.settings.streamer.put(row)
