"""``eagle3 doctor``: why is a draft's acceptance low? See ``run`` for what it checks and how
the verdict (FAULT, HEALTHY or INCONCLUSIVE) is reached."""

from .candidates import Setup, candidate_layer_sets, flag_setups
from .evidence import PairedDifference, Z_DECISIVE, paired_difference
from .report import Candidate, DoctorReport, Finding
from .run import Doctor, diagnose

__all__ = ["Candidate", "Doctor", "DoctorReport", "Finding", "PairedDifference", "Setup", "Z_DECISIVE",
           "candidate_layer_sets", "diagnose", "flag_setups", "paired_difference"]
