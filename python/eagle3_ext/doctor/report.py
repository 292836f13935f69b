"""What ``eagle3 doctor`` reports: findings, measured candidates and the verdict."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional


@dataclass
class Finding:
    check: str
    status: str          # "ok", "warning" or "fault"
    message: str
    fix: Optional[str] = None


@dataclass
class Candidate:
    """One way the draft could be fed: aux layers (internal convention) and convention flags.

    ``loss`` is the mean soft cross-entropy against the target over the scored tokens, ``acc``
    the per-step top-1 agreement with the target. ``z`` is the paired z-score of (configured
    loss - this loss) per token, so a large positive z means this candidate fits the draft
    better than the configured setup; ``z_acc`` the same for top-1 agreement (this - configured).
    ``acceptance_length`` is measured by speculative generation (configured and best only).
    """

    name: str
    aux_layer_ids: List[int]
    flags: Dict[str, bool] = field(default_factory=dict)
    acc: List[float] = field(default_factory=list)
    expected_acceptance_length: float = 0.0
    loss: float = 0.0
    loss_gain: float = 0.0       # configured loss - this loss (per token)
    loss_gain_se: float = 0.0    # its standard error
    z: float = 0.0
    z_acc: float = 0.0
    tokens_to_decide: int = 0    # scored tokens that would make |z| reach 3 if the gain held
    acceptance_length: Optional[float] = None


@dataclass
class DoctorReport:
    target: str
    draft: str
    findings: List[Finding] = field(default_factory=list)
    candidates: List[Candidate] = field(default_factory=list)
    configured: Optional[List[int]] = None
    best: Optional[str] = None
    verdict: str = ""
    recommended_aux_layer_ids: Optional[List[int]] = None
    recommended_config: Dict[str, Any] = field(default_factory=dict)
    fingerprint: Optional[Dict[str, Any]] = None     # the capture check against the draft's fingerprint
    data: Dict[str, Any] = field(default_factory=dict)
    acceptance: Dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0

    @property
    def healthy(self) -> bool:
        return self.verdict.startswith("HEALTHY")

    @property
    def exit_code(self) -> int:
        """0 HEALTHY, 1 FAULT, 3 INCONCLUSIVE (2 is the CLI's usage / input error)."""
        return 0 if self.healthy else 1 if self.verdict.startswith("FAULT") else 3

    def add(self, check: str, status: str, message: str, fix: Optional[str] = None) -> None:
        self.findings.append(Finding(check, status, message, fix))

    def as_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["healthy"] = self.healthy
        return d
