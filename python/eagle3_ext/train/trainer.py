"""The draft trainer: online target forwards, TTT unrolling, evaluation, checkpoints, export."""

from __future__ import annotations

import json
import logging
import math
import os
import random
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

import torch

from .. import validation
from ..draft import Eagle3DraftConfig, Eagle3DraftModel
from ..draft.aux_layers import CONVENTION_DOC, target_dims
from ..draft.config import SUPPORTED_ROPE_TYPES
from ..dtypes import DTYPES, check_dtype_name
from ..errors import BadInputError, MissingPathError
from ..linear import float32_gemms
from ..preflight.loading import check_device, default_device
from .cache import CAPTURE_FIELDS, CachedTarget
from .data import batches
from .data_parallel import DataParallel
from .interrupt import StopRequest
from .layout import make_layout
from .target_source import OnlineTarget, split_examples, vocab_mapping_for
from .ttt import StepAccuracy, TTTStats, expected_acceptance_length, ttt_forward

logger = logging.getLogger(__name__)

# Each training-time-test step is one more unrolled draft forward held for backward.
MAX_TTT_STEPS = 32

@dataclass
class TrainConfig:
    """Everything ``eagle3 train`` takes. Lengths in tokens; lr in AdamW units."""

    target: Optional[str]                      # None with from_cache
    data: Optional[List[str]]                  # None with from_cache
    out: str
    aux_layers: Optional[List[int]] = None     # internal convention; default [2, L//2, L-3]
    draft_vocab_size: Optional[int] = None     # default min(target vocab, 32000)
    ttt_steps: int = 7
    epochs: int = 1
    lr: float = 1e-3
    warmup_steps: int = 20
    batch_tokens: int = 4096
    max_len: int = 512
    dtype: str = "float32"                     # the target's weights
    amp: Optional[str] = None                  # "bfloat16" / "float16": draft matmuls under autocast
    val_fraction: float = 0.1
    val_max_examples: int = 64                 # caps the held-out share so evaluation stays cheap
    eval_every: int = 50
    seed: int = 0
    resume: bool = False
    init_from: Optional[str] = None            # start from this draft's weights (a fresh optimizer and schedule)
    compile: bool = False                      # the per-step loss through torch.compile (ttt.compiled_soft_ce)
    export_specforge: bool = True
    export_vllm: bool = True
    # Convention flags of the new draft (Eagle3DraftConfig documents each).
    norm_before_residual: bool = False
    fc_norm: bool = False
    norm_before_fc: bool = False
    norm_output: bool = False
    max_steps: Optional[int] = None            # stop early (for quick runs and tests)
    progress: bool = True
    from_cache: Optional[str] = None           # an `eagle3 train capture` directory instead of target + data
    tp_size: int = 1                           # ranks the target is sharded over (torchrun)
    device: Optional[str] = None               # default: this process's GPU if torch sees one, else the CPU

    def validate(self) -> None:
        """Raises TypeError / ValueError naming the first bad field; 0, "" and [] are errors,
        never "the default" (None is)."""
        if self.from_cache is not None:
            validation.existing_dir("from_cache", self.from_cache)
            for name in ("target", "data"):
                if getattr(self, name) is not None:
                    raise BadInputError(f"{name} must be None with from_cache (the cache holds what the target gave)")
            if self.tp_size != 1:
                raise BadInputError(f"tp_size must be 1 with from_cache (no target runs), got {self.tp_size}")
        else:
            validation.path("target", self.target)
            validation.existing_files("data", self.data)
        validation.integer("tp_size", self.tp_size, 1)
        if self.init_from is not None:
            validation.existing_dir("init_from", self.init_from)
        validation.boolean("compile", self.compile)
        check_device(self.device)
        validation.output_dir("out", self.out)
        if self.aux_layers is not None:
            validation.distinct_items("aux_layers", self.aux_layers,
                                      "None (EAGLE's default) or a non-empty list of layer indices",
                                      lambda name, layer: validation.integer(name, layer, 0))
        if self.draft_vocab_size is not None:
            validation.integer("draft_vocab_size", self.draft_vocab_size, 1)
        validation.integer("ttt_steps", self.ttt_steps, 1, MAX_TTT_STEPS)
        for name, low in (("epochs", 1), ("batch_tokens", 1), ("max_len", 4), ("eval_every", 1),
                          ("val_max_examples", 1), ("warmup_steps", 0)):
            validation.integer(name, getattr(self, name), low)
        if self.max_steps is not None:
            validation.integer("max_steps", self.max_steps, 1)
        validation.integer("seed", self.seed, 0, 2**63 - 1)
        validation.number("lr", self.lr, 0, exclusive_minimum=True)
        validation.number("val_fraction", self.val_fraction, 0, 1, exclusive_minimum=True)
        if self.val_fraction >= 1:
            raise BadInputError("val_fraction must be below 1 (some data must be left to train on), got "
                                f"{self.val_fraction}")
        check_dtype_name("dtype", self.dtype)
        if self.amp is not None:
            validation.choice("amp", self.amp, ("bfloat16", "float16"))
        if self.batch_tokens < self.max_len:
            raise BadInputError(f"batch_tokens ({self.batch_tokens}) must hold one sequence of max_len "
                                f"({self.max_len}) tokens")


