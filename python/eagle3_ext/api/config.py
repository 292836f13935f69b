"""Configuration of a speculative generation: tree shape and sampling."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import BadInputError, BadInputTypeError
from ..validation import integer, number


@dataclass(frozen=True)
class TreeConfig:
    """Shape of the draft tree per round.

    depth: draft steps per round (tree depth, root excluded).
    topk: children kept per frontier node and frontier width (1 = a chain).
    num_draft_tokens: tree nodes sent to the target per round, root included
        (at most 1 + topk + (depth - 1) * topk^2 and MAX_NODES; a chain uses depth + 1).
    lookup_tokens: hybrid drafting: the longest prompt-lookup chain (a copy of what followed
        the last earlier occurrence of the context's suffix) grafted onto the tree each round;
        0 turns lookup off. The chain competes with the draft's candidates for the same
        num_draft_tokens - 1 nodes, ranked by estimated acceptance (see decoding/lookup.py).
    lookup_ngram: the longest suffix matched (it tries lookup_ngram tokens down to 1).
    lookup_corpus: where the draft ships an n-gram table of its training data
        (draft/lookup_corpus.py), a round whose own tokens match fewer than two tokens takes
        the chain from that table instead. Off by default: on 2 CPU cores it raised SmolLM2's
        acceptance length 5-7% and cost as much in verify rows (docs/perf_notes.md).
    sampled: when sampling (temperature > 0), draw each draft token from the draft's own
        distribution (filtered like the target's: temperature, top-k, top-p) instead of taking
        its top tokens, and verify with the draft's probabilities (p/q rejection sampling,
        eagle3.tree_speculative_sampling_draft_probs). A flat target accepts far more of a
        sample of a calibrated draft than of its top token. Needs a chain (topk 1) without
        lookup: keeping only some of the drawn tokens would bias the sample. Greedy decoding
        ignores it.
    """

    # The defaults are the fastest lossless setting measured on the bundled pair on 2 CPU cores
    # (fp32, batch 1, eval prompts and held-out code; see docs/perf_notes.md).
    depth: int = 5
    topk: int = 2
    num_draft_tokens: int = 16
    lookup_tokens: int = 10
    lookup_ngram: int = 3
    sampled: bool = False
    lookup_corpus: bool = False

    # When sampling, `eagle3 generate` without tree options drafts a sampled chain of this depth:
    # the fastest of chain 4 / 6 / 8 and the greedy default at T = 0.7 and 1.0 on the bundled
    # pair (docs/perf_notes.md).
    SAMPLED_DEPTH = 6

    # A draft step is one draft forward, so depth bounds a round's cost; 1024 nodes is what the
    # CUDA tree builder and the CPU windowed attention take.
    MAX_DEPTH = 64
    MAX_TOPK = 64
    MAX_NODES = 1024
    MAX_LOOKUP_TOKENS = 64
    MAX_LOOKUP_NGRAM = 16

    def __post_init__(self) -> None:
        integer("TreeConfig.lookup_tokens", self.lookup_tokens, 0, self.MAX_LOOKUP_TOKENS)
        integer("TreeConfig.lookup_ngram", self.lookup_ngram, 1, self.MAX_LOOKUP_NGRAM)
        integer("TreeConfig.depth", self.depth, 1, self.MAX_DEPTH)
        integer("TreeConfig.topk", self.topk, 1, self.MAX_TOPK)
        most = min(1 + self.draft_candidates + self.lookup_tokens, self.MAX_NODES)
        try:
            integer("TreeConfig.num_draft_tokens", self.num_draft_tokens, 2, most)
        except ValueError as e:
            raise BadInputError(f"{e}: the root and the drafted candidates, at most 1 + topk + (depth - 1) * topk^2 "
                                f"(+ lookup_tokens) for depth={self.depth}, topk={self.topk}, and never more than "
                                f"{self.MAX_NODES}") from None
        if not isinstance(self.sampled, bool):
            raise BadInputTypeError(f"TreeConfig.sampled must be a bool, got {self.sampled!r}")
        if not isinstance(self.lookup_corpus, bool):
            raise BadInputTypeError(f"TreeConfig.lookup_corpus must be a bool, got {self.lookup_corpus!r}")
        if self.lookup_corpus and not self.lookup_tokens:
            raise BadInputError("TreeConfig.lookup_corpus needs lookup_tokens > 0 (the table's chains are lookup "
                                "chains), got lookup_tokens=0")
        if self.sampled and (self.topk != 1 or self.lookup_tokens or self.num_draft_tokens != self.depth + 1):
            raise BadInputError(f"TreeConfig.sampled needs a chain without lookup (topk 1, lookup_tokens 0, "
                                f"num_draft_tokens depth + 1), got depth={self.depth}, topk={self.topk}, "
                                f"num_draft_tokens={self.num_draft_tokens}, lookup_tokens={self.lookup_tokens}")

    @property
    def draft_candidates(self) -> int:
        """Candidates the draft steps produce per round: topk, then topk^2 per further step."""
        return self.topk + (self.depth - 1) * self.topk * self.topk

    @classmethod
    def chain(cls, depth: int, lookup_tokens: int = 0, sampled: bool = False) -> "TreeConfig":
        """A chain of ``depth`` draft tokens; with lookup, room for a lookup chain beside it."""
        return cls(depth=depth, topk=1, num_draft_tokens=depth + 1 + lookup_tokens, lookup_tokens=lookup_tokens,
                   sampled=sampled)

    @property
    def name(self) -> str:
        """A short label: chain5, tree5x4n16, with +lookup10 when lookup is on (+lookup10+corpus
        with the draft's n-gram table); a sampled chain is chain5-sampled."""
        base = (f"chain{self.depth}" if self.topk == 1 and self.num_draft_tokens == self.depth + 1 + self.lookup_tokens
                else f"tree{self.depth}x{self.topk}n{self.num_draft_tokens}")
        lookup = (f"+lookup{self.lookup_tokens}" + ("+corpus" if self.lookup_corpus else "")
                  if self.lookup_tokens else "")
        return base + lookup + ("-sampled" if self.sampled else "")


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 is greedy; otherwise sampling from the target distribution filtered by
    top_k (0 = off) and top_p (1.0 = off), as Hugging Face's generate does."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        number("temperature", self.temperature, 0)
        number("top_p", self.top_p, 0, 1, exclusive_minimum=True)
        integer("top_k", self.top_k, 0)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def filtered_probs(logits: "torch.Tensor", sampling: SamplingConfig) -> "torch.Tensor":
    """Target probabilities [..., V] (fp32) after temperature, top-k and top-p, in the order
    Hugging Face's generate applies them."""
    import torch

    scores = logits.float() / sampling.temperature
    if sampling.top_k > 0:
        k = min(sampling.top_k, scores.shape[-1])
        kth = torch.topk(scores, k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=False)
        cum = sorted_scores.softmax(-1).cumsum(-1)
        remove_sorted = cum <= 1 - sampling.top_p
        remove_sorted[..., -1] = False  # keep at least one token
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        scores = scores.masked_fill(remove, float("-inf"))
    return scores.softmax(-1)

