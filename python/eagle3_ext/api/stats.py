"""What a speculative generation measured."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, List, Optional, Sequence


@dataclass
class GenerationStats:
    """new_tokens: tokens emitted over all requests; target_forwards: verify rounds (plus the
    prefill); acceptance_length: new tokens per verify round per request, bonus included;
    depth_acceptance[d]: fraction of rounds in which a depth-(d+1) draft token was accepted;
    times in seconds.

    Sampling also measures each round's acceptance bound (decoding/acceptance_bound.py: what
    exact lossless verification of that tree keeps in expectation): ``acceptance_bound`` and
    ``depth_acceptance_bound`` are its means per request round, ``bound_ratio`` the measured
    acceptance length over it (about 1 for the target-only verifier, up to noise)."""

    new_tokens: int = 0
    target_forwards: int = 0
    rounds: int = 0
    request_rounds: int = 0
    accepted_drafts: int = 0
    depth_accepted: List[int] = field(default_factory=list)
    bound_rounds: int = 0             # sampling: request rounds whose acceptance bound was measured
    depth_bound: List[float] = field(default_factory=list)  # ... and their expected accepted drafts per depth
    lookup_proposed: int = 0          # hybrid drafting: lookup-chain tokens placed in trees
    lookup_accepted: int = 0          # ... and of those, accepted (the target's own token counts)
    corpus_proposed: int = 0          # ... of the lookup-chain tokens, those from the draft's n-gram table
    corpus_accepted: int = 0          # ... and of those, accepted
    draft_time_s: float = 0.0         # draft forwards (extend + tree steps)
    tree_build_time_s: float = 0.0    # choosing the nodes and building the tree
    verify_time_s: float = 0.0        # the target's verify forward
    accept_time_s: float = 0.0        # greedy / sampling verification
    compact_time_s: float = 0.0       # KV compaction and next-round inputs
    bound_time_s: float = 0.0         # sampling: measuring the acceptance bound (not part of decoding)
    guard_time_s: float = 0.0         # the capture guard's probe forward (first call only)
    compile_time_s: float = 0.0       # compile=True: calls that compiled a new shape (within draft / verify time)
    total_time_s: float = 0.0

    @property
    def acceptance_length(self) -> float:
        return (self.accepted_drafts + self.request_rounds) / max(1, self.request_rounds)

    @property
    def depth_acceptance(self) -> List[float]:
        return [n / max(1, self.request_rounds) for n in self.depth_accepted]

    @property
    def acceptance_bound(self) -> Optional[float]:
        """Tokens per request round that exact lossless verification would keep in expectation
        (bonus included); None when no bound was measured (greedy)."""
        if not self.bound_rounds:
            return None
        return 1.0 + sum(self.depth_bound) / self.bound_rounds

    @property
    def depth_acceptance_bound(self) -> List[float]:
        """Per depth d + 1, the bound's expected fraction of rounds accepting a token there."""
        return [x / self.bound_rounds for x in self.depth_bound] if self.bound_rounds else []

    @property
    def bound_ratio(self) -> Optional[float]:
        bound = self.acceptance_bound
        return None if bound is None else self.acceptance_length / bound

    def add_bound(self, depth_sums: Sequence[float], requests: int) -> None:
        """One round's bound: ``depth_sums[d]``, the expected accepted drafts at depth d + 1 summed
        over the round's ``requests`` requests."""
        if len(depth_sums) > len(self.depth_bound):  # a lookup chain reached deeper
            self.depth_bound += [0.0] * (len(depth_sums) - len(self.depth_bound))
        for d, x in enumerate(depth_sums):
            self.depth_bound[d] += x
        self.bound_rounds += requests

    @property
    def other_time_s(self) -> float:
        """Prefill, bookkeeping and Python overhead: the rest of the wall time."""
        return self.total_time_s - (self.draft_time_s + self.tree_build_time_s + self.verify_time_s
                                    + self.accept_time_s + self.compact_time_s + self.bound_time_s
                                    + self.guard_time_s)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.total_time_s if self.total_time_s > 0 else 0.0

    @classmethod
    def combine(cls, parts: Sequence["GenerationStats"]) -> "GenerationStats":
        """The stats of several calls as one: counts and times summed (acceptance and tokens/s
        then follow over all of them)."""
        total = cls()
        for p in parts:
            for f in fields(cls):
                mine, theirs = getattr(total, f.name), getattr(p, f.name)
                if isinstance(mine, list):  # per depth: summed depth by depth, as long as the longest
                    longest = max(len(mine), len(theirs))
                    setattr(total, f.name, [a + b for a, b in zip(mine + [0] * (longest - len(mine)),
                                                                  theirs + [0] * (longest - len(theirs)))])
                else:
                    setattr(total, f.name, mine + theirs)
        return total

    def as_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d.update(acceptance_length=self.acceptance_length, depth_acceptance=self.depth_acceptance,
                 acceptance_bound=self.acceptance_bound, depth_acceptance_bound=self.depth_acceptance_bound,
                 bound_ratio=self.bound_ratio, tokens_per_s=self.tokens_per_s, other_time_s=self.other_time_s)
        return d