@dataclass
class TrainResult:
    out: str
    step: int
    metrics: Dict[str, Any] = field(default_factory=dict)


def draft_config_for(target_config, aux_layers: List[int], draft_vocab_size: int, **flags) -> Eagle3DraftConfig:
    """A one-layer draft shaped like one of the target's decoder layers; ``flags`` are its
    convention flags (norm_before_residual, fc_norm, norm_before_fc, norm_output)."""
    layers, hidden, vocab = target_dims(target_config)
    get = lambda k, d=None: getattr(target_config, k, d)  # noqa: E731
    rope = get("rope_parameters") or {}
    scaling = get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind not in SUPPORTED_ROPE_TYPES:
        # The draft's positions are its own: it is trained with plain rope at the target's theta.
        logger.warning("the target's rope type %r is not implemented in the draft; the draft uses default rope", kind)
        scaling = None
    heads = get("num_attention_heads")
    return Eagle3DraftConfig(
        hidden_size=hidden, intermediate_size=get("intermediate_size"), num_attention_heads=heads,
        num_key_value_heads=get("num_key_value_heads") or heads, head_dim=get("head_dim") or hidden // heads,
        vocab_size=vocab, draft_vocab_size=draft_vocab_size, rms_norm_eps=get("rms_norm_eps", 1e-6),
        rope_theta=get("rope_theta") or rope.get("rope_theta", 10000.0), rope_scaling=scaling,
        max_position_embeddings=get("max_position_embeddings", 2048), aux_layer_ids=list(aux_layers),
        aux_layer_ids_source="eagle3 train", target_num_hidden_layers=layers, **flags)


# What a resumed run must share with the run that wrote the checkpoint, or it would not continue
# the same training (paths, max_steps, eval_every and the exports may change).
RESUME_FIELDS = ("aux_layers", "draft_vocab_size", "ttt_steps", "epochs", "lr", "warmup_steps", "batch_tokens",
                 "max_len", "dtype", "amp", "val_fraction", "val_max_examples", "seed", "norm_before_residual",
                 "fc_norm", "norm_before_fc", "norm_output")


