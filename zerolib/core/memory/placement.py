"""Where the model state lives: shard groups, ZeRO++'s hpZ copy, offload to CPU memory and NVMe.

:func:`place` splits the persistent model state of :func:`zerolib.core.memory.accounting.model_state`
over three tiers (:data:`TIERS`): ``gpu`` (device memory), ``cpu`` (the node's DRAM) and
``nvme`` (the node's SSDs), item by item (:data:`ITEMS`), in bytes per GPU, and per node.
A :class:`Placement` says how:

``shard_group``
    Shard the partitioned categories over G of the N data-parallel GPUs, replicated over the
    N / G groups (HSDP, MiCS; see :mod:`zerolib.core.memory.accounting`).
``hpz_partition``
    ZeRO++'s hierarchical partitioning, hpZ (Wang et al., "ZeRO++", arXiv 2306.10209;
    DeepSpeed ``zero_hpz_partition_size``): stage 3 keeps, beside its primary shard over all N
    GPUs, a secondary copy of the 16-bit parameters sharded over a group of ``hpz_partition``
    GPUs, ideally one node, so the backward all-gather stays inside the node. Its cost is
    ceil(params / hpz_partition) elements in the parameter width on every GPU (DeepSpeed
    ``partition_parameters.py`` ``_partition_param_sec``: ``tensor_size //
    num_ranks_in_param_group`` elements of ``param.dtype``). ZeRO++'s other two parts, qwZ
    (weights all-gathered in int8) and qgZ (gradients reduced in int4 through an all-to-all),
    quantise what travels, not what stays: they change communication, not resident state, and
    have no term here.
``offload_optimizer`` ("cpu" or "nvme")
    ZeRO-Offload (Ren et al., USENIX ATC 2021) and ZeRO-Infinity (Rajbhandari et al., SC21), as
    DeepSpeed's ``offload_optimizer`` implements them: the GPU's partition of the optimizer
    state moves to the device named, the optimizer step runs on the CPU, and the gradients it
    steps on live beside it as an fp32 partition (``host_gradient_bytes`` = 4 per element:
    DeepSpeed 0.19.8 keeps ``averaged_gradients`` / the fp32 partitions' ``.grad`` in fp32 on
    the host). Stages 2 and 3 then keep no gradients on the GPU (they are reduced through the
    buckets and copied out); stage 1, which does not partition gradients, still accumulates its
    16-bit gradients whole on the GPU. The ZeRO-Offload paper keeps fp16 gradients on the CPU
    (2 bytes; its Fig. 2): ``host_gradient_bytes=2`` gives that convention.
``offload_params`` ("cpu" or "nvme")
    ZeRO-Infinity's parameter offload (DeepSpeed ``offload_param``, stage 3): the GPU's 16-bit
    parameter shard lives on the host and is fetched for each layer. With "nvme" DeepSpeed still
    keeps up to ``offload_param.max_in_cpu`` (10**9) elements of it in pinned CPU memory
    (``stage3.py`` ``_create_param_groups_fp16_flat_cpu_memory``), the rest on NVMe.

What DeepSpeed offers (0.19.8; docs ``config-json.md`` "Optimizer offloading", "Parameter
offloading"): optimizer offload to the CPU under stages 1-3, to NVMe under stage 3 only
(stage_1_and_2.py has no NVMe path: it accepts ``device: nvme`` but holds the state in CPU
memory); parameter offload under stage 3 only. Other combinations raise ValueError, as do hpZ
outside stage 3, hpZ with a shard group smaller than all GPUs (MiCS and hpZ are separate
features) and hpZ with parameter offload (DeepSpeed puts the secondary copy on the offload
device).

Per node: the GPUs of one node each hold their own partitions, so a node's CPU memory or NVMe
holds ``gpus_per_node`` times a GPU's share (ranks fill nodes in order; the most-loaded GPU's
share is used, as everywhere in zerolib). Not counted: the pinned staging buffers of the NVMe
paths (``buffer_count`` x ``buffer_size``), the host copy of a model built in fp32 before
sharding, and DeepSpeed's estimator's ``additional_buffer_factor`` (see
:mod:`zerolib.crosscheck.deepspeed_estimator`).
"""
from __future__ import annotations

import copy
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType

import numpy as np

