"""Configuration of a speculative generation: tree shape and sampling."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TreeConfig:
    """Shape of the draft tree per round.

    depth: draft steps per round (tree depth, root excluded).
    topk: children kept per frontier node and frontier width (1 = a chain).
    num_draft_tokens: tree nodes sent to the target per round, root included
        (at most 1 + topk + (depth - 1) * topk^2; a chain uses depth + 1).
    """

    depth: int = 5
    topk: int = 4
    num_draft_tokens: int = 16

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise ValueError(f"TreeConfig.depth must be >= 1, got {self.depth}")
        if self.topk < 1:
            raise ValueError(f"TreeConfig.topk must be >= 1, got {self.topk}")
        most = 1 + self.topk + (self.depth - 1) * self.topk * self.topk
        if not 2 <= self.num_draft_tokens <= most:
            raise ValueError(
                f"TreeConfig.num_draft_tokens must be in [2, {most}] for depth={self.depth}, topk={self.topk} "
                f"(root + drafted candidates), got {self.num_draft_tokens}")

    @classmethod
    def chain(cls, depth: int) -> "TreeConfig":
        return cls(depth=depth, topk=1, num_draft_tokens=depth + 1)


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 is greedy; otherwise sampling from the target distribution filtered by
    top_k (0 = off) and top_p (1.0 = off), as Hugging Face's generate does."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")

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