def _check_init_from(draft: Eagle3DraftModel, config: TrainConfig, aux: List[int]) -> None:
    """The draft ``init_from`` names is the one trained on: options that would shape another draft
    are errors, not silently ignored."""
    path = config.init_from
    if config.aux_layers is not None and list(draft.aux_layer_ids) != aux:
        raise BadInputError(f"aux_layers {aux} differ from init_from's ({list(draft.aux_layer_ids)} in {path}); "
                            "leave aux_layers unset to train the draft as it is")
    if config.draft_vocab_size is not None and config.draft_vocab_size != draft.config.draft_vocab_size:
        raise BadInputError(f"draft_vocab_size {config.draft_vocab_size} differs from init_from's "
                            f"({draft.config.draft_vocab_size} in {path}); leave it unset")
    for flag in ("norm_before_residual", "fc_norm", "norm_before_fc", "norm_output"):
        if getattr(config, flag) and not getattr(draft.config, flag):
            raise BadInputError(f"{flag}=True, but the init_from draft in {path} was built without it; the "
                                "convention flags of an init_from draft are its own")


def _check_resumable(saved: Dict[str, Any], config: TrainConfig) -> None:
    defaulted = {"aux_layers"} if config.aux_layers is None else set()  # None resumes with the saved ids
    differ = [f"{k} (checkpoint {saved[k]!r}, now {getattr(config, k)!r})" for k in RESUME_FIELDS
              if k in saved and saved[k] != getattr(config, k) and k not in defaulted]
    if differ:
        raise BadInputError(f"resume: the checkpoint was trained with other options: {', '.join(differ)}; resume with "
                            "the same options, or train into another --out")


