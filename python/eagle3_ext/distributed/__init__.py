"""Tensor parallelism: the target sharded across torch.distributed ranks, the draft replicated."""

from .tp import (DEFAULT_TIMEOUT_S, RankDisagreement, check_ranks_agree, init_from_env, is_distributed,
                 load_target, rank, shared_seed, shutdown, world_size)

__all__ = ["DEFAULT_TIMEOUT_S", "RankDisagreement", "check_ranks_agree", "init_from_env", "is_distributed",
           "load_target", "rank", "shared_seed", "shutdown", "world_size"]
