"""Activation fingerprint: statistics of the target's hidden states that tell its layers apart,
recorded when a draft is trained and checked before the draft runs.

Statistics gathered on arbitrary text barely separate neighbouring layers: a layer's mean RMS
moves with the text about as much as it moves from one layer to the next. So the fingerprint
stores a fixed probe (token ids of the training text) with, for every recorded layer, two
statistics of the target's hidden states on that probe:

- ``rms``: the RMS of each probe token's state (a profile over the probe, fp32);
- ``direction``: the mean of the tokens' unit directions, projected on ``SKETCH_DIMS`` fixed
  random directions (seeded, so recomputable) and normalized: which way the layer points.

The distance between two layers' statistics is the mean absolute log-ratio of the RMS profiles
plus one minus the cosine of the directions. Recorded layers: the draft's aux layers, each one's
neighbours (id - 1, id + 1) and the embedding output (index 0), so a capture that reads a
neighbour or the embedding is recognised by name, not only as "different".

A captured state matches a recorded layer when its distance is within that layer's tolerance:
``TOLERANCE_FRACTION`` of the distance from that layer to the nearest other recorded layer.
On the bundled target a bf16 forward moves the statistics by about 1% of that separation; a
shifted capture sits at the full separation (see ``margins``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

import torch

from ..decoding.capture import AuxHiddenCapture, find_decoder_layers
from ..errors import BadInputError
from .aux_layers import target_dims

VERSION = 1
PROBE_TOKENS = 64
MIN_PROBE_TOKENS = 16
SKETCH_DIMS = 64
SKETCH_SEED = 20250311
TOLERANCE_FRACTION = 0.25


def recorded_indices(aux_layer_ids: Sequence[int], num_layers: int) -> List[int]:
    """The aux layers, their neighbours and the embedding output, within [0, num_layers]."""
    out = {0}
    for i in aux_layer_ids:
        out.update(j for j in (i - 1, i, i + 1) if 0 <= j <= num_layers)
    return sorted(out)


def _sketch(width: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(SKETCH_SEED + width)
    return torch.randn(width, SKETCH_DIMS, generator=gen) / math.sqrt(SKETCH_DIMS)


def layer_stats(states: torch.Tensor) -> Dict[str, List[float]]:
    """Statistics of one layer's states [P, H] on the probe (see the module docstring)."""
    x = states.detach().float().cpu()
    rms = x.pow(2).mean(-1).sqrt()
    unit = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    direction = unit.mean(0) @ _sketch(x.shape[-1])
    direction = direction / direction.norm().clamp_min(1e-30)
    return {"rms": [float(f"{v:.6g}") for v in rms.tolist()],
            "direction": [float(f"{v:.6g}") for v in direction.tolist()]}


def distance(a: Mapping[str, Sequence[float]], b: Mapping[str, Sequence[float]]) -> float:
    """Distance between two layers' statistics (0 for identical states)."""
    ra = torch.tensor(a["rms"], dtype=torch.float64).clamp_min(1e-30)
    rb = torch.tensor(b["rms"], dtype=torch.float64).clamp_min(1e-30)
    if ra.shape != rb.shape:
        raise ValueError(f"fingerprint statistics over {ra.numel()} and {rb.numel()} probe tokens cannot be compared")
    da = torch.tensor(a["direction"], dtype=torch.float64)
    db = torch.tensor(b["direction"], dtype=torch.float64)
    cos = float(da @ db / (da.norm() * db.norm()).clamp_min(1e-30))
    return float((ra.log() - rb.log()).abs().mean()) + max(0.0, 1.0 - cos)


def probe_from_sequences(sequences: Iterable[Sequence[int]], length: int = PROBE_TOKENS) -> List[int]:
    """Up to ``length`` token ids taken from ``sequences`` in order (training or sample text)."""
    probe: List[int] = []
    for seq in sequences:
        probe.extend(int(t) for t in seq)
        if len(probe) >= length:
            break
    if len(probe) < MIN_PROBE_TOKENS:
        raise BadInputError(f"an activation fingerprint needs a probe of at least {MIN_PROBE_TOKENS} tokens, the data "
                            f"gave {len(probe)}")
    return probe[:length]


