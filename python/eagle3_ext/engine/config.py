"""Configuration of a speculative generation: tree shape and sampling."""

from __future__ import annotations

from dataclasses import dataclass

from ..validation import integer, number


@dataclass(frozen=True)
class TreeConfig:
    """Shape of the draft tree per round.

    depth: draft steps per round (tree depth, root excluded).
    topk: children kept per frontier node and frontier width (1 = a chain).
    num_draft_tokens: tree nodes sent to the target per round, root included
        (at most 1 + topk + (depth - 1) * topk^2 and MAX_NODES; a chain uses depth + 1).
    """

    depth: int = 5
    topk: int = 4
    num_draft_tokens: int = 16

    # A draft step is one draft forward, so depth bounds a round's cost; 1024 nodes is what the
    # CUDA tree builder and the CPU windowed attention take.
    MAX_DEPTH = 64
    MAX_TOPK = 64
    MAX_NODES = 1024

    def __post_init__(self) -> None:
        integer("TreeConfig.depth", self.depth, 1, self.MAX_DEPTH)
        integer("TreeConfig.topk", self.topk, 1, self.MAX_TOPK)
        most = min(1 + self.topk + (self.depth - 1) * self.topk * self.topk, self.MAX_NODES)
        try:
            integer("TreeConfig.num_draft_tokens", self.num_draft_tokens, 2, most)
        except ValueError as e:
            raise ValueError(f"{e}: the root and the drafted candidates, at most 1 + topk + (depth - 1) * topk^2 "
                             f"for depth={self.depth}, topk={self.topk}, and never more than "
                             f"{self.MAX_NODES}") from None

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

