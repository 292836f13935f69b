"""``compile=True``: a generator's compiled graphs, the target's verify forward
(``compiled_verify``) and the draft's side of a round (``compiled_draft``), built and used
together."""

from __future__ import annotations

from .compiled_draft import CompiledDraft
from .compiled_verify import CompiledVerify


class CompiledRound:
    """The verify graph (``verify``) and the draft's graphs (``draft``) of one generator."""

    def __init__(self, target):
        self.verify = CompiledVerify(target)
        self.draft = CompiledDraft(target.get_input_embeddings().weight.device)

    @property
    def compile_s(self) -> float:
        """Seconds spent compiling so far, both sides together."""
        return self.verify.compile_s + self.draft.compile_s
