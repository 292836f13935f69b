"""What a speculative generation measured."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, List, Sequence


@dataclass
class GenerationStats:
    """new_tokens: tokens emitted over all requests; target_forwards: verify rounds (plus the
    prefill); acceptance_length: new tokens per verify round per request, bonus included;
    depth_acceptance[d]: fraction of rounds in which a depth-(d+1) draft token was accepted;
    times in seconds."""

    new_tokens: int = 0
    target_forwards: int = 0
    rounds: int = 0
    request_rounds: int = 0
    accepted_drafts: int = 0
    depth_accepted: List[int] = field(default_factory=list)
    lookup_proposed: int = 0          # hybrid drafting: lookup-chain tokens placed in trees
    lookup_accepted: int = 0          # ... and of those, accepted (the target's own token counts)
    draft_time_s: float = 0.0         # draft forwards (extend + tree steps)
    tree_build_time_s: float = 0.0    # choosing the nodes and building the tree
    verify_time_s: float = 0.0        # the target's verify forward
    accept_time_s: float = 0.0        # greedy / sampling verification
    compact_time_s: float = 0.0       # KV compaction and next-round inputs
    guard_time_s: float = 0.0         # the capture guard's probe forward (first call only)
    compile_time_s: float = 0.0       # compile=True: verify calls that compiled a new shape (within verify_time_s)
    total_time_s: float = 0.0

    @property
    def acceptance_length(self) -> float:
        return (self.accepted_drafts + self.request_rounds) / max(1, self.request_rounds)

    @property
    def depth_acceptance(self) -> List[float]:
        return [n / max(1, self.request_rounds) for n in self.depth_accepted]

    @property
    def other_time_s(self) -> float:
        """Prefill, bookkeeping and Python overhead: the rest of the wall time."""
        return self.total_time_s - (self.draft_time_s + self.tree_build_time_s + self.verify_time_s
                                    + self.accept_time_s + self.compact_time_s + self.guard_time_s)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.total_time_s if self.total_time_s > 0 else 0.0

    @classmethod
    def combine(cls, parts: Sequence["GenerationStats"]) -> "GenerationStats":
        """The stats of several calls as one: counts and times summed (acceptance and tokens/s
        then follow over all of them)."""
        total = cls(depth_accepted=[0] * max((len(p.depth_accepted) for p in parts), default=0))
        for p in parts:
            for f in fields(cls):
                if f.name == "depth_accepted":
                    total.depth_accepted = [a + b for a, b in zip(total.depth_accepted, p.depth_accepted +
                                            [0] * (len(total.depth_accepted) - len(p.depth_accepted)))]
                else:
                    setattr(total, f.name, getattr(total, f.name) + getattr(p, f.name))
        return total

    def as_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d.update(acceptance_length=self.acceptance_length, depth_acceptance=self.depth_acceptance,
                 tokens_per_s=self.tokens_per_s, other_time_s=self.other_time_s)
        return d
