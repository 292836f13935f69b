"""``eagle3 train capture``: runs the target once over the training data and writes the offline
cache ``eagle3 train --from-cache`` trains from (the layout is in train/cache.py).

Under torchrun the replicas split the examples (example i goes to replica i mod DP), and with
``tp_size`` > 1 each replica's target is sharded over a tensor-parallel group whose first rank
writes. Rank 0 writes the manifest once every rank has finished its shards.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from .. import validation
from ..dtypes import DTYPES, check_dtype_name
from ..errors import BadInputError
from ..preflight.loading import default_device
from .cache import CONFIG_DIR, FORMAT, MANIFEST, PARTS, VERSION, bytes_per_token
from .data import batches
from .layout import make_layout
from .target_source import OnlineTarget, full_tensor, split_examples, vocab_mapping_for
from .trainer import TrainConfig

HEAD_MODES = ("auto", "hidden", "logits")


@dataclass
class CaptureConfig:
    """What ``eagle3 train capture`` takes; the fields shared with TrainConfig mean the same."""

    target: str
    data: List[str]
    out: str
    aux_layers: Optional[List[int]] = None
    draft_vocab_size: Optional[int] = None
    max_len: int = 512
    dtype: str = "float32"
    val_fraction: float = 0.1
    val_max_examples: int = 64
    seed: int = 0
    batch_tokens: int = 4096
    head: str = "auto"          # "hidden": the lm_head's input; "logits": draft-vocabulary logits
    shard_mb: int = 1024        # a shard file is closed once it holds this many MiB
    tp_size: int = 1
    dry_run: bool = False       # only estimate the size
    progress: bool = True

    def validate(self) -> None:
        # The options it shares with training are checked by the same code.
        TrainConfig(target=self.target, data=self.data, out=self.out, aux_layers=self.aux_layers,
                    draft_vocab_size=self.draft_vocab_size, max_len=self.max_len, dtype=self.dtype,
                    val_fraction=self.val_fraction, val_max_examples=self.val_max_examples, seed=self.seed,
                    batch_tokens=self.batch_tokens).validate()
        check_dtype_name("dtype", self.dtype)
        validation.choice("head", self.head, HEAD_MODES)
        validation.integer("shard_mb", self.shard_mb, 1)
        validation.integer("tp_size", self.tp_size, 1)
        if os.path.exists(os.path.join(self.out, MANIFEST)):
            raise BadInputError(f"out {self.out} already holds a training cache; capture into another directory or "
                                "delete it first")


class _ShardWriter:
    def __init__(self, out: str, prefix: str, limit_bytes: int, enabled: bool):
        self.out, self.prefix, self.limit, self.enabled = out, prefix, limit_bytes, enabled
        self.pending: Dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.count = 0
        self.written = 0

    @property
    def name(self) -> str:
        return f"{self.prefix}-{self.count:05d}.safetensors"

    def add(self, key: str, tensors: Dict[str, torch.Tensor]) -> str:
        """Queues one example; returns the shard file it lands in."""
        name = self.name
        for field, value in tensors.items():
            self.pending[f"{key}.{field}"] = value.contiguous()
            self.pending_bytes += value.numel() * value.element_size()
        if self.pending_bytes >= self.limit:
            self.flush()
        return name

    def flush(self) -> None:
        if self.pending and self.enabled:
            save_file(self.pending, os.path.join(self.out, self.name))
        self.written += self.pending_bytes
        if self.pending:
            self.count += 1
        self.pending, self.pending_bytes = {}, 0


def _head_check(source: OnlineTarget, example, rows, bias) -> bool:
    """Whether the draft-vocabulary logits are exactly the lm_head's input times its rows (a
    plain linear head: no soft-capping, no scaling) on one example."""
    with torch.no_grad(), source.recording_head_input() as head_inputs:
        view = source.batch([example], rows.device)[-1]
    again = F.linear(head_inputs[-1], rows, bias).float()
    return bool((again - view.draft_logits).abs().max() <= 1e-4 * (1 + view.draft_logits.abs().max()))


def capture(config: CaptureConfig) -> Dict[str, Any]:
    """Writes the cache (or with ``dry_run`` only sizes it); returns the figures it printed."""
    config.validate()
    layout = make_layout(config.tp_size)
    main = layout.rank == 0
    device = default_device()
    source = OnlineTarget(config.target, DTYPES[config.dtype], config.max_len, layout, device)
    examples = source.load(config.data, config.max_len)
    train, val = split_examples(examples, config.val_fraction, config.val_max_examples, config.seed)
    aux = source.default_aux_layers() if config.aux_layers is None else list(config.aux_layers)
    draft_vocab = min(source.vocab, 32000) if config.draft_vocab_size is None else config.draft_vocab_size
    if draft_vocab > source.vocab:
        raise BadInputError(f"draft_vocab_size {draft_vocab} is larger than the target vocabulary ({source.vocab})")
    d2t, t2d = vocab_mapping_for(train, source.vocab, draft_vocab)
    hidden = source.config.hidden_size
    ids = torch.arange(draft_vocab) + d2t
    rows, bias = source.head_rows(ids, dtype=None), source.head_bias(ids)  # stored as the target has them

    ordered = [("train", e) for e in train] + [("val", e) for e in val]
    tokens = sum(e.input_ids.numel() for _, e in ordered)
    dtype_bytes = DTYPES[config.dtype].itemsize
    fingerprint = source.fingerprint(aux, (e.input_ids.tolist() for e in (val or train)))
    source.start(aux, d2t)
    head = config.head
    if head == "auto":
        head = "hidden" if rows is not None and _head_check(source, train[0], rows, bias) else "logits"
    elif head == "hidden" and (rows is None or not _head_check(source, train[0], rows, bias)):
        raise BadInputError("head 'hidden' needs a plain linear lm_head; this target's logits are not its input times "
                            "its weight (use head 'logits' or 'auto')")
    per_token = bytes_per_token(len(aux), hidden, draft_vocab, dtype_bytes, head)
    estimate = {"examples": len(ordered), "tokens": tokens, "bytes_per_token": per_token,
                "estimated_bytes": per_token * tokens, "mib_per_million_tokens": per_token * 1e6 / 2**20,
                "head": head}
    os.makedirs(config.out, exist_ok=True)
    free = shutil.disk_usage(config.out).free
    if main and config.progress:
        print(f"eagle3 train capture: {len(ordered)} examples, {tokens} tokens x {per_token} bytes = about "
              f"{per_token * tokens / 2**30:.2f} GiB ({estimate['mib_per_million_tokens'] / 1024:.1f} GiB per "
              f"million tokens); {free / 2**30:.1f} GiB free", file=sys.stderr, flush=True)
    if config.dry_run:
        return estimate
    if per_token * tokens > free:
        raise BadInputError(f"out {config.out}: the cache needs about {per_token * tokens / 2**30:.2f} GiB and the "
                            f"disk has {free / 2**30:.2f} GiB free")

    started = time.perf_counter()
    mine = [i for i in range(len(ordered)) if i % layout.dp_size == layout.dp_rank]
    writer = _ShardWriter(config.out, f"shard-{layout.dp_rank:03d}", config.shard_mb * 2**20, layout.tp_rank == 0)
    entries = []
    from tqdm.auto import tqdm
    bar = tqdm(total=len(mine), desc="eagle3 train capture", file=sys.stderr, disable=not (main and config.progress))
    examples_in_order = [e for _, e in ordered]
    for batch_ids in _index_batches(examples_in_order, mine, config.batch_tokens):
        batch = [examples_in_order[i] for i in batch_ids]
        with torch.no_grad(), source.recording_head_input() as head_inputs:
            _, _, _, states, view = source.batch(batch, device, DTYPES[config.dtype])
        head_in = head_inputs[-1].cpu() if head == "hidden" else None
        states = [s.cpu() for s in states]
        top, draft_logits = view.top.cpu(), view.draft_logits.cpu()
        for row, i in enumerate(batch_ids):
            e, n = examples_in_order[i], examples_in_order[i].input_ids.numel()
            tensors = {"input_ids": e.input_ids, "loss_mask": e.loss_mask.to(torch.uint8),
                       "aux": torch.stack([s[row, :n] for s in states]), "top": top[row, :n]}
            if head == "hidden":
                tensors["head_in"] = head_in[row, :n]
            else:
                tensors["draft_logits"] = draft_logits[row, :n]
            key = f"ex{i}"
            entries.append({"index": i, "split": ordered[i][0], "shard": writer.add(key, tensors), "key": key,
                            "length": n})
        bar.update(len(batch_ids))
    writer.flush()
    bar.close()
    seconds = time.perf_counter() - started
    entries = _gather(entries, layout)
    written = _gather_sum(writer.written if layout.tp_rank == 0 else 0, layout)
    result = {**estimate, "bytes_written": written, "seconds": seconds, "tokens_per_s": tokens / seconds,
              "processes": layout.world, "layout": layout.describe()}
    # (Gathering a sharded weight is collective: every rank takes part, rank 0 writes.)
    parts = {"embed": full_tensor(source.model.get_input_embeddings().weight.detach()),
             "d2t": d2t, "t2d": t2d.to(torch.uint8), "head_rows": rows, "head_bias": bias,
             "final_norm": source.final_norm()}
    parts = {k: v.cpu().contiguous() for k, v in parts.items() if v is not None}
    if main:
        source.config.save_pretrained(os.path.join(config.out, CONFIG_DIR))
        save_file(parts, os.path.join(config.out, PARTS))
        manifest = {"format": FORMAT, "version": VERSION, "target": config.target,
                    "architectures": source.architectures, "dtype": config.dtype, "aux_layer_ids": aux,
                    "draft_vocab_size": draft_vocab, "max_len": config.max_len, "val_fraction": config.val_fraction,
                    "val_max_examples": config.val_max_examples, "seed": config.seed, "data": list(config.data),
                    "pad_id": source.pad_id, "vocab_size": source.vocab, "num_hidden_layers": source.num_layers,
                    "hidden_size": hidden, "head": head, "tokens": tokens, "bytes": written,
                    "fingerprint": fingerprint, "examples": sorted(entries, key=lambda x: x["index"])}
        with open(os.path.join(config.out, MANIFEST), "w") as f:
            json.dump(manifest, f)
    if layout.world > 1:
        import torch.distributed as dist
        dist.barrier()
    return result


def _index_batches(examples, indices: List[int], batch_tokens: int):
    """``indices`` grouped like the trainer groups examples (batch size x longest <= batch_tokens)."""
    position = {id(examples[i]): i for i in indices}
    for batch in batches(examples, batch_tokens, indices):
        yield [position[id(e)] for e in batch]


def _gather(entries: List[dict], layout) -> List[dict]:
    """Every writing rank's entries, on every rank."""
    if layout.world == 1:
        return entries
    import torch.distributed as dist
    gathered: List[List[dict]] = [None] * layout.world  # type: ignore[list-item]
    dist.all_gather_object(gathered, entries if layout.tp_rank == 0 else [])
    return [e for part in gathered for e in part]


def _gather_sum(value: int, layout) -> int:
    if layout.world == 1:
        return value
    import torch.distributed as dist
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t)
    return int(t.item())