from zerolib.core.defaults import DEFAULT_GPUS_PER_NODE, OFFLOAD_DEVICES  # noqa: F401
from zerolib.core.inputs import (
    MAX_GPUS,
    MAX_PARAMS,
    check_flag,
    check_gpus,
    check_positive_int,
    check_width,
    echo,
)
from zerolib.core.intmath import ceil_div, exact_product
from zerolib.core.memory.accounting import STAGES, Layout, ModelState, get_layout, model_state

TIERS = ("gpu", "cpu", "nvme")
# What a tier can hold, in the order a stacked bar draws them.
ITEMS = ("parameters", "hpz_secondary", "gradients", "optimizer")

# DeepSpeed 0.19.8 offload_param.max_in_cpu (runtime/zero/offload_config.py: pp_int(1e9)).
OFFLOAD_PARAM_MAX_IN_CPU = 1_000_000_000
# DeepSpeed keeps the gradients of an offloaded optimizer in fp32 on the host.
HOST_GRADIENT_BYTES = 4


def _device(value, name: str) -> str:
    if value not in OFFLOAD_DEVICES:
        raise ValueError(f"{name} must be one of {', '.join(OFFLOAD_DEVICES)}, got {echo(value)}")
    return value


def _optional_count(value, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a positive whole number or None, got {echo(value)}")
    return check_positive_int(int(value), name, MAX_GPUS)


@dataclass(frozen=True)
class Placement:
    """How the model state is spread: over which GPUs, with which copies, on which tier, and
    how ZeRO++ moves it (``hpz_partition``'s copy, and ``qwz`` / ``qgz``, its quantised
    weights and gradients, which change the traffic, :mod:`zerolib.core.step.traffic`, not the
    bytes held).

    The default is the chapter's ZeRO: sharded over every data-parallel GPU, all on the GPU.
    """

    shard_group: int | None = None          # None: every data-parallel GPU
    hpz_partition: int = 1                  # ZeRO++ hpZ group; 1: no secondary copy
    offload_optimizer: str = "none"         # "none" | "cpu" | "nvme"
    offload_params: str = "none"            # "none" | "cpu" | "nvme" (stage 3)
    gpus_per_node: int | None = None        # None: 8, or every GPU when there are fewer
    max_in_cpu: int = OFFLOAD_PARAM_MAX_IN_CPU   # offload_params="nvme": elements kept in CPU
    host_gradient_bytes: float = HOST_GRADIENT_BYTES
    qwz: bool = False                       # ZeRO++ quantised weights (8-bit gathers)
    qgz: bool = False                       # ZeRO++ quantised gradients (4-bit all-to-alls)

    def with_shard_group(self, shard_group: int) -> Placement:
        """This placement over shard groups of ``shard_group`` GPUs that the caller checked (a
        divisor of the data-parallel GPUs, as the planner enumerates them): a copy, made
        without checking the rest of it again."""
        twin = copy.copy(self)
        object.__setattr__(twin, "shard_group", int(shard_group))
        return twin

    def with_gpus_per_node(self, gpus_per_node: int) -> Placement:
        """This placement on nodes of ``gpus_per_node`` GPUs that the caller checked (where the
        rings are placed): a copy, made without checking the rest of it again."""
        twin = copy.copy(self)
        object.__setattr__(twin, "gpus_per_node", int(gpus_per_node))
        return twin

    def __post_init__(self):
        _optional_count(self.shard_group, "shard_group")
        _optional_count(self.gpus_per_node, "gpus_per_node")
        if isinstance(self.hpz_partition, (bool, np.bool_)) or not isinstance(self.hpz_partition,
                                                                              numbers.Integral):
            raise TypeError(f"hpz_partition must be a positive whole number, got "
                            f"{echo(self.hpz_partition)}")
        check_positive_int(int(self.hpz_partition), "hpz_partition", MAX_GPUS)
        _device(self.offload_optimizer, "offload_optimizer")
        _device(self.offload_params, "offload_params")
        if isinstance(self.max_in_cpu, (bool, np.bool_)) or not isinstance(self.max_in_cpu,
                                                                           numbers.Integral):
            raise TypeError(f"max_in_cpu must be a whole number of elements, got "
                            f"{echo(self.max_in_cpu)}")
        if not 0 <= self.max_in_cpu <= MAX_PARAMS:
            raise ValueError(f"max_in_cpu must be 0 to {MAX_PARAMS:,} elements, got "
                             f"{echo(self.max_in_cpu)}")
        check_width(self.host_gradient_bytes, "host_gradient_bytes")
        check_flag(self.qwz, "qwz")
        check_flag(self.qgz, "qgz")
        if self.hpz_partition > 1 and self.offload_params != "none":
            raise ValueError("hpz_partition > 1 cannot be combined with offload_params: DeepSpeed "
                             "keeps hpZ's secondary copy on the offload device, which zerolib does "
                             "not model")

    @property
    def offloads(self) -> bool:
        return self.offload_optimizer != "none" or self.offload_params != "none"

    def as_dict(self) -> dict:
        # qwz and qgz: the communication object of an estimate reports them beside the traffic
        return {"shard_group": self.shard_group, "hpz_partition": self.hpz_partition,
                "offload_optimizer": self.offload_optimizer, "offload_params": self.offload_params,
                "gpus_per_node": self.gpus_per_node, "max_in_cpu": self.max_in_cpu,
                "host_gradient_bytes": (int(self.host_gradient_bytes)
                                        if float(self.host_gradient_bytes).is_integer()
                                        else self.host_gradient_bytes)}

    def describe(self) -> str:
        """One line: ``'shard group 8; hpZ over 8; optimizer on cpu; parameters on nvme'``."""
        parts = []
        if self.shard_group is not None:
            parts.append(f"shard group of {self.shard_group}")
        if self.hpz_partition > 1:
            parts.append(f"hpZ secondary copy over {self.hpz_partition}")
        if self.offload_optimizer != "none":
            gradients = f"{'fp32' if self.host_gradient_bytes == 4 else 'host'} gradients"
            parts.append(f"optimizer state and {gradients} on NVMe" if self.offload_optimizer == "nvme"
                         else f"optimizer state and {gradients} in CPU memory")
        if self.offload_params != "none":
            parts.append("parameters on NVMe" if self.offload_params == "nvme"
                         else "parameters in CPU memory")
        return "; ".join(parts) or "sharded over every GPU, all on the GPU"


DEFAULT_PLACEMENT = Placement()


@lru_cache(maxsize=256)
def placement_on(gpus_per_node: int) -> Placement:
    """The default placement (sharded over every GPU, no ZeRO++) on nodes of ``gpus_per_node``
    GPUs (a node size the caller checked), made once per node size: the rings of a step's
    traffic placed there (:func:`zerolib.core.step.traffic.traffic_of`)."""
    return DEFAULT_PLACEMENT.with_gpus_per_node(gpus_per_node)


def check_placement(placement) -> Placement:
    if placement is None:
        return DEFAULT_PLACEMENT
    if not isinstance(placement, Placement):
        raise TypeError(f"placement must be a Placement, got {type(placement).__name__}")
    return placement


def _stage_rules(p: Placement) -> list[tuple[str, tuple[int, ...], str]]:
    """(setting, stages that offer it, the requirement in words) for each setting ``p`` uses."""
    rules = []
    if p.offload_optimizer == "cpu":
        rules.append(("offload_optimizer='cpu'", (1, 2, 3), "ZeRO stage 1, 2 or 3"))
    elif p.offload_optimizer == "nvme":
        rules.append(("offload_optimizer='nvme'", (3,),
                      "ZeRO stage 3 (DeepSpeed's stages 1-2 have no NVMe path)"))
    if p.offload_params != "none":
        rules.append((f"offload_params={p.offload_params!r}", (3,),
                      "ZeRO stage 3 (only stage 3 partitions parameters)"))
    if p.hpz_partition > 1:
        rules.append(("hpz_partition > 1 (ZeRO++ hpZ)", (3,), "ZeRO stage 3"))
    return rules


def offered_stages(placement: Placement | None) -> tuple[int, ...]:
    """The stages at which ``placement`` is offered (all four for the default)."""
    stages = set(STAGES)
    for _, allowed, _ in _stage_rules(check_placement(placement)):
        stages &= set(allowed)
    return tuple(sorted(stages))


def check_combination(stage: np.ndarray, gpus: np.ndarray, placement: Placement) -> None:
    """Refuse what DeepSpeed does not offer (see the module doc), naming the setting."""
    p = placement
    for what, allowed, where in _stage_rules(p):
        bad = ~np.isin(stage, allowed)
        if np.any(bad):
            raise ValueError(f"{what} needs {where}, got stage "
                             f"{int(stage.ravel()[np.flatnonzero(bad.ravel())[0]])}")
    if p.hpz_partition > 1:
        if np.any(gpus % p.hpz_partition):
            raise ValueError(f"hpz_partition ({p.hpz_partition}) must divide gpus, got gpus "
                             f"{int(gpus.ravel()[np.flatnonzero((gpus % p.hpz_partition).ravel())[0]])}")
        if p.shard_group is not None and np.any(gpus != p.shard_group):
            raise ValueError("hpz_partition > 1 needs the shard group to be every GPU (ZeRO++ "
                             "shards over all of them; MiCS and HSDP are the shard-group variant)")


def gpus_on_node(gpus, gpus_per_node: int | None) -> np.ndarray:
    """GPUs on one (the fullest) node: ``gpus_per_node`` (default 8), or ``gpus`` when fewer.

    ``gpus`` must fill whole nodes when it is more than one node's worth.
    """
    gpus = np.asarray(gpus)
    per_node = DEFAULT_GPUS_PER_NODE if gpus_per_node is None else gpus_per_node
    bad = (gpus > per_node) & (gpus % per_node != 0)
    if np.any(bad):
        first = int(gpus.ravel()[np.flatnonzero(bad.ravel())[0]])
        raise ValueError(f"gpus ({first}) must fill whole nodes of gpus_per_node ({per_node}); "
                         "set gpus_per_node (--gpus-per-node)")
    return np.minimum(gpus, per_node)


@dataclass(frozen=True)
class TierState:
    """Bytes per GPU of each item on each tier, broadcast over (params, gpus, stage).

    ``bytes[tier][item]`` is an int64 array; an item a tier does not hold is 0.
    ``gpus_on_node`` is how many GPUs share one node's CPU memory and NVMe.
    """

    params: np.ndarray = field(repr=False)
    gpus: np.ndarray = field(repr=False)
    stage: np.ndarray = field(repr=False)
    layout: Layout
    placement: Placement
    gpus_on_node: np.ndarray = field(repr=False)
    bytes: Mapping[str, Mapping[str, np.ndarray]] = field(repr=False)
    state: ModelState = field(repr=False)   # everything on the GPU, before offload

    def total(self, tier: str) -> np.ndarray:
        """Bytes per GPU on ``tier``."""
        if tier not in TIERS:
            raise ValueError(f"tier must be one of {', '.join(TIERS)}, got {echo(tier)}")
        return sum(self.bytes[tier][item] for item in ITEMS)

    def per_node(self, tier: str) -> np.ndarray:
        """Bytes on ``tier`` summed over one node's GPUs (exact; int64 where it fits)."""
        return exact_product(self.total(tier), self.gpus_on_node)

    @property
    def gpu(self) -> np.ndarray:
        return self.total("gpu")

    @property
    def cpu(self) -> np.ndarray:
        return self.total("cpu")

    @property
    def nvme(self) -> np.ndarray:
        return self.total("nvme")

    def gpu_categories(self) -> dict[str, np.ndarray]:
        """The GPU tier as the three categories of ``model_state`` (hpZ's copy is parameters)."""
        gpu = self.bytes["gpu"]
        return {"parameters": gpu["parameters"] + gpu["hpz_secondary"],
                "gradients": gpu["gradients"], "optimizer": gpu["optimizer"]}

    def as_dict(self, index=()) -> dict:
        """The JSON form at one point (``index`` into the broadcast arrays): per tier, bytes
        per item, ``total`` per GPU and ``per_node``."""
        out = {}
        for tier in TIERS:
            entry = {item: int(self.bytes[tier][item][index]) for item in ITEMS}
            entry["total"] = int(self.total(tier)[index])
            entry["per_node"] = int(self.per_node(tier)[index])
            out[tier] = entry
        return out


def _nbytes(elements, bits: int):
    return elements * (bits // 8) if bits % 8 == 0 else ceil_div(elements * bits, 8)


def place(params, gpus, stage, layout: str | Layout = "mixed-adam",
          placement: Placement | None = None, world=None) -> TierState:
    """Bytes per GPU of each item on each tier (see the module doc); broadcast like
    :func:`zerolib.core.memory.accounting.model_state`.

    ``gpus`` are the data-parallel GPUs the state is sharded over; ``world`` (default: ``gpus``)
    all GPUs, which fill the nodes (with tensor parallelism, t x ``gpus``).
    """
    layout, placement = get_layout(layout), check_placement(placement)
    state = model_state(params, gpus, stage, layout, placement.shard_group)  # checks them all
    check_combination(state.stage, state.gpus, placement)
    world = state.gpus if world is None else np.broadcast_to(check_gpus(world, "world"),
                                                             state.gpus.shape)
    return tiers_of(state, placement, world)


def tiers_of(state: ModelState, placement: Placement, world: np.ndarray) -> TierState:
    """:func:`place` of checked inputs: a :class:`ModelState` sharded over
    ``placement.shard_group``, a combination DeepSpeed offers, ``world`` GPUs in its shape (the
    planner's path, which made them from what it checked once)."""
    params, gpus, stage, layout = state.params, state.gpus, state.stage, state.layout
    on_node = gpus_on_node(world, placement.gpus_per_node)
    p = placement

    zero = np.zeros(params.shape, dtype=np.int64)
    tiers = {tier: dict.fromkeys(ITEMS, zero) for tier in TIERS}
    gpu = tiers["gpu"]
    gpu.update(parameters=state.parameters, gradients=state.gradients, optimizer=state.optimizer)
    shard = ceil_div(params, state.shards)   # one GPU's partition, in elements

    if p.offload_optimizer != "none":
        host = tiers[p.offload_optimizer]
        host["optimizer"] = state.optimizer                  # stages 1-3: already the partition
        host["gradients"] = _nbytes(shard, int(round(p.host_gradient_bytes * 8)))
        gpu["optimizer"] = zero
        gpu["gradients"] = np.where(stage >= 2, 0, state.gradients)   # stage 1 keeps its own
    if p.offload_params != "none":
        moved = state.parameters                             # stage 3: the 16-bit shard
        gpu["parameters"] = zero
        if p.offload_params == "cpu":
            tiers["cpu"]["parameters"] = moved
        else:
            in_cpu = _nbytes(np.minimum(shard, p.max_in_cpu), layout.bits_per_param("parameters"))
            tiers["cpu"]["parameters"] = in_cpu
            tiers["nvme"]["parameters"] = moved - in_cpu
    if p.hpz_partition > 1:
        gpu["hpz_secondary"] = _nbytes(ceil_div(params, p.hpz_partition),
                                       layout.bits_per_param("parameters"))
    frozen = MappingProxyType({tier: MappingProxyType(items) for tier, items in tiers.items()})
    return TierState(params, gpus, stage, layout, placement, on_node, frozen, state)


@dataclass(frozen=True)
class Option:
    """One way of placing the state, as the chapter compares them: a stage, what is offloaded
    where, and whether hpZ keeps its in-node copy (over the GPUs of one node)."""

    name: str
    stage: int
    offload_optimizer: str = "none"
    offload_params: str = "none"
    hpz: bool = False

    def placement(self, gpus: int, shard_group: int | None = None,
                  gpus_per_node: int | None = None) -> Placement:
        """The Placement of this option on ``gpus`` data-parallel GPUs."""
        hpz = int(gpus_on_node(gpus, gpus_per_node)) if self.hpz else 1
        if self.hpz and hpz < 2:
            raise ValueError("hpZ needs at least 2 GPUs per node to shard its copy over")
        return Placement(shard_group=shard_group, hpz_partition=hpz,
                         offload_optimizer=self.offload_optimizer,
                         offload_params=self.offload_params, gpus_per_node=gpus_per_node)


# The chapter's options, from everything on the GPU to everything on NVMe (ZeRO-Offload is
# stage 2 with the optimizer on the CPU; ZeRO-Infinity stage 3 with both offloaded).
OPTIONS = (
    Option("ZeRO-2", 2),
    Option("ZeRO-2 + optimizer on CPU (ZeRO-Offload)", 2, offload_optimizer="cpu"),
    Option("ZeRO-3", 3),
    Option("ZeRO-3 + hpZ copy (ZeRO++)", 3, hpz=True),
    Option("ZeRO-3 + optimizer on CPU", 3, offload_optimizer="cpu"),
    Option("ZeRO-3 + optimizer, parameters on CPU", 3, offload_optimizer="cpu",
           offload_params="cpu"),
    Option("ZeRO-3 + optimizer, parameters on NVMe (ZeRO-Infinity)", 3, offload_optimizer="nvme",
           offload_params="nvme"),
)
