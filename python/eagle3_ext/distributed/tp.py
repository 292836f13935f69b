"""Running the speculative loop under torch.distributed tensor parallelism.

The target is sharded with transformers' own tensor-parallel plan (DistributedConfig, the
successor of ``tp_plan="auto"``): attention heads and MLP columns are split across ranks, the
row-parallel projections all-reduce, so every decoder layer's output (what the aux-layer hooks
capture) and the logits are full width on every rank. The draft is small and replicated. Every
rank then computes identical logits and runs the same accept decisions; sampling uses one seed
broadcast from rank 0. ``check_ranks_agree`` verifies that in debug mode.

Launch with ``torchrun --nproc-per-node N -m eagle3_ext generate ...``; the backend follows the
device (gloo on CPU, NCCL on CUDA) and every collective times out after ``timeout_s``, so a
rank that dies or hangs turns into an error on the others instead of a hang.
"""

from __future__ import annotations

import atexit
import datetime
import logging
import os
from typing import List, Sequence

import torch
import torch.distributed as dist

from ..errors import BadInputError

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 120.0


class RankDisagreement(RuntimeError):
    """Ranks produced different tokens: their targets are not the same model or not in sync."""


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def init_from_env(timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Joins the process group torchrun describes (WORLD_SIZE > 1); returns whether it did."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    if timeout_s <= 0:
        raise BadInputError(f"timeout_s must be positive, got {timeout_s}")
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
        atexit.register(_shutdown_at_exit)
        logger.info("rank %d of %d joined (%s, timeout %.0f s)", dist.get_rank(), dist.get_world_size(), backend,
                    timeout_s)
    return True


def shutdown(wait_for_peers: bool = True) -> None:
    """Leaves the process group joined by init_from_env (a no-op outside torchrun).

    A process that exits with the group still alive can abort ("terminate called without an
    active exception") while its communication threads are torn down, so the group is destroyed
    explicitly: after a barrier on the normal path, so no rank leaves while another still talks
    to it; without one after an error (``wait_for_peers=False``), where a peer may never reach
    the barrier. init_from_env also registers this, without the barrier, to run at exit."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        if wait_for_peers:
            dist.barrier()
    finally:
        dist.destroy_process_group()


def _shutdown_at_exit() -> None:
    try:
        shutdown(wait_for_peers=False)
    except Exception as e:  # exiting anyway: the reason is logged, not raised a second time
        logger.warning("leaving the process group at exit failed: %s", e)


def load_target(path: str, dtype: torch.dtype, tp_size: int | None = None, dp_replicate: int = 1):
    """The target, sharded with transformers' TP plan over ``tp_size`` ranks (default: the whole
    process group). With ``dp_replicate`` > 1 the world holds that many such replicas, the
    layout training uses (train/layout.py); transformers then wraps the frozen target in
    replicated FSDP, which leaves its forward unchanged."""
    from transformers import AutoModelForCausalLM, DistributedConfig

    tp_size = world_size() if tp_size is None else tp_size
    options = {"tp_size": tp_size} if dp_replicate == 1 else {"tp_size": tp_size, "dp_replicate_size": dp_replicate}
    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, distributed_config=DistributedConfig(**options))
    except (ValueError, NotImplementedError) as e:
        raise BadInputError(f"the target at {path} has no tensor-parallel plan in transformers ({e}); run it with "
                            "one process") from e


def shared_seed(seed: int | None) -> int:
    """The same sampling seed on every rank: ``seed`` if given, else rank 0's random one (from
    the operating system: torch's global RNG is neither read nor reseeded)."""
    if seed is not None:
        return int(seed)
    fresh = int.from_bytes(os.urandom(8), "little") % (1 << 62)
    if not is_distributed():
        return fresh
    value = torch.tensor([fresh], dtype=torch.int64)
    dist.broadcast(value, src=0)
    return int(value.item())


def check_ranks_agree(sequences: Sequence[Sequence[int]]) -> None:
    """Raises RankDisagreement unless every rank holds the same token sequences."""
    if not is_distributed():
        return
    mine: List[List[int]] = [list(s) for s in sequences]
    gathered: List[List[List[int]]] = [None] * world_size()  # type: ignore[list-item]
    dist.all_gather_object(gathered, mine)
    for r, theirs in enumerate(gathered):
        if theirs != mine:
            raise RankDisagreement(f"rank {rank()} and rank {r} produced different tokens; the ranks' targets are "
                                   "not the same model or their inputs differ")
