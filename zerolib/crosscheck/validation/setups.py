"""What the sharded validation run trains: tiny models and the six data-parallel strategies.

Plain data, no torch: the expected-value arithmetic in ``explain_sharded`` and the run in
``sharded_run`` read the same definitions.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from math import prod
from types import MappingProxyType

import numpy as np

from zerolib.core.intmath import ceil_div


@dataclass(frozen=True)
class ModelSpec:
    """A stack of Linear layers with biases (ReLU between them) with these feature widths."""

    name: str
    widths: tuple[int, ...]
    description: str

    @property
    def layers(self) -> tuple[tuple[tuple[int, ...], ...], ...]:
        """Per Linear layer, its parameter shapes in torch's order: weight (out, in), bias."""
        return tuple(((out, inp), (out,)) for inp, out in zip(self.widths, self.widths[1:]))

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        return tuple(shape for layer in self.layers for shape in layer)

    @property
    def numel(self) -> int:
        return sum(prod(shape) for shape in self.shapes)

    @property
    def tensor_count(self) -> int:
        return len(self.shapes)

    @property
    def largest_layer_params(self) -> int:
        """Most parameters one Linear owns (DeepSpeed's ``largest_layer_params``)."""
        return max(sum(prod(shape) for shape in layer) for layer in self.layers)


TINY_MODELS: Mapping[str, ModelSpec] = MappingProxyType({spec.name: spec for spec in (
    # 4 x Linear(64, 64): every row count (64) divides by 2 and 4, and the 8 tensors split into
    # equal whole-tensor groups for 2 and 4 workers.
    ModelSpec("even", (64, 64, 64, 64, 64),
              "4 x Linear(64, 64): row counts divide by 2 and 4 workers"),
    # Row counts 45, 21, 5 divide by neither 2 nor 4; one weight is over half the model.
    ModelSpec("uneven", (33, 45, 21, 5),
              "Linear(33, 45), Linear(45, 21), Linear(21, 5): row counts divide by neither "
              "2 nor 4"),
)})


@dataclass(frozen=True)
class Strategy:
    """One way of training data-parallel with PyTorch, and the ZeRO stage it stands for."""

    name: str
    stage: int
    kind: str  # "ddp", "zero1", "fsdp2" or "hsdp"
    description: str
    reshard_after_forward: bool = False
    bf16_compute: bool = False
    # HSDP: shard over groups of this many ranks, replicate across the groups (None: all ranks)
    shard_group: int | None = None

    @property
    def gathered_bytes_per_element(self) -> int:
        """Width of the full parameters FSDP gathers for compute (bf16 under the bf16 policy)."""
        return 2 if self.bf16_compute else 4

    def runs_on(self, workers: int) -> bool:
        """Whether this strategy runs with ``workers`` ranks: a shard group needs at least two
        groups of it (so every count does without one)."""
        return self.shard_group is None or (workers > self.shard_group
                                            and workers % self.shard_group == 0)

    def shards(self, workers: int) -> int:
        """Ranks a partitioned tensor is sharded over."""
        return workers if self.shard_group is None else self.shard_group

    def shard_rank(self, rank: int) -> int:
        """This rank's place in its shard group: ranks are laid out as a (replicate, shard)
        mesh, row by row (torch's ``init_device_mesh``), so the shard index is rank % G."""
        return rank if self.shard_group is None else rank % self.shard_group