class _ProbeDone(Exception):
    """Raised by a hook once every wanted state is captured: the layers above are not run."""


def probe_states(target, indices: Sequence[int], probe_ids: Sequence[int]) -> Dict[int, torch.Tensor]:
    """The target's hidden states [P, H] at ``indices`` (output_hidden_states convention) on the
    probe. The forward stops at the highest wanted layer; the lm_head never runs."""
    device = target.get_input_embeddings().weight.device
    ids = torch.tensor([list(probe_ids)], dtype=torch.long, device=device)
    layers = find_decoder_layers(target)
    top = max(indices)

    def stop(*_):
        raise _ProbeDone

    with torch.no_grad(), AuxHiddenCapture(target, indices) as capture:
        # Registered after the capture's hooks, so it runs after them on the same module.
        handle = (layers[top].register_forward_pre_hook(stop) if top < len(layers)
                  else layers[top - 1].register_forward_hook(stop))
        try:
            target(input_ids=ids, use_cache=False)
        except _ProbeDone:
            pass
        finally:
            handle.remove()
        states = capture.take()
    return {int(i): s[0] for i, s in zip(indices, states)}


def _target_shape(target) -> tuple:
    """(num_hidden_layers, hidden_size, vocab_size) of a loaded target."""
    return target_dims(target.config)


def record(target, aux_layer_ids: Sequence[int], probe_ids: Sequence[int]) -> Dict[str, Any]:
    """The fingerprint of ``target`` for a draft reading ``aux_layer_ids``, as a JSON-ready dict."""
    layers, hidden, _ = _target_shape(target)
    indices = recorded_indices(aux_layer_ids, layers)
    states = probe_states(target, indices, probe_ids)
    return {"version": VERSION, "aux_layer_ids": [int(i) for i in aux_layer_ids], "num_hidden_layers": layers,
            "hidden_size": hidden, "probe_ids": [int(t) for t in probe_ids],
            "layers": {str(i): layer_stats(states[i]) for i in indices}}


def _layers(fingerprint: Mapping[str, Any]) -> Dict[int, Mapping[str, Sequence[float]]]:
    return {int(k): v for k, v in fingerprint["layers"].items()}


def tolerances(fingerprint: Mapping[str, Any]) -> Dict[int, float]:
    """Per recorded layer: how far a captured state may sit from it and still match it."""
    layers = _layers(fingerprint)
    out = {}
    for i, stats in layers.items():
        others = [distance(stats, s) for j, s in layers.items() if j != i]
        out[i] = TOLERANCE_FRACTION * min(others) if others else float("inf")
    return out


def validate(fingerprint: Any, where: str = "fingerprint") -> Dict[str, Any]:
    """The fingerprint dict if it has the expected fields, else a ValueError naming what is wrong."""
    if not isinstance(fingerprint, Mapping):
        raise BadInputError(f"{where}: expected an object, got {type(fingerprint).__name__}")
    if fingerprint.get("version") != VERSION:
        raise BadInputError(f"{where}: version {fingerprint.get('version')!r} is not supported (expected {VERSION})")
    for key in ("aux_layer_ids", "num_hidden_layers", "hidden_size", "probe_ids", "layers"):
        if key not in fingerprint:
            raise BadInputError(f"{where}: missing {key!r}")
    for i in fingerprint["aux_layer_ids"]:
        if str(i) not in fingerprint["layers"]:
            raise BadInputError(f"{where}: no statistics for aux layer {i}")
    return dict(fingerprint)


