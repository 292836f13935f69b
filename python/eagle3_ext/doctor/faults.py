"""The doctor's fault matrix: copies of a healthy draft, each with one serving mistake that
leaves generation lossless and only acceptance worse, which the doctor must name.

- ``shifted capture``: the serving side reads the layers one above the trained ones (an
  off-by-one in layer ids); the draft keeps its activation fingerprint.
- ``shifted capture, no fingerprint``: the same without the fingerprint, so that only
  measurement can find it.
- ``flipped residual``: ``norm_before_residual`` set the other way.
- ``embedding output added``: the embedding output captured in front of the trained layers.
- ``zeroed d2t``: the draft-to-target vocabulary map lost (all zeros).

``plant(draft_dir, out_dir, fault)`` writes the faulty copy; tests/test_doctor.py runs the matrix
on a tiny pair and benchmarks/doctor_matrix.py on a shipped one.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Callable, Dict, Tuple

from ..errors import BadInputError

# Files of a trained draft's folder that a planted copy leaves behind.
NOT_COPIED = ("checkpoint", "metrics.json", "specforge", "vllm")


def _shift(path: str, config: dict) -> None:
    config["eagle3_ext"]["aux_layer_ids"] = [i + 1 for i in config["eagle3_ext"]["aux_layer_ids"]]


def _flip_residual(path: str, config: dict) -> None:
    config["eagle3_ext"]["norm_before_residual"] = not config["eagle3_ext"].get("norm_before_residual", False)


def _add_embedding(path: str, config: dict) -> None:
    config["eagle3_ext"]["aux_layer_ids"] = [0] + list(config["eagle3_ext"]["aux_layer_ids"])


def _zero_d2t(path: str, config: dict) -> None:
    from safetensors.torch import load_file, save_file

    weights = os.path.join(path, "model.safetensors")
    state = load_file(weights)
    state["d2t"].zero_()
    save_file(state, weights)


# fault -> (edit of the copy's folder and config, whether the copy keeps the fingerprint)
FAULTS: Dict[str, Tuple[Callable[[str, dict], None], bool]] = {
    "shifted capture": (_shift, True),
    "shifted capture, no fingerprint": (_shift, False),
    "flipped residual": (_flip_residual, True),
    "embedding output added": (_add_embedding, True),
    "zeroed d2t": (_zero_d2t, True),
}


def plant(draft_dir: str, out_dir: str, fault: str) -> str:
    """A copy of the draft in ``draft_dir`` at ``out_dir`` (replaced if present) with ``fault``."""
    if fault not in FAULTS:
        raise BadInputError(f"fault must be one of {', '.join(FAULTS)}, got {fault!r}")
    edit, keep_fingerprint = FAULTS[fault]
    return edited_copy(draft_dir, out_dir, edit, keep_fingerprint)


def edited_copy(draft_dir: str, out_dir: str, edit: Callable[[str, dict], None],
                keep_fingerprint: bool = True) -> str:
    """A copy of the draft at ``out_dir`` whose folder and config ``edit(out_dir, config)`` changes."""
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    shutil.copytree(draft_dir, out_dir, ignore=shutil.ignore_patterns(*NOT_COPIED))
    config_path = os.path.join(out_dir, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    if not keep_fingerprint:
        config["eagle3_ext"].pop("fingerprint", None)
    edit(out_dir, config)
    with open(config_path, "w") as f:
        json.dump(config, f, indent=1)
    return out_dir