STRATEGIES: Mapping[str, Strategy] = MappingProxyType({s.name: s for s in (
    Strategy("ddp", 0, "ddp",
             "DistributedDataParallel(gradient_as_bucket_view=True) + AdamW"),
    Strategy("zero1", 1, "zero1",
             "DistributedDataParallel(gradient_as_bucket_view=True) + "
             "ZeroRedundancyOptimizer(AdamW)"),
    Strategy("fsdp2-keep", 2, "fsdp2",
             "fully_shard(reshard_after_forward=False) per layer and root + AdamW",
             reshard_after_forward=False),
    Strategy("fsdp2-reshard", 3, "fsdp2",
             "fully_shard(reshard_after_forward=True) per layer and root + AdamW",
             reshard_after_forward=True),
    Strategy("fsdp2-bf16", 3, "fsdp2",
             "fully_shard(reshard_after_forward=True, MixedPrecisionPolicy(param_dtype=bf16, "
             "reduce_dtype=fp32)) + AdamW",
             reshard_after_forward=True, bf16_compute=True),
    # Runs where the ranks make at least two groups of 2: with 4 workers a 2 x 2 mesh.
    Strategy("hsdp", 3, "hsdp",
             "fully_shard(mesh=init_device_mesh((W/2, 2), ('replicate', 'shard')), "
             "reshard_after_forward=True) per layer and root + AdamW",
             reshard_after_forward=True, shard_group=2),
)})

# The strategies whose collectives the communication runs count: all of them (HSDP's against
# zerolib's group traffic, zerolib.core.step.traffic, on the runs with two groups or more).
COMMUNICATION_STRATEGIES: Mapping[str, Strategy] = STRATEGIES

# Every run is compared with zerolib's all-fp32 AdamW layout: 4 + 4 + 8 bytes per parameter. Under
# the bf16 policy FSDP2 still keeps fp32 sharded parameters, gradients and AdamW state at rest; the
# bf16 copies exist only while gathered.
LAYOUT = "fp32-adam"
ADAMW_STATE_TENSORS = ("exp_avg", "exp_avg_sq")  # fp32, one element per parameter each
STEP_COUNTER_BYTES = 4  # AdamW's state["step"]: a 0-dim fp32 tensor per parameter tensor


MAX_WORKERS = 8  # processes on one machine; the whole run should stay within about a minute


def check_workers(workers) -> tuple[int, ...]:
    """Sorted distinct worker counts, each a whole number from 2 to MAX_WORKERS."""
    if isinstance(workers, (int, str, bytes)) or not hasattr(workers, "__iter__"):
        raise TypeError(f"workers must be a list of process counts like [2, 4], got {workers!r}")
    counts = tuple(workers)
    if not counts:
        raise ValueError("workers must name at least one process count, like 2 4")
    for count in counts:
        if isinstance(count, bool) or not isinstance(count, int) or not 2 <= count <= MAX_WORKERS:
            raise ValueError(f"workers must be whole numbers from 2 to {MAX_WORKERS}, "
                             f"got {count!r}")
    return tuple(sorted(set(counts)))


def fsdp_rows(rows: int, workers: int, rank: int) -> tuple[int, int]:
    """(rows held, rows after padding) of a tensor's dim-0 shard on ``rank`` under FSDP2.

    FSDP2 shards dim 0 like torch.chunk: chunks of ceil(rows / workers) rows, the last ones short
    or empty, and pads every shard to the first chunk's size.
    """
    chunk = ceil_div(rows, workers)
    return max(0, min(chunk, rows - rank * chunk)), chunk


def fsdp_shard_elements(shape: tuple[int, ...], workers: int, rank: int) -> tuple[int, int]:
    """(elements held, elements after padding) of one tensor's FSDP2 shard on ``rank``."""
    held, padded = fsdp_rows(shape[0], workers, rank)
    rest = prod(shape[1:])
    return held * rest, padded * rest


def zero1_partition(shapes, workers: int) -> tuple[tuple[int, ...], ...]:
    """Tensor indices whose optimizer state each rank owns under ZeroRedundancyOptimizer.

    Its documented greedy rule: whole tensors, largest first, each to the rank holding the
    fewest elements so far (the lowest rank on ties).
    """
    sizes = [0] * workers
    owned: list[list[int]] = [[] for _ in range(workers)]
    order = sorted(range(len(shapes)), key=lambda i: prod(shapes[i]), reverse=True)
    for index in order:  # sorted() is stable: equal sizes keep module order, as in torch
        rank = int(np.argmin(sizes))
        owned[rank].append(index)
        sizes[rank] += prod(shapes[index])
    return tuple(tuple(sorted(o)) for o in owned)
