"""When a request stops: the earliest of its EOS token, a stop string, a stopping criterion and
its length limit.

A round can emit several tokens at once; they are looked at one by one, in order, so whichever
comes first decides the cut and the reason. Stop strings are matched incrementally: only the
text of the last few tokens (enough to hold the longest stop string) is decoded per token, so
the work grows linearly with the number of new tokens. A stop string ends the request after
the token that completes it (the text of the new tokens contains it from that token on).

Stopping criteria (``stopping_criteria=``, Hugging Face's ``StoppingCriteriaList``) are asked
after every new token, as Hugging Face's generate asks them after every step: with the
request's row of the output so far, [1, prompt + new] (the prompt as it appears in the output,
left padding included, so length-based criteria count what Hugging Face counts), and
``scores=None``, which is what Hugging Face passes them without ``output_scores`` (an option
speculative decoding refuses). A criterion that says stop ends the request after that token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple

import torch

# Extra tokens kept in the decoded window beyond one per stop-string character (a character can
# span several byte-level tokens, and a token may decode to nothing until the next completes it).
WINDOW_SLACK = 8


@dataclass
class StopRule:
    """What ends a request: ``limit`` new tokens, any of ``eos``, any of ``stop_strings``, any
    of ``criteria`` (asked with ``prefix`` [P], the prompt as it appears in the output, followed by
    the new tokens)."""

    limit: int
    eos: Sequence[int]
    stop_strings: Sequence[str] = ()
    tokenizer: object = None
    criteria: Any = None
    prefix: Optional[torch.Tensor] = None
    window: int = field(init=False)

    def __post_init__(self) -> None:
        longest = max((len(s.encode("utf-8")) for s in self.stop_strings), default=0)
        self.window = longest + WINDOW_SLACK

    def scan(self, tokens: List[int], start: int) -> Optional[Tuple[int, str]]:
        """Looks at tokens[start:] (the ones not looked at yet); returns (how many tokens to keep,
        reason) for the first stop, or None."""
        for j in range(start, len(tokens)):
            if j >= self.limit:
                return self.limit, "length"
            if tokens[j] in self.eos:
                return j + 1, "eos"
            if self.stop_strings:
                text = self.tokenizer.decode(tokens[max(0, j + 1 - self.window):j + 1])
                if any(s in text for s in self.stop_strings):
                    return j + 1, "stop"
            if self.criteria is not None and self._criteria_stop(tokens[:j + 1]):
                return j + 1, "stop"
        if len(tokens) >= self.limit:
            return self.limit, "length"
        return None

    def _criteria_stop(self, new: List[int]) -> bool:
        prefix = self.prefix
        row = torch.tensor(new, dtype=torch.long, device=None if prefix is None else prefix.device)
        if prefix is not None:
            row = torch.cat([prefix.long(), row])
        done = self.criteria(row[None], None)
        return bool(torch.as_tensor(done).any())
