"""Persistent model state per data-parallel worker under ZeRO stages 0-3.

The model (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", SC20, Sec. III-A and V): every worker of plain data parallelism (stage 0) holds all
parameters, gradients and optimizer states. Stage 1 partitions the optimizer states across the
N workers, stage 2 the gradients as well, stage 3 the parameters as well.

A partitioned category holds ceil(params / N) elements on a worker: the most-loaded worker,
the one that decides whether a setting fits. When N divides params this is exactly params / N.
All results are int64 bytes.

Sharding groups: with ``shard_group`` G (G divides N) the partitioned categories are sharded over
G workers only and the N / G groups hold replicas: PyTorch FSDP's hybrid sharding (HSDP, a 2-D
device mesh of (N / G) x G; Zhao et al., "PyTorch FSDP", VLDB 2023, arXiv 2304.11277) and MiCS
in DeepSpeed (``mics_shard_size``; Zhang et al., VLDB 2023, arXiv 2205.00119). A worker then
holds ceil(params / G)
elements of each partitioned category. G = N is the ZeRO of the paper, G = 1 plain data
parallelism whatever the stage.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

import numpy as np

from zerolib.core.inputs import (
    STAGES,
    broadcast,
    check_gpus,
    check_params,
    check_stage,
    check_width,
)
from zerolib.core.intmath import ceil_div, exact_product

CATEGORIES = ("parameters", "gradients", "optimizer")
PARTITIONED: Mapping[int, tuple[str, ...]] = MappingProxyType({
    0: (),
    1: ("optimizer",),
    2: ("gradients", "optimizer"),
    3: ("parameters", "gradients", "optimizer"),
})
STRATEGY_NAMES: Mapping[int, str] = MappingProxyType({
    0: "Plain data parallelism",
    1: "ZeRO stage 1 (optimizer)",
    2: "ZeRO stage 2 (+ gradients)",
    3: "ZeRO stage 3 (+ parameters)",
})

# The first stage that partitions each category (the stages nest: 1 within 2 within 3).
_FIRST_PARTITIONED = {c: min(s for s in STAGES if c in PARTITIONED[s]) for c in CATEGORIES}


@dataclass(frozen=True)
class Layout:
    """Bytes per parameter in each category, with the parts that make them up.

    ``parts`` maps each category to ``((part name, bytes), ...)`` so that changing one dtype
    shows where the savings move.
    """

    name: str
    parts: Mapping[str, tuple[tuple[str, float], ...]]
    description: str = ""

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise TypeError("layout name must be a non-empty string")
        if not isinstance(self.parts, Mapping) or set(self.parts) != set(CATEGORIES):
            raise ValueError(f"layout parts must name exactly the categories {CATEGORIES}")
        frozen = {}
        for category in CATEGORIES:
            try:
                pairs = [(str(part), width) for part, width in self.parts[category]]
            except (TypeError, ValueError):  # a bare width, or items that are not pairs
                raise TypeError(f"layout parts[{category!r}] must be ((part name, bytes per "
                                f"parameter), ...), got {self.parts[category]!r}") from None
            items = tuple((part, check_width(width, f"{category} width of {part!r}"))
                          for part, width in pairs)
            check_width(sum(w for _, w in items), f"{category} bytes per parameter")
            frozen[category] = items
        object.__setattr__(self, "parts", MappingProxyType(frozen))
        # Bits per category, asked for on every call of the scalar API: summed once here.
        object.__setattr__(self, "_bits", {c: int(round(sum(w for _, w in frozen[c]) * 8))
                                           for c in CATEGORIES})

    def __deepcopy__(self, memo) -> Layout:
        return self  # immutable (pandas deep-copies DataFrame.attrs, which carry layouts)

    @classmethod
    def custom(cls, parameters: float, gradients: float, optimizer: float,
               name: str = "custom") -> Layout:
        """A layout from three widths in bytes per parameter (``--bytes 2,2,12``)."""
        return cls(name, {
            "parameters": (("parameters", parameters),),
            "gradients": (("gradients", gradients),),
            "optimizer": (("optimizer state", optimizer),),
        })

    def bytes_per_param(self, category: str) -> float:
        return sum(width for _, width in self.parts[category])

    def bits_per_param(self, category: str) -> int:
        """The same width in bits: a whole number (widths are multiples of 1/8 byte)."""
        return self._bits[category]

    @property
    def parameters(self) -> float:
        return self.bytes_per_param("parameters")

    @property
    def gradients(self) -> float:
        return self.bytes_per_param("gradients")

    @property
    def optimizer(self) -> float:
        return self.bytes_per_param("optimizer")

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer

    def widths(self) -> tuple[float, float, float]:
        """(parameters, gradients, optimizer) bytes per parameter."""
        return (self.parameters, self.gradients, self.optimizer)

    def as_dict(self) -> dict:
        """The JSON form: name plus bytes per parameter (whole numbers stay ints)."""
        tidy = {c: int(w) if float(w).is_integer() else w for c, w in zip(CATEGORIES, self.widths())}
        return {"name": self.name, **tidy}


def _preset(name, description, parameters, gradients, optimizer) -> Layout:
    return Layout(name, {"parameters": parameters, "gradients": gradients,
                         "optimizer": optimizer}, description)


LAYOUTS: Mapping[str, Layout] = MappingProxyType({layout.name: layout for layout in (
    # ZeRO paper Sec. III-A: fp16 parameters and gradients (2 + 2 bytes) and K = 12 bytes of
    # fp32 optimizer state (master parameters, momentum, variance).
    _preset("mixed-adam", "Mixed-precision Adam (ZeRO paper, K = 12)",
            (("fp16 parameters", 2),), (("fp16 gradients", 2),),
            (("fp32 master parameters", 4), ("fp32 momentum", 4), ("fp32 variance", 4))),
    _preset("fp32-adam", "Adam/AdamW entirely in fp32",
            (("fp32 parameters", 4),), (("fp32 gradients", 4),),
            (("fp32 momentum", 4), ("fp32 variance", 4))),
    _preset("bf16-fp32-grads", "bf16 parameters, fp32 gradients, fp32 Adam state",
            (("bf16 parameters", 2),), (("fp32 gradients", 4),),
            (("fp32 master parameters", 4), ("fp32 momentum", 4), ("fp32 variance", 4))),
    # 8-bit Adam (Dettmers et al., "8-bit Optimizers via Block-wise Quantization", ICLR 2022)
    # keeps both moments in 1 byte each; the fp32 master copy stays. Block-wise quantisation
    # constants (one fp32 per 2048 values) add ~0.004 bytes per parameter and are left out.
    _preset("adam-8bit", "Mixed precision with 8-bit Adam moments",
            (("fp16 parameters", 2),), (("fp16 gradients", 2),),
            (("fp32 master parameters", 4), ("int8 momentum", 1), ("int8 variance", 1))),
    _preset("mixed-sgd-momentum", "Mixed-precision SGD with momentum",
            (("fp16 parameters", 2),), (("fp16 gradients", 2),),
            (("fp32 master parameters", 4), ("fp32 momentum", 4))),
)})


def get_layout(layout: str | Layout) -> Layout:
    """A preset by name, or a Layout passed through."""
    if isinstance(layout, Layout):
        return layout
    if isinstance(layout, str) and layout in LAYOUTS:
        return LAYOUTS[layout]
    raise ValueError(f"layout must be one of {', '.join(LAYOUTS)} (or a Layout), got {layout!r}")


@dataclass(frozen=True)
class ModelState:
    """Bytes of persistent model state, broadcast over (params, gpus, stage).

    Holds the validated, broadcast inputs; each category is computed when first asked for,
    so a caller that needs only ``total`` pays for one pass, not three.
    """

    params: np.ndarray = field(repr=False)
    gpus: np.ndarray = field(repr=False)
    stage: np.ndarray = field(repr=False)
    layout: Layout
    # Workers a partitioned category is sharded over (the same array as ``gpus`` unless a
    # shard group was asked for); ``gpus`` / ``shard_group`` groups hold replicas.
    shard_group: np.ndarray | None = field(default=None, repr=False)

    @property
    def shards(self) -> np.ndarray:
        return self.gpus if self.shard_group is None else self.shard_group

    @cached_property
    def _saved(self) -> np.ndarray:
        # A partitioned category keeps ceil(params / shards) elements on the most-loaded worker:
        # params + saved (saved <= 0).
        return ceil_div(self.params, self.shards) - self.params

    def _category(self, category: str) -> np.ndarray:
        partitioned = self.stage >= _FIRST_PARTITIONED[category]
        elements = self.params + self._saved * partitioned  # faster than np.where
        bits = self.layout.bits_per_param(category)
        if bits % 8 == 0:
            return elements * (bits // 8)
        return ceil_div(elements * bits, 8)  # whole bytes, rounded up

    @cached_property
    def parameters(self) -> np.ndarray:
        return self._category("parameters")

    @cached_property
    def gradients(self) -> np.ndarray:
        return self._category("gradients")

    @cached_property
    def optimizer(self) -> np.ndarray:
        return self._category("optimizer")

    @cached_property
    def total(self) -> np.ndarray:
        """Bytes on one worker (the most-loaded one)."""
        widths = [self.layout.bits_per_param(c) for c in CATEGORIES]
        if any(bits % 8 for bits in widths):  # each category rounds up on its own
            return self.parameters + self.gradients + self.optimizer
        # Whole bytes: params * all widths + saved elements * the widths this stage partitions.
        partitioned_bytes = np.array([sum(bits // 8 for c, bits in zip(CATEGORIES, widths)
                                          if c in PARTITIONED[s]) for s in STAGES])
        return self.params * (sum(widths) // 8) + self._saved * partitioned_bytes[self.stage]

    @property
    def cluster_total(self) -> np.ndarray:
        """Bytes summed over all workers, partition padding included.

        int64 where every product fits (checked, not assumed); otherwise an object array of
        exact Python ints, since 10**15 parameters on 2**24 workers exceed int64.
        """
        return exact_product(self.total, self.gpus)

    def as_dict(self) -> dict[str, np.ndarray]:
        return {"parameters": self.parameters, "gradients": self.gradients,
                "optimizer": self.optimizer, "total": self.total,
                "cluster_total": self.cluster_total}


def state_bytes(params: int, gpus: int, stage: int, layout: Layout) -> dict[str, int]:
    """:func:`model_state` of one checked setting in Python ints (no arrays): parameters,
    gradients, optimizer, total and cluster_total bytes. The scalar API's path: the same
    numbers, in microseconds (a test compares the two over many settings)."""
    shard = -(-params // gpus)     # ceil(params / gpus) elements of a partitioned category
    out = {}
    for category in CATEGORIES:
        elements = shard if stage >= _FIRST_PARTITIONED[category] else params
        bits = layout.bits_per_param(category)
        out[category] = elements * (bits // 8) if bits % 8 == 0 else -(-(elements * bits) // 8)
    out["total"] = out["parameters"] + out["gradients"] + out["optimizer"]
    out["cluster_total"] = out["total"] * gpus
    return out


def check_shard_group(shard_group, gpus: np.ndarray) -> np.ndarray:
    """Shard-group sizes as int64, broadcast with ``gpus``: whole, 1 to ``gpus``, dividing it."""
    group = check_gpus(shard_group, "shard_group")
    group, gpus = broadcast(shard_group=group, gpus=gpus)
    if np.any(group > gpus) or np.any(gpus % group):
        bad = np.flatnonzero(((group > gpus) | (gpus % group != 0)).ravel())[0]
        raise ValueError(f"shard_group must divide gpus (a shard group of G GPUs inside N "
                         f"data-parallel GPUs, N / G replicas), got shard_group "
                         f"{int(group.ravel()[bad])} with gpus {int(gpus.ravel()[bad])}")
    return group


def model_state(params, gpus, stage, layout: str | Layout = "mixed-adam",
                shard_group=None) -> ModelState:
    """Persistent bytes per worker for each category.

    ``params``, ``gpus`` and ``stage`` may be scalars or array-likes; they broadcast together
    (numpy rules), so a whole curve is one call. ``shard_group`` (None: all ``gpus``) shards the
    partitioned categories over that many workers only, the rest being replicas (HSDP, MiCS);
    it must divide ``gpus`` and broadcasts with the other three.
    """
    layout = get_layout(layout)
    params, gpus, stage = broadcast(params=check_params(params), gpus=check_gpus(gpus),
                                    stage=check_stage(stage))
    if shard_group is None:
        return ModelState(params, gpus, stage, layout)
    group = check_shard_group(shard_group, gpus)
    params, gpus, stage, group = broadcast(params=params, gpus=gpus, stage=stage,
                                           shard_group=group)
    return ModelState(params, gpus, stage, layout, group)
