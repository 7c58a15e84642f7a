"""How the frameworks people launch spell each ZeRO stage: the setting to type, with its source.

The stages are the ZeRO paper's (Rajbhandari et al., SC20, Sec. V): what is partitioned across
the data-parallel GPUs. A framework offers a stage when some setting partitions exactly that
state; a cell of ``None`` means it has no such setting. Each spelling was read at these versions:

- DeepSpeed 0.19.8: ``zero_optimization.stage`` 0-3 in the JSON config
  (``deepspeed/runtime/zero/config.py``, ``DeepSpeedZeroConfig.stage``).
- PyTorch FSDP1, 2.13: ``FullyShardedDataParallel(sharding_strategy=...)``
  (``torch/distributed/fsdp/api.py``, ``ShardingStrategy``): ``NO_SHARD`` is DDP-like,
  ``SHARD_GRAD_OP`` shards gradients and optimizer state and keeps parameters gathered from the
  forward to the backward, ``FULL_SHARD`` reshards them after each pass.
- PyTorch FSDP2, 2.13: ``fully_shard(module, reshard_after_forward=...)``
  (``torch/distributed/fsdp/_fully_shard/_fully_shard.py``); ``replicate`` or DDP is stage 0;
  no stage 1 (a sharded parameter always brings its sharded gradient).
- Megatron-LM (main at d98e8a6, August 2026, ``megatron/training/arguments.py``): ``--use-distributed-optimizer``
  shards the optimizer state (stage 1); Megatron-FSDP (``--use-megatron-fsdp``) takes
  ``--data-parallel-sharding-strategy`` ``optim``, ``optim_grads`` or ``optim_grads_params``.
- torchtitan (main at b5bcd76, August 2026, ``torchtitan/config/configs.py`` ``ParallelismConfig``):
  ``data_parallel_shard_degree`` > 1 applies FSDP2; ``fsdp_reshard_after_forward`` is
  ``"default"`` (reshard, except under pipeline parallelism: ``torchtitan/distributed/fsdp.py``),
  ``"always"`` or ``"never"``; ``data_parallel_replicate_degree`` alone is DDP.
"""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

FRAMEWORKS = ("DeepSpeed", "PyTorch FSDP1", "PyTorch FSDP2", "Megatron-LM", "torchtitan")

# stage -> framework -> the setting that runs it (None: the framework has no such stage).
SPELLINGS: Mapping[int, Mapping[str, str | None]] = MappingProxyType({
    0: MappingProxyType({
        "DeepSpeed": '"zero_optimization": {"stage": 0}',
        "PyTorch FSDP1": "sharding_strategy=ShardingStrategy.NO_SHARD",
        "PyTorch FSDP2": "DistributedDataParallel (or replicate)",
        "Megatron-LM": "the default (no --use-distributed-optimizer)",
        "torchtitan": "data_parallel_replicate_degree = N, data_parallel_shard_degree = 1",
    }),
    1: MappingProxyType({
        "DeepSpeed": '"zero_optimization": {"stage": 1}',
        "PyTorch FSDP1": None,
        "PyTorch FSDP2": None,
        "Megatron-LM": "--use-distributed-optimizer",
        "torchtitan": None,
    }),
    2: MappingProxyType({
        "DeepSpeed": '"zero_optimization": {"stage": 2}',
        "PyTorch FSDP1": "sharding_strategy=ShardingStrategy.SHARD_GRAD_OP",
        "PyTorch FSDP2": "fully_shard(module, reshard_after_forward=False)",
        "Megatron-LM": "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads",
        "torchtitan": 'data_parallel_shard_degree = N, fsdp_reshard_after_forward = "never"',
    }),
    3: MappingProxyType({
        "DeepSpeed": '"zero_optimization": {"stage": 3}',
        "PyTorch FSDP1": "sharding_strategy=ShardingStrategy.FULL_SHARD",
        "PyTorch FSDP2": "fully_shard(module) (reshard_after_forward=True)",
        "Megatron-LM": "--use-megatron-fsdp (--data-parallel-sharding-strategy optim_grads_params)",
        "torchtitan": "data_parallel_shard_degree = N (the default, -1: every remaining GPU)",
    }),
})


def offered_stages(framework: str) -> tuple[int, ...]:
    """The ZeRO stages ``framework`` (one of ``FRAMEWORKS``) has a setting for."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}, got {framework!r}")
    return tuple(stage for stage, row in SPELLINGS.items() if row[framework] is not None)


def framework_table():
    """One row per stage, one column per framework: the setting to type ("none" where the
    framework has no such stage). A pandas DataFrame indexed by stage."""
    import pandas as pd  # the core's tables are built where they are asked for

    return pd.DataFrame({name: [SPELLINGS[stage][name] or "none" for stage in SPELLINGS]
                         for name in FRAMEWORKS},
                        index=pd.Index(list(SPELLINGS), name="stage"))
