"""The decision rule of the doctor's verdict, apart from the measuring and the wording."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence

from .evidence import Z_DECISIVE
from .report import Candidate


@dataclass
class Judgement:
    """``status``: "fault" (``winner`` fits the draft better than the configured setup),
    "ok" (the configured setup is best with confidence) or "inconclusive" (``undecided`` are
    the candidates that are neither beaten nor winning with confidence)."""

    status: str
    winner: Optional[Candidate] = None
    undecided: List[Candidate] = field(default_factory=list)


def judge(others: Sequence[Candidate], capture_ok: bool) -> Judgement:
    """``others``: every measured candidate but the configured one, with their paired z
    (positive: the candidate fits better). ``capture_ok``: the activation fingerprint matched,
    which settles the capture candidates (but not the convention flags)."""
    winners = [c for c in others if c.z >= Z_DECISIVE]
    if winners:
        # z says how sure, the gain how much better: of the sure ones, the largest gain.
        return Judgement("fault", winner=max(winners, key=lambda c: c.loss_gain))
    undecided = [c for c in others if c.z > -Z_DECISIVE and (c.flags or not capture_ok)]
    return Judgement("inconclusive", undecided=undecided) if undecided else Judgement("ok")
