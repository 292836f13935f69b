"""``eagle3 doctor``: find why a draft's acceptance is low.

The costliest EAGLE-3 faults do not crash: a capture of other layers than the draft was
trained on (every id off by one, the embedding output added, a convention mixed up), an
untrained d2t, mismatched rope settings. Acceptance just collapses. The doctor runs

1. static checks: everything the loader validates (aux-layer count x hidden against fc, ids in
   range, vocabularies, d2t / t2d), tokenizer agreement, the draft's context and rope against
   the target's, dtypes;
2. empirical checks on sample text: with the configured aux layers and with the plausible
   alternatives (every id shifted by one either way, the embedding output added or removed,
   reversed order, EAGLE's default), the training-time-test evaluation of the draft: its loss
   (soft cross-entropy against the target, which ranks how well each capture fits what the
   draft learned) and per-position accuracy acc_i (draft argmax = target argmax) with the
   expected acceptance length; it names the configuration that fits best and what to write in
   which config key to use it.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from .draft import Eagle3DraftModel
from .draft.aux_layers import CONVENTION, eagle_default_aux_layers, resolve_aux_layer_ids, target_dims

logger = logging.getLogger(__name__)

SAMPLE_TEXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "doctor_sample.txt")
# Candidates are ranked by how well the draft fits the target with them: the soft cross-entropy
# it was trained to minimize (lower is better). Accuracy alone would favour whichever layers
# carry the most information, not the ones the draft learned to read. A candidate must beat
# the configured layers by this margin (absolute nats, and relative) to be called a fault.
MIN_LOSS_GAIN = 0.005
MIN_LOSS_GAIN_RELATIVE = 0.002


@dataclass
class Finding:
    check: str
    status: str          # "ok", "warning" or "fault"
    message: str
    fix: Optional[str] = None


@dataclass
class Candidate:
    name: str
    aux_layer_ids: List[int]
    acc: List[float] = field(default_factory=list)
    expected_acceptance_length: float = 0.0
    loss: float = 0.0  # mean soft cross-entropy against the target over the measured positions


@dataclass
class DoctorReport:
    target: str
    draft: str
    findings: List[Finding] = field(default_factory=list)
    candidates: List[Candidate] = field(default_factory=list)
    configured: Optional[List[int]] = None
    best: Optional[str] = None
    verdict: str = ""

    @property
    def healthy(self) -> bool:
        return not any(f.status == "fault" for f in self.findings)

    def as_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["healthy"] = self.healthy
        return d


def _fix_text(ids: Sequence[int]) -> str:
    ids = list(ids)
    lines = [f"eagle3_ext format: \"eagle3_ext\": {{\"aux_layer_ids\": {ids}, \"aux_layer_convention\": \"{CONVENTION}\"}}",
             f"vLLM speculators: \"eagle_aux_hidden_state_layer_ids\": {ids}"]
    if min(ids) >= 1:
        lines.insert(1, "SpecForge/SGLang: \"eagle_config\": {\"eagle_aux_hidden_state_layer_ids\": "
                        f"{[i - 1 for i in ids]}}}")
    else:
        lines.insert(1, "SpecForge/SGLang: cannot express the embedding output (index 0)")
    return "; ".join(lines)


def _rope_kind(scaling) -> tuple:
    """The parts of a rope scaling dict that change the frequencies."""
    if not scaling:
        return ("default",)
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return ("default",)
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    return (kind,) + tuple(float(scaling[k]) if k in scaling else None for k in keys)


def candidate_layer_sets(configured: Optional[Sequence[int]], k: int, num_layers: int) -> List[Tuple[str, List[int]]]:
    """The configured ids and the plausible mix-ups, each with k ids within [0, L]."""
    out: List[Tuple[str, List[int]]] = []
    if configured:
        c = list(configured)
        out += [("configured", c), ("shifted -1", [i - 1 for i in c]), ("shifted +1", [i + 1 for i in c]),
                ("reversed", c[::-1])]
        if 0 in c:
            out.append(("embedding output removed", [i for i in c if i != 0]))
        else:
            out.append(("embedding output added", [0] + c))
        out.append(("EAGLE default", list(eagle_default_aux_layers(num_layers))))
        if 0 in c:  # a capture that added the embedding usually also shifted the rest
            out.append(("embedding removed, shifted +1", [i + 1 for i in c if i != 0]))
    else:
        out.append(("EAGLE default", list(eagle_default_aux_layers(num_layers))))
    seen, kept = set(), []
    for name, ids in out:
        key = tuple(ids)
        if len(ids) == k and all(0 <= i <= num_layers for i in ids) and key not in seen:
            seen.add(key)
            kept.append((name, ids))
    return kept


class Doctor:
    def __init__(self, target_dir: str, draft_dir: str, data: Optional[Sequence[str]] = None,
                 steps: int = 3, max_len: int = 128, max_examples: int = 16, dtype: torch.dtype = torch.float32):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.target_dir, self.draft_dir = target_dir, draft_dir
        self.data = list(data) if data else [SAMPLE_TEXT]
        self.steps, self.max_len, self.max_examples = steps, max_len, max_examples
        self.tokenizer = AutoTokenizer.from_pretrained(target_dir)
        self.target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype).eval()
        with open(os.path.join(draft_dir, "config.json")) as f:
            self.draft_raw = json.load(f)
        self.report = DoctorReport(target=target_dir, draft=draft_dir)

    def _add(self, check: str, status: str, message: str, fix: Optional[str] = None) -> None:
        self.report.findings.append(Finding(check, status, message, fix))

    # --- static ------------------------------------------------------------------------------
    def static_checks(self) -> Optional[Eagle3DraftModel]:
        layers, hidden, vocab = target_dims(self.target.config)
        resolution = resolve_aux_layer_ids(self.draft_raw, layers)
        self.report.configured = None if resolution.ids is None else list(resolution.ids)
        self._add("aux layer convention", "ok", resolution.describe())
        try:
            draft = Eagle3DraftModel.from_pretrained(self.draft_dir)
        except ValueError as e:  # the checkpoint itself is inconsistent (e.g. ids vs fc width)
            self._add("aux layers vs fc", "fault", str(e))
            draft = self._load_ignoring_ids()
        if draft is None:
            return None
        self.k = draft.fc.in_features // draft.config.target_hidden_size
        self.draft = draft
        try:
            probe = self._fresh_copy(draft)
            probe.config.aux_layer_ids = self.report.configured
            probe.validate_against_target(self.target.config)
            self._add("draft vs target", "ok", f"aux layers {probe.aux_layer_ids} x {hidden} = "
                                               f"{probe.fc.in_features}, vocabularies {vocab} / "
                                               f"{probe.config.draft_vocab_size}, d2t and t2d consistent")
        except ValueError as e:
            check = "vocabulary map (d2t/t2d)" if ("d2t" in str(e) or "t2d" in str(e)) else "draft vs target"
            fix = ("re-export the draft with the d2t / t2d buffers it was trained with" if "d2t" in str(e) else None)
            self._add(check, "fault", str(e), fix)
        if len(self.tokenizer) > vocab:
            self._add("tokenizer", "fault", f"the tokenizer has {len(self.tokenizer)} tokens but the target's "
                                            f"vocabulary is {vocab}")
        cfg = draft.config
        target_ctx = int(getattr(self.target.config, "max_position_embeddings", 0) or 0)
        if target_ctx and cfg.max_position_embeddings < target_ctx:
            self._add("context", "warning", f"the draft's max_position_embeddings ({cfg.max_position_embeddings}) is "
                                            f"shorter than the target's ({target_ctx}); acceptance may drop on long "
                                            "contexts")
        target_theta = getattr(self.target.config, "rope_theta", None) or \
            (getattr(self.target.config, "rope_parameters", None) or {}).get("rope_theta")
        if target_theta is not None and float(target_theta) != float(cfg.rope_theta):
            self._add("rope", "warning", f"rope_theta differs: draft {cfg.rope_theta}, target {target_theta}")
        target_params = getattr(self.target.config, "rope_parameters", None) or {}
        target_scaling = getattr(self.target.config, "rope_scaling", None) or (
            target_params if target_params.get("rope_type", "default") != "default" else None)
        if _rope_kind(target_scaling) != _rope_kind(cfg.rope_scaling):
            self._add("rope", "warning", f"rope scaling differs: draft {cfg.rope_scaling}, target {target_scaling}")
        w_dtype = draft.fc.weight.dtype
        t_dtype = self.target.get_input_embeddings().weight.dtype
        if w_dtype != t_dtype:  # measured the way eagle3 generate runs it: in the target's dtype
            self._add("dtype", "ok", f"draft weights are saved as {w_dtype}; measured in the target's {t_dtype}")
            draft = self.draft = draft.to(t_dtype)
        return draft

    def _load_ignoring_ids(self) -> Optional[Eagle3DraftModel]:
        """The draft's weights without its aux-layer ids, so that candidates can still be measured."""
        from .draft.checkpoint import _config_from_dict, _normalize_names, _read_state, detect_format
        try:
            state = _normalize_names(_read_state(self.draft_dir))
            model = Eagle3DraftModel(_config_from_dict(self.draft_raw, detect_format(self.draft_raw), state))
            model.load_state_dict(state, strict=False)
            return model
        except Exception as e:  # noqa: BLE001  (reported, not raised: the doctor keeps going)
            self._add("checkpoint", "fault", f"the draft checkpoint cannot be loaded: {e}")
            return None

    @staticmethod
    def _fresh_copy(draft: Eagle3DraftModel) -> Eagle3DraftModel:
        import copy
        return copy.deepcopy(draft)

    # --- empirical ---------------------------------------------------------------------------
    def _batches(self):
        from .train.data import collate, load_examples
        examples = load_examples(self.data, self.tokenizer, self.max_len)[: self.max_examples]
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        return [collate(examples[i:i + 4], pad) for i in range(0, len(examples), 4)]

    def measure(self, ids: Sequence[int]) -> Tuple[List[float], float, float]:
        """acc_i, expected acceptance length and mean soft cross-entropy of the draft reading
        target layers ``ids``."""
        from .engine.capture import AuxHiddenCapture
        from .train.ttt import StepAccuracy, expected_acceptance_length, target_pass, ttt_forward

        draft = self.draft
        draft.bind_embeddings(self.target.get_input_embeddings())
        total = StepAccuracy(self.steps)
        with torch.no_grad(), AuxHiddenCapture(self.target, ids) as capture:
            for ids_t, loss_mask, valid in self._batches():
                logits, aux = target_pass(self.target, capture, ids_t, valid, draft.fc.weight.dtype)
                stats = ttt_forward(draft, aux, logits, ids_t, loss_mask, valid, self.steps)
                total.add(stats, sum(stats.step_loss) / len(stats.step_loss))
        return total.acc, expected_acceptance_length(total.acc), total.mean_loss

    def empirical_checks(self) -> None:
        layers = target_dims(self.target.config)[0]
        configured = self.report.configured
        sets = candidate_layer_sets(configured, self.k, layers)
        for name, ids in sets:
            acc, eal, loss = self.measure(ids)
            self.report.candidates.append(Candidate(name, ids, acc, eal, loss))
        if not self.report.candidates:
            self._add("aux layers (measured)", "fault", "no plausible aux-layer configuration fits the draft's fc")
            return
        best = min(self.report.candidates, key=lambda c: c.loss)
        self.report.best = best.name
        current = next((c for c in self.report.candidates if c.name == "configured"), None)
        figures = ", ".join(f"{c.name} {c.aux_layer_ids}: loss {c.loss:.4f}, acc_0 {c.acc[0]:.3f}, expected "
                            f"acceptance length {c.expected_acceptance_length:.2f}" for c in self.report.candidates)
        if current is None:
            self._add("aux layers (measured)", "fault",
                      f"the configured aux layers {configured} cannot feed the draft's fc; best fit: {best.name} "
                      f"{best.aux_layer_ids} (acc_0 {best.acc[0]:.3f}). Measured: {figures}",
                      _fix_text(best.aux_layer_ids))
        elif best is not current and current.loss - best.loss > max(MIN_LOSS_GAIN,
                                                                    MIN_LOSS_GAIN_RELATIVE * current.loss):
            self._add("aux layers (measured)", "fault",
                      f"the draft fits aux layers {best.aux_layer_ids} ({best.name}) better than the configured "
                      f"{configured}: loss {best.loss:.4f} vs {current.loss:.4f}, acc_0 {best.acc[0]:.3f} vs "
                      f"{current.acc[0]:.3f}, expected acceptance length {best.expected_acceptance_length:.2f} vs "
                      f"{current.expected_acceptance_length:.2f}. Measured: {figures}", _fix_text(best.aux_layer_ids))
        else:
            self._add("aux layers (measured)", "ok",
                      f"the configured aux layers {configured} fit best (loss {current.loss:.4f}, acc_0 "
                      f"{current.acc[0]:.3f}, expected acceptance length {current.expected_acceptance_length:.2f}). "
                      f"Measured: {figures}")

    def run(self) -> DoctorReport:
        draft = self.static_checks()
        if draft is not None:
            self.empirical_checks()
        faults = [f for f in self.report.findings if f.status == "fault"]
        if not faults:
            self.report.verdict = "HEALTHY: no fault found"
        else:
            first = faults[0]
            self.report.verdict = f"FAULT ({len(faults)}): {first.check}: {first.message.split('. Measured')[0]}"
            if first.fix:
                self.report.verdict += f" | fix: {first.fix}"
        return self.report


def diagnose(target: str, draft: str, data: Optional[Sequence[str]] = None, **kwargs) -> DoctorReport:
    """Runs every check; see the module docstring."""
    return Doctor(target, draft, data, **kwargs).run()
