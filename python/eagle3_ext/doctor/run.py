"""``eagle3 doctor``: find why a draft's acceptance is low, with a verdict that says how sure it is.

The costliest EAGLE-3 faults do not crash: a capture of other layers than the draft was trained
on (every id off by one, the embedding output swapped in, a convention mixed up), a flipped
convention flag, an untrained d2t. Acceptance just collapses. The doctor runs

1. static checks: everything the loader validates (aux-layer count x hidden against fc, ids in
   range, vocabularies, d2t / t2d), tokenizer agreement, the draft's context and rope against
   the target's;
2. the capture check against the draft's activation fingerprint, when it has one;
3. measurement: every candidate setup (``candidates``) evaluated on the same tokens as the
   configured one (by default text the target generates itself), paired per token: loss
   against the target and top-1 agreement, with block standard errors (``evidence``);
4. the verdict:
   - FAULT when a static check or the fingerprint fails, or a candidate fits the draft better
     than the configured setup with z >= 3;
   - HEALTHY when the configured setup beats every candidate with z >= 3, or the fingerprint
     matches and it beats every convention-flag candidate with z >= 3;
   - INCONCLUSIVE otherwise, with how many scored tokens would decide;
5. the acceptance length measured by speculative generation for the configured setup and the
   best candidate, on a few prompts.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, List, Optional, Sequence

import torch

from .. import validation
from ..api.config import TreeConfig
from ..api.generator import SpeculativeGenerator
from ..decoding.capture import AuxHiddenCapture
from ..draft import Eagle3DraftModel, fingerprint
from ..draft.aux_layers import config_fix, describe_fix, resolve_aux_layer_ids, target_dims
from ..draft.checkpoint import FINGERPRINT_NAME, config_from_dict, read_checkpoint
from ..errors import BadInputError, BadInputTypeError
from ..preflight.loading import check_context, check_draft_dir, check_target_dir, load_target, load_tokenizer
from ..train.data import collate
from ..train.ttt import StepAccuracy, expected_acceptance_length, target_pass, ttt_forward
from .candidates import Setup, candidate_layer_sets, flag_setups, variant
from .data import EvalData, SAMPLE_TEXT, from_text, self_generated
from .evidence import paired_difference
from .report import Candidate, DoctorReport
from .verdict import judge


STEP_WEIGHT = 0.8  # per-step weight of the token loss, as in training


def _rope_kind(scaling) -> tuple:
    """The parts of a rope scaling dict that change the frequencies."""
    if not scaling:
        return ("default",)
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return ("default",)
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    return (kind,) + tuple(float(scaling[k]) if k in scaling else None for k in keys)


# acc_0 .. acc_{steps-1}: each position is one more draft forward per measured sequence.
MAX_STEPS = 16


class Doctor:
    """See the module docstring. ``data``: text / JSONL files (default: the bundled code sample);
    ``self_generate``: score the target's own continuations of prompts cut from it (default)
    rather than the text itself; ``steps``: draft positions measured; ``acceptance_prompts``:
    prompts for the measured acceptance length (0 skips it)."""

    def __init__(self, target_dir: str, draft_dir: str, data: Optional[Sequence[str]] = None, steps: int = 3,
                 max_len: int = 128, max_examples: int = 32, dtype: torch.dtype = torch.float32,
                 self_generate: bool = True, prompt_tokens: int = 24, acceptance_prompts: int = 4,
                 acceptance_tokens: int = 64):
        validation.integer("doctor: steps", steps, 1, MAX_STEPS)
        for name, value, low in (("max_len", max_len, 8), ("max_examples", max_examples, 1),
                                 ("prompt_tokens", prompt_tokens, 2), ("acceptance_prompts", acceptance_prompts, 0),
                                 ("acceptance_tokens", acceptance_tokens, 1)):
            validation.integer(f"doctor: {name}", value, low)
        if self_generate and prompt_tokens >= max_len:
            raise BadInputError(f"doctor: prompt_tokens ({prompt_tokens}) must be below max_len ({max_len})")
        if data is not None:
            if isinstance(data, (str, os.PathLike)) or not isinstance(data, (list, tuple)) or not data:
                raise BadInputTypeError(f"doctor: data must be None (the bundled sample) or a non-empty list of file "
                                        f"paths, got {data!r}")
            for i, item in enumerate(data):
                validation.existing_file(f"doctor: data[{i}]", item)
        check_target_dir(target_dir)
        check_draft_dir(draft_dir)
        self.target_dir, self.draft_dir = target_dir, draft_dir
        self.data_paths = [SAMPLE_TEXT] if data is None else list(data)
        self.steps, self.max_len, self.max_examples = steps, max_len, max_examples
        self.self_generate, self.prompt_tokens = self_generate, prompt_tokens
        self.acceptance_prompts, self.acceptance_tokens = acceptance_prompts, acceptance_tokens
        self.target = load_target(target_dir, dtype).eval()
        self.tokenizer = load_tokenizer(target_dir)
        check_context(self.target, "doctor: max_len", max_len)
        self.draft_raw, self.draft_format, _ = read_checkpoint(draft_dir)
        self.report = DoctorReport(target=target_dir, draft=draft_dir)
        self.draft: Optional[Eagle3DraftModel] = None
        self.k = 0

    # --- static ------------------------------------------------------------------------------
    def static_checks(self) -> Optional[Eagle3DraftModel]:
        rep = self.report
        layers, hidden, vocab = target_dims(self.target.config)
        resolution = resolve_aux_layer_ids(self.draft_raw, layers)
        rep.configured = None if resolution.ids is None else list(resolution.ids)
        rep.add("aux layer convention", "ok", resolution.describe())
        try:
            draft = Eagle3DraftModel.from_pretrained(self.draft_dir)
        except ValueError as e:  # the checkpoint itself is inconsistent (e.g. ids vs fc width)
            rep.add("aux layers vs fc", "fault", str(e))
            draft = self._load_ignoring_ids()
        if draft is None:
            return None
        self.k = draft.fc.in_features // draft.config.target_hidden_size
        try:
            probe = variant(draft, Setup("configured", rep.configured or []))
            probe.config.aux_layer_ids = rep.configured
            probe.validate_against_target(self.target.config)
            rep.add("draft vs target", "ok", f"aux layers {rep.configured} x {hidden} = {draft.fc.in_features}, "
                                             f"vocabularies {vocab} / {draft.config.draft_vocab_size}, d2t and t2d "
                                             "consistent")
        except ValueError as e:
            vocab_map = "d2t" in str(e) or "t2d" in str(e)
            rep.add("vocabulary map (d2t/t2d)" if vocab_map else "draft vs target", "fault", str(e),
                    "restore the trained d2t / t2d buffers (target id = i + d2t[i])" if vocab_map else None)
            if vocab_map:
                rep.recommended_config["d2t"] = ("restore the trained buffer: draft id i means target id i + d2t[i]; "
                                                 "an all-zero d2t maps every draft id to itself")
        if len(self.tokenizer) > vocab:
            rep.add("tokenizer", "fault", f"the tokenizer has {len(self.tokenizer)} tokens but the target's "
                                          f"vocabulary is {vocab}")
        cfg = draft.config
        target_ctx = int(getattr(self.target.config, "max_position_embeddings", 0) or 0)
        if target_ctx and cfg.max_position_embeddings < target_ctx:
            rep.add("context", "warning", f"the draft's max_position_embeddings ({cfg.max_position_embeddings}) is "
                                          f"shorter than the target's ({target_ctx}); acceptance may drop on long "
                                          "contexts")
        target_params = getattr(self.target.config, "rope_parameters", None) or {}
        target_theta = getattr(self.target.config, "rope_theta", None) or target_params.get("rope_theta")
        if target_theta is not None and float(target_theta) != float(cfg.rope_theta):
            rep.add("rope", "warning", f"rope_theta differs: draft {cfg.rope_theta}, target {target_theta}")
        target_scaling = getattr(self.target.config, "rope_scaling", None) or (
            target_params if target_params.get("rope_type", "default") != "default" else None)
        if _rope_kind(target_scaling) != _rope_kind(cfg.rope_scaling):
            rep.add("rope", "warning", f"rope scaling differs: draft {cfg.rope_scaling}, target {target_scaling}")
        w_dtype, t_dtype = draft.fc.weight.dtype, self.target.get_input_embeddings().weight.dtype
        if w_dtype != t_dtype:  # measured the way eagle3 generate runs it: in the target's dtype
            rep.add("dtype", "ok", f"draft weights are saved as {w_dtype}; measured in the target's {t_dtype}")
            draft = draft.to(t_dtype)
        draft.bind_embeddings(self.target.get_input_embeddings())
        self.draft = draft
        return draft

    def _load_ignoring_ids(self) -> Optional[Eagle3DraftModel]:
        """The draft's weights without its aux-layer ids, so that candidates can still be measured."""
        try:
            raw, fmt, state = read_checkpoint(self.draft_dir)
            model = Eagle3DraftModel(config_from_dict(raw, fmt, state))
            model.load_state_dict(state, strict=False)
            return model
        except Exception as e:  # noqa: BLE001  (reported, not raised: the doctor keeps going)
            self.report.add("checkpoint", "fault", f"the draft checkpoint cannot be loaded: {e}")
            return None

    # --- the fingerprint ---------------------------------------------------------------------
    def fingerprint_check(self) -> Optional[fingerprint.CaptureCheck]:
        fp = self.draft.config.fingerprint
        if fp is None:
            self.report.add("activation fingerprint", "warning",
                            "the draft carries no activation fingerprint; the capture is judged on measurement "
                            "alone (--write-fingerprint stores one once the verdict is HEALTHY)")
            return None
        if self.report.configured is None or len(self.report.configured) != len(fp.get("aux_layer_ids", [])):
            self.report.add("activation fingerprint", "fault",
                            f"the configured aux layers {self.report.configured} cannot be compared with the "
                            f"fingerprint's {fp.get('aux_layer_ids')}")
            return None
        result = fingerprint.check(fp, self.target, self.report.configured)
        self.report.fingerprint = {"ok": result.ok, "trained_aux_layer_ids": result.trained_ids,
                                   "looks_like": result.looks_like, "distance": result.distance,
                                   "tolerance": result.tolerance, "message": result.describe()}
        if result.ok:
            self.report.add("activation fingerprint", "ok", result.describe())
        else:
            fix = describe_fix(result.trained_ids) if result.problem is None else None
            self.report.add("activation fingerprint", "fault", result.describe(), fix)
        return result

    # --- measurement -------------------------------------------------------------------------
    def eval_data(self) -> EvalData:
        if self.self_generate:
            data = self_generated(self.target, self.tokenizer, self.data_paths, self.max_examples,
                                  self.prompt_tokens, self.max_len - self.prompt_tokens)
        else:
            data = from_text(self.tokenizer, self.data_paths, self.max_len, self.max_examples)
        self.report.data = {"source": data.source, "sequences": len(data.sequences),
                            "scored_tokens": data.scored_tokens, "files": self.data_paths}
        return data

    def measure(self, setups: List[Setup], data: EvalData) -> Dict[str, Dict[str, Any]]:
        """Per setup: per-sequence per-token loss and hit tensors over the commonly scored tokens,
        plus the aggregate acc_i and loss."""
        indices = sorted({i for s in setups for i in s.aux_layer_ids})
        models = {s.name: variant(self.draft, s) for s in setups}
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        out = {s.name: {"loss": [], "hit": [], "acc": StepAccuracy(self.steps)} for s in setups}
        weights = torch.tensor([STEP_WEIGHT ** i for i in range(self.steps)], dtype=torch.float64)
        dtype = self.draft.fc.weight.dtype
        with torch.no_grad(), AuxHiddenCapture(self.target, indices) as capture:
            for start in range(0, len(data.sequences), 4):
                ids, loss_mask, valid = collate(data.sequences[start:start + 4], pad)
                logits, states = target_pass(self.target, capture, ids, valid, dtype)
                by_index = dict(zip(indices, states))
                for s in setups:
                    aux = [by_index[i] for i in s.aux_layer_ids]
                    stats = ttt_forward(models[s.name], aux, logits, ids, loss_mask, valid, self.steps, per_token=True)
                    out[s.name]["acc"].add(stats, sum(stats.step_loss) / len(stats.step_loss))
                    scored = torch.stack(stats.token_scored).all(0)                       # [B, T]
                    ce = torch.stack(stats.token_ce).double()                             # [steps, B, T]
                    loss = (ce * weights[:, None, None]).sum(0) / weights.sum()
                    hit = torch.stack(stats.token_hit).double().mean(0)
                    for b in range(ids.shape[0]):
                        out[s.name]["loss"].append(loss[b][scored[b]])
                        out[s.name]["hit"].append(hit[b][scored[b]])
        return out

    def candidates(self) -> List[Setup]:
        layers = target_dims(self.target.config)[0]
        setups = [Setup(name, ids) for name, ids in candidate_layer_sets(self.report.configured, self.k, layers)]
        fp = self.draft.config.fingerprint
        if fp is not None and len(fp["aux_layer_ids"]) == self.k and not any(
                s.aux_layer_ids == list(fp["aux_layer_ids"]) for s in setups):
            setups.append(Setup("fingerprint's layers", [int(i) for i in fp["aux_layer_ids"]]))
        base = next((s for s in setups if s.name == "configured"), None)
        if base is not None:
            setups += flag_setups(self.draft, base.aux_layer_ids)
        return setups

    def empirical_checks(self, data: EvalData) -> None:
        rep = self.report
        setups = self.candidates()
        if not setups:
            rep.add("aux layers (measured)", "fault", "no plausible aux-layer configuration fits the draft's fc")
            return
        measured = self.measure(setups, data)
        reference = measured.get("configured")
        for s in setups:
            m = measured[s.name]
            c = Candidate(s.name, s.aux_layer_ids, dict(s.flags), m["acc"].acc,
                          expected_acceptance_length(m["acc"].acc), m["acc"].mean_loss)
            if reference is not None and s.name != "configured":
                gain = paired_difference(reference["loss"], m["loss"])
                c.loss_gain, c.loss_gain_se, c.z = gain.mean, gain.se, gain.z
                c.z_acc = paired_difference(m["hit"], reference["hit"]).z
                c.tokens_to_decide = gain.tokens_to_decide()
            rep.candidates.append(c)
        best = min(rep.candidates, key=lambda c: c.loss)
        rep.best = best.name
        self._judge()

    def _judge(self) -> None:
        rep = self.report
        by_name = {c.name: c for c in rep.candidates}
        configured = by_name.get("configured")
        figures = "; ".join(f"{c.name} {c.aux_layer_ids}{' ' + str(c.flags) if c.flags else ''}: loss {c.loss:.4f}, "
                            f"acc_0 {c.acc[0]:.3f}, z {c.z:+.1f}" for c in rep.candidates)
        if configured is None:
            best = min(rep.candidates, key=lambda c: c.loss)
            rep.add("aux layers (measured)", "fault",
                    f"the configured aux layers {rep.configured} cannot feed the draft's fc; best fit: {best.name} "
                    f"{best.aux_layer_ids} (loss {best.loss:.4f}, acc_0 {best.acc[0]:.3f}). Measured: {figures}",
                    describe_fix(best.aux_layer_ids))
            self._recommend(best)
            return
        capture_ok = bool(rep.fingerprint and rep.fingerprint["ok"])
        decision = judge([c for c in rep.candidates if c.name != "configured"], capture_ok)
        if decision.status == "fault":
            w = decision.winner
            what = (f"aux layers {w.aux_layer_ids} ({w.name})" if not w.flags else
                    f"the convention {w.flags} ({w.name})")
            rep.add("setup (measured)", "fault",
                    f"the draft fits {what} better than the configured setup: loss {w.loss:.4f} vs "
                    f"{configured.loss:.4f} per token (gain {w.loss_gain:.4f} +- {w.loss_gain_se:.4f}, z = {w.z:.1f}), "
                    f"acc_0 {w.acc[0]:.3f} vs {configured.acc[0]:.3f}. Measured: {figures}",
                    describe_fix(w.aux_layer_ids) if not w.flags else
                    "set " + ", ".join(f"\"{k}\": {json.dumps(v)}" for k, v in w.flags.items()) + " in config.json")
            self._recommend(w)
        elif decision.status == "ok":
            basis = ("the activation fingerprint matches and every flipped convention fits worse with z <= -3"
                     if capture_ok else "every candidate fits worse with z <= -3")
            rep.add("setup (measured)", "ok",
                    f"the configured setup fits best: {basis} (loss {configured.loss:.4f}, acc_0 "
                    f"{configured.acc[0]:.3f}). Measured: {figures}")
        else:
            closest = max(decision.undecided, key=lambda c: c.z)
            need = max(c.tokens_to_decide for c in decision.undecided)
            rep.add("setup (measured)", "inconclusive",
                    f"the configured setup and {closest.name} {closest.aux_layer_ids} cannot be told apart on "
                    f"{rep.data.get('scored_tokens')} scored tokens (loss gain {closest.loss_gain:+.4f} +- "
                    f"{closest.loss_gain_se:.4f}, z = {closest.z:+.1f}); about {need} scored tokens would decide "
                    f"(more --data or --max-examples). Measured: {figures}")

    def _recommend(self, winner: Candidate) -> None:
        rep = self.report
        rep.recommended_aux_layer_ids = list(winner.aux_layer_ids)
        if winner.flags:
            rep.recommended_config.update(winner.flags)
        else:
            rep.recommended_config.update(config_fix(winner.aux_layer_ids))

    # --- acceptance by speculative generation -------------------------------------------------
    def acceptance(self, data: EvalData) -> None:
        if self.acceptance_prompts == 0:
            return
        prompts = [e.input_ids[:self.prompt_tokens].tolist() for e in data.sequences][: self.acceptance_prompts]
        names = ["configured"] + ([self.report.best] if self.report.best not in (None, "configured") else [])
        setups = {s.name: s for s in self.candidates()}
        for name in names:
            if name not in setups:
                continue
            model = variant(self.draft, setups[name])
            try:
                gen = SpeculativeGenerator(self.target, model, TreeConfig.chain(max(self.steps, 4)), strict=False)
                out = gen.generate(prompts, max_new_tokens=self.acceptance_tokens, return_dict_in_generate=True)
            except ValueError as e:
                self.report.acceptance[name] = {"error": str(e)}
                continue
            self.report.acceptance[name] = {"acceptance_length": out.stats.acceptance_length,
                                            "prompts": len(prompts), "new_tokens": out.stats.new_tokens}
            for c in self.report.candidates:
                if c.name == name:
                    c.acceptance_length = out.stats.acceptance_length

    # --- verdict ------------------------------------------------------------------------------
    def run(self) -> DoctorReport:
        started = time.perf_counter()
        rep = self.report
        draft = self.static_checks()
        if draft is not None:
            fp = self.fingerprint_check()
            if fp is not None and not fp.ok and fp.problem is None and None not in fp.looks_like:
                rep.recommended_aux_layer_ids = list(fp.trained_ids)
                rep.recommended_config.update(config_fix(fp.trained_ids))
            if any(f.check == "vocabulary map (d2t/t2d)" for f in rep.findings):
                rep.add("setup (measured)", "skipped", "not measured: with a broken vocabulary map every draft token "
                                                       "maps to the wrong target token, whatever the capture")
            else:
                data = self.eval_data()
                self.empirical_checks(data)
                self.acceptance(data)
        faults = [f for f in rep.findings if f.status == "fault"]
        if faults:
            first = faults[0]
            rep.verdict = f"FAULT ({len(faults)}): {first.check}: {first.message.split('. Measured')[0]}"
            if first.fix:
                rep.verdict += f" | fix: {first.fix}"
        elif any(f.status == "inconclusive" for f in rep.findings):
            f = next(f for f in rep.findings if f.status == "inconclusive")
            rep.verdict = f"INCONCLUSIVE: {f.message.split('. Measured')[0]}"
        elif draft is not None:
            rep.verdict = "HEALTHY: " + next(f.message.split(". Measured")[0] for f in rep.findings
                                             if f.check == "setup (measured)")
        else:
            rep.verdict = "INCONCLUSIVE: nothing could be measured"
        rep.elapsed_s = time.perf_counter() - started
        return rep

    def write_fingerprint(self, data: Optional[EvalData] = None) -> str:
        """Records the fingerprint of the configured layers and stores it with the draft (in
        config.json for the eagle3_ext format, else in a sidecar). Only after a HEALTHY verdict."""
        if not self.report.healthy:
            raise BadInputError("--write-fingerprint: the verdict is not HEALTHY "
                                f"({self.report.verdict.split(':')[0]}); fix the setup first, or the fingerprint "
                                "would record the wrong layers")
        data = data or self.eval_data()
        probe = fingerprint.probe_from_sequences(e.input_ids.tolist() for e in data.sequences)
        fp = fingerprint.record(self.target, self.report.configured, probe)
        if self.draft_format == "eagle3_ext":
            path = os.path.join(self.draft_dir, "config.json")
            raw = dict(self.draft_raw)
            raw["eagle3_ext"] = dict(raw["eagle3_ext"], fingerprint=fp)
        else:
            path, raw = os.path.join(self.draft_dir, FINGERPRINT_NAME), fp
        with open(path, "w") as f:
            json.dump(raw, f, indent=2)
        return path


def diagnose(target: str, draft: str, data: Optional[Sequence[str]] = None, write_fingerprint: bool = False,
             **kwargs) -> DoctorReport:
    """Runs every check; see the module docstring. With ``write_fingerprint`` a draft without a
    fingerprint gets one after a HEALTHY verdict (the path is in ``report.data``)."""
    doctor = Doctor(target, draft, data, **kwargs)
    report = doctor.run()
    if write_fingerprint:
        report.data["fingerprint_written"] = doctor.write_fingerprint()
    return report
