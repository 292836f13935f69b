"""Prompt-lookup (n-gram) candidates for hybrid drafting.

Text that repeats itself (code, a loop the target falls into, a quoted passage) is predicted
for free by copying what followed the last earlier occurrence of the context's suffix. Each
round, ``NgramLookup.propose`` returns such a continuation of a request's tokens; the round
grafts it onto the EAGLE tree (``tree.graft_chains``), so one verify forward checks the copied
span and the draft's branches together.

The chain competes with the draft's candidates for the tree's nodes on one scale: the
estimated probability that a node is accepted. A draft candidate's estimate is its
cumulative draft probability (EAGLE-2's ranking); a lookup node at chain depth d gets q^d,
where q is the request's measured per-token acceptance rate of its lookup chains (a
Beta(1, 1) prior, so an unproven chain starts at 1/2 per token and earns nodes as it is
accepted).

With ``TreeConfig.lookup_corpus`` and a draft that ships an n-gram table of its training data
(``draft/lookup_corpus.py``), a request whose own tokens give no match of at least two tokens
takes the table's chain instead, when the table knows a longer context. Such a chain's node at
depth d is scored by the product of the table's successor shares down to it, and its outcome is
not counted in q, which stays the record of the request's own copies.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from ..draft.lookup_corpus import MIN_NGRAM, LookupCorpus


class NgramLookup:
    """One request's n-gram index and its lookup acceptance record.

    The index maps every n-gram (n = 1..max_ngram) of the request's tokens to where its latest
    occurrence ends; it grows with the tokens, so each call costs O(new tokens * max_ngram).
    """

    def __init__(self, max_ngram: int, max_tokens: int, corpus: Optional[LookupCorpus] = None):
        self.max_ngram = max_ngram
        self.max_tokens = max_tokens
        self.corpus = corpus
        self.tokens: List[int] = []    # the request's prompt and emitted tokens; the caller appends
        self._last_end: Dict[Tuple[int, ...], int] = {}
        self._indexed = 1              # n-grams ending before this index are in _last_end
        self.accepted = 0              # lookup tokens the target accepted
        self.rejected = 0              # lookup chains cut short by the target
        self._corpus_scores: Optional[List[float]] = None  # the last chain's, when the table gave it

    def propose(self) -> List[int]:
        """The request's own continuation (``propose_copy``), or where that matched fewer than
        MIN_NGRAM tokens and the corpus table knows a longer context, the table's."""
        chain, matched = self.propose_copy()
        self._corpus_scores = None
        if self.corpus is not None and matched < MIN_NGRAM:
            from_corpus, scores, context = self.corpus.propose(self.tokens, self.max_tokens)
            if context > matched:
                self._corpus_scores = scores
                return from_corpus
        return chain

    def propose_copy(self) -> Tuple[List[int], int]:
        """The continuation of the tokens after the latest earlier occurrence of its longest
        matching suffix (at most max_ngram tokens), up to max_tokens long; [] if none matches.
        A match close to the end continues into its own copy, so a loop of period p yields a
        full-length chain rather than p tokens. Returns the chain and the suffix length matched."""
        tokens = self.tokens
        n_tokens = len(tokens)
        for end in range(self._indexed, n_tokens):  # every n-gram ending before the last token
            for n in range(1, min(self.max_ngram, end) + 1):
                self._last_end[tuple(tokens[end - n:end])] = end
        self._indexed = max(self._indexed, n_tokens)
        for n in range(min(self.max_ngram, n_tokens), 0, -1):
            start = self._last_end.get(tuple(tokens[n_tokens - n:]))
            if start is not None:
                out: List[int] = []
                while len(out) < self.max_tokens:
                    i = start + len(out)
                    out.append(tokens[i] if i < n_tokens else out[i - n_tokens])
                return out, n
        return [], 0

    @property
    def from_corpus(self) -> bool:
        """Whether the last proposed chain came from the corpus table."""
        return self._corpus_scores is not None

    @property
    def rate(self) -> float:
        """Estimated probability that the next lookup token is accepted, given the previous one was."""
        return (self.accepted + 1) / (self.accepted + self.rejected + 2)

    def scores(self, length: int) -> List[float]:
        """Estimated acceptance probability of the last proposed chain's nodes at depths 1..length."""
        if self.from_corpus:
            return self._corpus_scores[:length]
        q = self.rate
        return [q ** d for d in range(1, length + 1)]

    def record(self, placed: Sequence[int], emitted: Sequence[int]) -> int:
        """Updates the record with a round's outcome: ``placed`` is the chain that was in the
        tree, ``emitted`` what the round emitted (accepted drafts, then the target's own token).
        Returns how many chain tokens matched."""
        matched = 0
        for a, b in zip(placed, emitted):
            if a != b:
                break
            matched += 1
        if self.from_corpus:  # q is the record of the request's own copies
            return matched
        self.accepted += matched
        if matched < len(placed):
            self.rejected += 1
        return matched


def draft_nodes_to_keep(draft_scores: Sequence[Sequence[float]], chain_scores: Sequence[Sequence[float]],
                        budget: int) -> List[int]:
    """Per request, how many of the ``budget`` non-root nodes go to draft candidates when the
    best ``budget`` estimates of both kinds are taken (both lists sorted descending, so every
    kept node's ancestors are kept too); the rest go to the lookup chain."""
    out = []
    for drafted, chain in zip(draft_scores, chain_scores):
        i = j = 0
        while i + j < budget and (i < len(drafted) or j < len(chain)):
            if j >= len(chain) or (i < len(drafted) and drafted[i] >= chain[j]):
                i += 1
            else:
                j += 1
        out.append(i)
    return out