@dataclass
class CaptureCheck:
    """Result of comparing a capture with a fingerprint.

    trained_ids: the layers the draft was trained on (from the fingerprint); configured_ids: the
    layers captured now; looks_like[k]: the recorded layer that captured state k matches (None:
    none within tolerance); distance[k] / tolerance[k]: to the trained layer of slot k.
    """

    trained_ids: List[int]
    configured_ids: List[int]
    looks_like: List[Optional[int]] = field(default_factory=list)
    distance: List[float] = field(default_factory=list)
    tolerance: List[float] = field(default_factory=list)
    problem: Optional[str] = None   # a shape mismatch that made the comparison impossible
    time_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.problem is None and self.looks_like == self.trained_ids

    def describe(self) -> str:
        if self.problem is not None:
            return self.problem
        seen = ["none of the recorded layers" if j is None else str(j) for j in self.looks_like]
        figures = ", ".join(f"{d:.4f}/{t:.4f}" for d, t in zip(self.distance, self.tolerance))
        if self.ok:
            return (f"the captured layers {self.configured_ids} match the activation fingerprint of the layers the "
                    f"draft was trained on {self.trained_ids} (distance/tolerance {figures})")
        text = (f"the draft was trained on target hidden states {self.trained_ids} (its activation fingerprint), but "
                f"the configured aux layers {self.configured_ids} capture states that look like [{', '.join(seen)}] "
                f"(distance to the trained layers / tolerance: {figures})")
        if None in self.looks_like:
            text += ("; a state that matches no recorded layer means the target differs from the one the draft was "
                     "trained with (other weights, quantization, or another model)")
        return text


def check(fingerprint: Mapping[str, Any], target, configured_ids: Sequence[int]) -> CaptureCheck:
    """Runs the probe through ``target``, capturing ``configured_ids``, and compares."""
    import time

    started = time.perf_counter()
    fp = validate(fingerprint)
    trained = [int(i) for i in fp["aux_layer_ids"]]
    result = CaptureCheck(trained_ids=trained, configured_ids=[int(i) for i in configured_ids])
    layers, hidden, vocab = _target_shape(target)
    if (layers, hidden) != (fp["num_hidden_layers"], fp["hidden_size"]):
        result.problem = (f"the draft's activation fingerprint was recorded on a target with {fp['num_hidden_layers']} "
                          f"layers of width {fp['hidden_size']}, this target has {layers} of width {hidden}")
        return result
    if len(configured_ids) != len(trained):
        result.problem = (f"{len(configured_ids)} aux layers {list(configured_ids)} are configured but the draft was "
                          f"trained on {len(trained)} ({trained})")
        return result
    if max(fp["probe_ids"]) >= vocab:
        result.problem = f"the fingerprint's probe has token ids outside this target's vocabulary ({vocab})"
        return result
    recorded = _layers(fp)
    tol = tolerances(fp)
    states = probe_states(target, sorted(set(result.configured_ids)), fp["probe_ids"])
    for slot, index in enumerate(result.configured_ids):
        stats = layer_stats(states[index])
        dists = {j: distance(stats, s) for j, s in recorded.items()}
        best = min(dists, key=dists.get)
        result.looks_like.append(best if dists[best] <= tol[best] else None)
        result.distance.append(dists[trained[slot]])
        result.tolerance.append(tol[trained[slot]])
    result.time_s = time.perf_counter() - started
    return result


def margins(fingerprint: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """Per aux layer: how many tolerances away each recorded neighbour and the embedding sit
    (1.0 = exactly at the tolerance; a ±1 shift is caught when this is > 1)."""
    fp = validate(fingerprint)
    recorded = _layers(fp)
    tol = tolerances(fp)
    out = []
    for i in fp["aux_layer_ids"]:
        row: Dict[str, Any] = {"layer": int(i), "tolerance": tol[i]}
        for name, j in (("minus_1", i - 1), ("plus_1", i + 1), ("embedding", 0)):
            if j in recorded and j != i:
                row[name] = distance(recorded[i], recorded[j]) / tol[i]
        out.append(row)
    return out