class Trainer:
    def __init__(self, config: TrainConfig):
        config.validate()
        self.config = config
        self.layout = make_layout(config.tp_size)
        self.dp = DataParallel(self.layout)
        torch.manual_seed(config.seed)
        device = check_device(config.device) or default_device()
        if config.from_cache is not None:
            self.source = CachedTarget(config.from_cache)
            _adopt_cache_options(config, self.source.manifest)
            self.train_set, self.val = self.source.split()
        else:
            self.source = OnlineTarget(config.target, DTYPES[config.dtype], config.max_len, self.layout, device)
            examples = self.source.load(config.data, config.max_len)
            self.train_set, self.val = split_examples(examples, config.val_fraction, config.val_max_examples,
                                                      config.seed)
        vocab = self.source.vocab
        target_config = self.source.config
        aux = self.source.default_aux_layers() if config.aux_layers is None else list(config.aux_layers)

        ckpt = os.path.join(config.out, "checkpoint")
        self.state = {"step": 0, "epoch": 0, "batch_in_epoch": 0}
        if config.resume and os.path.exists(os.path.join(ckpt, "trainer_state.pt")):
            self.draft = Eagle3DraftModel.from_pretrained(os.path.join(ckpt, "draft"), target_config=target_config)
            saved = torch.load(os.path.join(ckpt, "trainer_state.pt"), weights_only=False)
            _check_resumable(saved.get("config", {}), config)
            self.state = saved["state"]
        elif config.resume:
            raise MissingPathError(f"resume: no checkpoint under {ckpt} to continue from (train without --resume "
                                   "to start)")
        elif config.init_from is not None:
            self.draft = Eagle3DraftModel.from_pretrained(config.init_from, target_config=target_config).float()
            _check_init_from(self.draft, config, aux)
        else:
            draft_vocab = min(vocab, 32000) if config.draft_vocab_size is None else config.draft_vocab_size
            if draft_vocab > vocab:
                raise BadInputError(f"draft_vocab_size {draft_vocab} is larger than the target "
                                    f"vocabulary ({vocab})")
            flags = {k: getattr(config, k) for k in ("norm_before_residual", "fc_norm", "norm_before_fc",
                                                     "norm_output")}
            self.draft = Eagle3DraftModel(draft_config_for(target_config, aux, draft_vocab, **flags))
            if config.from_cache is not None:
                d2t, t2d = self.source.vocab_mapping()
            else:
                d2t, t2d = vocab_mapping_for(self.train_set, vocab, draft_vocab)
            with torch.no_grad():
                self.draft.d2t.copy_(d2t)
                self.draft.t2d.copy_(t2d)
                self._init_from_target()
        self.draft.to(device)
        self.dp.broadcast_module(self.draft)  # every replica starts from rank 0's draft
        self.draft.bind_embeddings(self.source.embeddings().to(device))
        self.draft.validate_against_target(target_config)
        if self.draft.config.fingerprint is None:
            # What the target's states at the trained layers look like, checked before the draft runs.
            self.draft.config.fingerprint = self.source.fingerprint(
                self.draft.aux_layer_ids, (e.input_ids.tolist() for e in (self.val or self.train_set)))
        self.source.start(self.draft.aux_layer_ids, self.draft.d2t)
        self.optimizer = torch.optim.AdamW(self.draft.parameters(), lr=config.lr, betas=(0.9, 0.95))
        if config.resume:
            self.optimizer.load_state_dict(saved["optimizer"])
        self.history: List[Dict[str, Any]] = self._load_history()
        self.train_losses: List[Dict[str, float]] = self._load_history("train_loss")
        self.throughput = {"tokens": 0, "seconds": 0.0}
        logger.info("draft reads aux layers %s (%s)", self.draft.aux_layer_ids, CONVENTION_DOC)

    def _init_from_target(self) -> None:
        # lm_head rows of the draft vocabulary and the final norm start from the target's.
        ids = torch.arange(self.draft.config.draft_vocab_size) + self.draft.d2t
        rows = self.source.head_rows(ids)
        if rows is not None and rows.shape[1] == self.draft.config.hidden_size:
            self.draft.lm_head.weight.copy_(rows)
        norm = self.source.final_norm()
        if norm is not None:
            self.draft.norm.weight.copy_(norm)

    def _load_history(self, key: str = "evals") -> List[Dict[str, Any]]:
        path = os.path.join(self.config.out, "metrics.json")
        if self.config.resume and os.path.exists(path):
            with open(path) as f:
                return json.load(f).get(key, [])
        return []

    def _lr(self, step: int, total: int) -> float:
        warm = self.config.warmup_steps
        if step < warm:
            return self.config.lr * (step + 1) / warm
        progress = (step - warm) / max(1, total - warm)
        return self.config.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    def _run_batch(self, batch, train: bool) -> TTTStats:
        """This rank's share of a global batch: its loss (normalised by the whole batch's counts)
        and its counts."""
        steps = self.config.ttt_steps
        device = self.draft.fc.weight.device
        batch = self.dp.local(batch)
        if not batch:  # fewer examples than ranks: this one only joins the count reduction
            self.dp.sum(torch.zeros(steps, device=device))
            return TTTStats(loss=torch.zeros((), device=device), step_loss=[0.0] * steps, correct=[0] * steps,
                            counted=[0] * steps)
        ids, loss_mask, valid, aux, target = self.source.batch(batch, device)
        amp = DTYPES[self.config.amp] if self.config.amp else None
        # Master weights and the losses stay fp32; autocast runs the draft's matmuls in ``amp``.
        # Without it, a float32 draft's products take linear.py's many-row routes. Under autocast
        # they stay off: the routing mode sees F.linear before autocast does and would bypass it.
        routes = float32_gemms(device, self.draft.fc.weight.dtype, ids.numel()) if amp is None else nullcontext()
        with torch.set_grad_enabled(train), torch.autocast(device.type, dtype=amp, enabled=amp is not None), routes:
            return ttt_forward(self.draft, aux, target, ids, loss_mask, valid, steps,
                               reduce_counts=self.dp.sum if self.dp.enabled else None, compiled=self.config.compile)

    def _global(self, stats: TTTStats) -> TTTStats:
        """The whole batch's loss and counts (summed over the ranks), without gradients."""
        if not self.dp.enabled:
            return TTTStats(loss=stats.loss.detach(), correct=stats.correct, counted=stats.counted)
        steps = len(stats.correct)
        t = torch.tensor([float(stats.loss.detach())] + stats.correct + stats.counted, dtype=torch.float64,
                         device=self.draft.fc.weight.device)
        t = self.dp.sum(t).tolist()
        return TTTStats(loss=torch.tensor(t[0]), correct=[int(c) for c in t[1:1 + steps]],
                        counted=[int(c) for c in t[1 + steps:]])

    def evaluate(self) -> Dict[str, Any]:
        self.draft.eval()
        total = StepAccuracy(self.config.ttt_steps)
        for batch in batches(self.val, self.config.batch_tokens, range(len(self.val))):
            stats = self._global(self._run_batch(batch, train=False))
            total.add(stats, float(stats.loss))
        self.draft.train()
        return {"step": self.state["step"], "val_loss": total.mean_loss, "acc": total.acc,
                "expected_acceptance_length": expected_acceptance_length(total.acc)}

    def _save(self, metrics: Dict[str, Any]) -> None:
        """Rank 0 writes; the others wait until it has (a resume may follow at any world size)."""
        if not self.dp.is_main:
            self.dp.barrier()
            return
        out = self.config.out
        ckpt = os.path.join(out, "checkpoint")
        os.makedirs(ckpt, exist_ok=True)
        self.draft.save_pretrained(os.path.join(ckpt, "draft"))
        torch.save({"state": self.state, "optimizer": self.optimizer.state_dict(),
                    "config": asdict(self.config)}, os.path.join(ckpt, "trainer_state.pt"))
        with open(os.path.join(out, "metrics.json"), "w") as f:
            json.dump({"evals": self.history, "final": metrics, "train_loss": self.train_losses,
                       "world_size": self.layout.world, "layout": self.layout.describe()}, f, indent=2)
        self.dp.barrier()

    def train(self) -> TrainResult:
        from tqdm.auto import tqdm

        cfg = self.config
        epoch_batches = [list(batches(self.train_set, cfg.batch_tokens, self._order(e))) for e in range(cfg.epochs)]
        total = sum(len(b) for b in epoch_batches)
        if cfg.max_steps is not None:
            total = min(total, cfg.max_steps)
        self.draft.train()
        bar = tqdm(total=total, initial=self.state["step"], desc="eagle3 train", file=sys.stderr,
                   disable=not cfg.progress or not self.dp.is_main, dynamic_ncols=True)
        started = time.time()
        if not self.history:  # the untrained draft, so the log shows how far training moved it
            self._eval_and_save(started)
        metrics: Dict[str, Any] = self.history[-1]
        with StopRequest() as stop:
            metrics = self._loop(epoch_batches, total, bar, started, metrics, stop)
        bar.close()
        if not metrics or metrics.get("step") != self.state["step"]:
            metrics = self._eval_and_save(started)
        metrics.update(self._throughput())
        self.export()
        return TrainResult(out=cfg.out, step=self.state["step"], metrics=metrics)

    def _throughput(self) -> Dict[str, Any]:
        """Training tokens per second over the steps of this run (global batches, evaluations
        left out) and each rank's peak memory."""
        seconds = self.throughput["seconds"]
        if torch.cuda.is_available() and self.draft.fc.weight.is_cuda:
            peak = torch.cuda.max_memory_allocated() / 2**20
        else:
            import resource
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        peaks = [peak] * self.layout.world
        if self.layout.world > 1:
            import torch.distributed as dist
            dist.all_gather_object(peaks, peak)
        return {"train_tokens_per_s": self.throughput["tokens"] / seconds if seconds else 0.0,
                "peak_memory_mib_per_rank": peaks, "world_size": self.layout.world,
                "layout": self.layout.describe()}

    def _loop(self, epoch_batches, total: int, bar, started: float, metrics: Dict[str, Any],
              stop: StopRequest) -> Dict[str, Any]:
        cfg = self.config
        while self.state["step"] < total and self.state["epoch"] < cfg.epochs:
            todo = epoch_batches[self.state["epoch"]]
            while self.state["batch_in_epoch"] < len(todo) and self.state["step"] < total:
                batch = todo[self.state["batch_in_epoch"]]
                for group in self.optimizer.param_groups:
                    group["lr"] = self._lr(self.state["step"], total)
                step_started = time.perf_counter()
                stats = self._run_batch(batch, train=True)
                self.optimizer.zero_grad(set_to_none=True)
                if stats.loss.requires_grad:  # (a rank without examples in this batch has no graph)
                    stats.loss.backward()
                self.dp.sum_gradients(self.draft.parameters())
                torch.nn.utils.clip_grad_norm_(self.draft.parameters(), 1.0)
                self.optimizer.step()
                self.state["step"] += 1
                self.state["batch_in_epoch"] += 1
                whole = self._global(stats)
                self.train_losses.append({"step": self.state["step"], "loss": float(whole.loss)})
                self.throughput["tokens"] += sum(e.input_ids.numel() for e in batch)
                self.throughput["seconds"] += time.perf_counter() - step_started
                acc0 = whole.correct[0] / max(1, whole.counted[0])
                bar.set_postfix(loss=f"{float(whole.loss):.3f}", acc0=f"{acc0:.2f}")
                bar.update(1)
                if self.state["step"] % cfg.eval_every == 0 or self.state["step"] == total:
                    metrics = self._eval_and_save(started)
                if stop.requested:
                    bar.close()
                    self._save(metrics)
                    raise KeyboardInterrupt(f"stopped after step {self.state['step']} of {total}; the checkpoint in "
                                            f"{os.path.join(cfg.out, 'checkpoint')} continues with --resume")
            if self.state["batch_in_epoch"] >= len(todo):
                self.state["epoch"] += 1
                self.state["batch_in_epoch"] = 0
        return metrics

    def _order(self, epoch: int) -> List[int]:
        order = list(range(len(self.train_set)))
        random.Random(self.config.seed * 1000 + epoch).shuffle(order)
        return order

    def _eval_and_save(self, started: float) -> Dict[str, Any]:
        metrics = self.evaluate()
        metrics["elapsed_s"] = time.time() - started
        self.history.append(metrics)
        acc = " ".join(f"{a:.3f}" for a in metrics["acc"])
        if self.dp.is_main:
            print(f"step {metrics['step']}: val_loss {metrics['val_loss']:.4f} acc [{acc}] expected acceptance "
                  f"length {metrics['expected_acceptance_length']:.2f}", file=sys.stderr, flush=True)
        self._save(metrics)
        return metrics

    def export(self) -> None:
        if not self.dp.is_main:
            self.dp.barrier()
            return
        self._export()
        self.dp.barrier()

    def _export(self) -> None:
        self.draft.save_pretrained(self.config.out, format="eagle3_ext")
        name = self.config.target if self.config.from_cache is None else self.source.target_name
        verifier = {"name_or_path": name, "architectures": self.source.architectures}
        for fmt, wanted in (("specforge", self.config.export_specforge), ("vllm", self.config.export_vllm)):
            if not wanted:
                continue
            try:
                self.draft.save_pretrained(os.path.join(self.config.out, fmt), format=fmt, verifier=verifier,
                                           speculative_tokens=self.config.ttt_steps)
            except ValueError as e:  # a capture or convention the format cannot express
                logger.warning("not exporting the %s format: %s", fmt, e)


def _adopt_cache_options(config: TrainConfig, manifest: Dict[str, Any]) -> None:
    """Training from a cache uses the options it was captured with; one set to something else
    (not left at its default) is an error, since the cache cannot honour it."""
    defaults = TrainConfig(target=None, data=None, out=config.out)
    for name in CAPTURE_FIELDS:
        cached = manifest["aux_layer_ids"] if name == "aux_layers" else manifest[name]
        mine = getattr(config, name)
        if mine != getattr(defaults, name) and mine != cached:
            raise BadInputError(f"{name} {mine!r} differs from the cache's {cached!r} (fixed when it was captured: "
                                "capture again to change it)")
        setattr(config, name, cached)


def train(config: TrainConfig) -> TrainResult:
    """Trains an EAGLE-3 draft for ``config.target`` and writes it to ``config.out``."""
    return Trainer(config).train()
