"""Offload in the step beside tensor and pipeline parallelism: the offload menu the planner tries
(:data:`OFFLOADS`, as DeepSpeed offers it), its host transfers and CPU step per setting, and the
shard group's traffic, for :mod:`zerolib.core.step.parallel` and its callers.

Each GPU's host copies are :mod:`zerolib.core.step.offload_traffic`'s (ZeRO-Offload's bytes:
the reduced gradient partition down at the gradient width, the updated 16-bit partition up, the
parameter shard up before each pass), for the parameters this GPU holds
(:func:`zerolib.core.memory.model_parallel.parameters_per_gpu` of its pipeline stage), on the
host settings' PCIe ``host_link`` at full duplex, added to the collectives of the phase they
run in, as :func:`zerolib.core.step.time.step_time` adds them. When, in DeepSpeed 0.19.8
(:func:`zerolib.core.step.parallel.parallel_step_time`):

- the gradient partition goes down **every micro-batch** under stages 2 and 3, during the
  backward (``stage3.py`` ``partition_grads`` copies each reduced partition into the
  CPU-resident ``grad_partitions_flat_buffer`` on every micro-step; ``stage_1_and_2.py``
  ``copy_grads_in_partition`` through ``async_accumulate_grad_in_cpu_via_gpu`` while gradients
  accumulate), and **once per step** under stage 1, which reduces only at the accumulation
  boundary (``engine.py`` ``allreduce_gradients``), joining that reduction;
- the parameter shard comes up **every micro-batch**, before each layer's forward and again
  before its backward (``partition_parameters.py`` ``all_gather_coalesced`` copies
  ``ds_tensor`` to the GPU on every gather), overlapping the pass that needs it;
- the updated 16-bit partition comes up **once per step**, after the CPU's optimizer step
  (``stage_1_and_2.py`` ``step``: ``bit16_partitions[partition_id].data.copy_(...)``;
  ``stage3.py`` ``_reassign_or_swap_out_partitioned_parameters``), hidden behind nothing; with
  the parameters on the host too the CPU updates them in place and nothing comes up;
- the CPU's optimizer step runs **once per step**, after the last micro-batch's backward and
  before the updated partition comes up, hidden behind nothing
  (:meth:`zerolib.core.step.offload_traffic.HostTraffic.cpu_seconds`: the host's memory-bandwidth
  roofline, or a measured ``cpu_adam_rate`` where slower; the host by default the node's own,
  :func:`zerolib.core.step.offload_traffic.node_host_settings`); NVMe reads and writes run at
  each GPU's share of the host's drives.

Left out of offload's time: DeepSpeed's read-back of the accumulated gradient partition from
the second micro-batch on (it adds on the GPU: up as many bytes as go down, which costs time
only where parameters come up in the same pass); its fp32 conversion before the last
micro-batch's copy (4 bytes per gradient where ZeRO-Offload counts the gradient's own width).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from functools import lru_cache
from types import MappingProxyType

import numpy as np

from zerolib.core.inputs import (
    MAX_GPUS,
    check_gpus,
    check_params,
    check_stage,
    echo,
)
from zerolib.core.memory.accounting import Layout, ModelState, check_shard_group, get_layout
from zerolib.core.memory.placement import Placement, check_combination, placement_on, tiers_of
from zerolib.core.step.offload_traffic import (  # noqa: F401  (check_host_link: where callers find it)
    HostSettings,
    HostTraffic,
    check_host_link,
    check_host_settings,
    node_host_settings,
)
from zerolib.core.step.traffic import (
    STEP_PHASES,
    Traffic,
    flat_traffic,
)

# Offload as DeepSpeed offers it, to the node's CPU memory (each entry: the Placement fields).
OFFLOADS: Mapping[str, Mapping[str, str]] = MappingProxyType({
    "none": MappingProxyType({}),
    "optimizer": MappingProxyType({"offload_optimizer": "cpu"}),
    "optimizer+parameters": MappingProxyType({"offload_optimizer": "cpu", "offload_params": "cpu"}),
})


def checked_node(data_parallel) -> int:
    """A node size under which :mod:`zerolib.core.step.traffic`'s and
    :mod:`zerolib.core.memory.placement`'s node checks hold for every data-parallel group of
    ``data_parallel``: their least common multiple (each d divides it, so every ring "sits inside
    one node" there). The rings are placed on the cluster by
    :func:`zerolib.core.step.collectives.ring_timing` instead; only the bytes, calls and rings, which
    do not depend on the node, are read."""
    node = math.lcm(*np.unique(data_parallel).tolist())
    if node > MAX_GPUS:
        raise ValueError(f"data_parallel degrees of one call must divide one cluster of at most "
                         f"{MAX_GPUS:,} GPUs (their least common multiple is {node:,})")
    return node


def shard_group_traffic(params, data_parallel, stage, layout: str | Layout = "mixed-adam",
                        shard_group=None) -> Traffic:
    """ZeRO's collectives per GPU and step for ``params`` on each GPU, sharded over a group of
    ``shard_group`` of the ``data_parallel`` GPUs (None: all of them): exactly
    :func:`zerolib.core.step.traffic.flat_traffic`'s (one flat buffer per pass). Read its
    ``sent``, ``calls``, ``ring_gpus`` and ``ring_stride``: it is placed on a node of every GPU
    of the call (:func:`checked_node`), so its ``cross_node``, ``ring_nodes`` and ``sharing``
    say nothing about the cluster; :func:`parallel_step_time` places each ring on it."""
    d = check_gpus(data_parallel, "data_parallel")
    return flat_traffic(params, d, stage, layout, shard_group, placement_on(checked_node(d)))


def offload_seconds(params, data_parallel, stage, offload="none", shard_group=None,
                    layout: str | Layout = "mixed-adam", host: HostSettings | None = None,
                    gpus_per_node: int | None = None) -> Mapping[str, np.ndarray]:
    """Seconds of one pass of each phase's host work per GPU (forward, backward, after_step;
    float64, broadcast): :func:`zerolib.core.step.offload_traffic.host_traffic`'s bytes for
    ``offload`` (names of :data:`OFFLOADS`) of ``params`` on each GPU, sharded over
    ``shard_group`` of the ``data_parallel`` GPUs, on ``host`` (a
    :class:`~zerolib.core.step.offload_traffic.HostSettings`; default: DGX A100's CPUs, the
    roofline alone, PCIe 4.0 x16): at its ``host_link``'s rate both ways at once; after_step also
    holds the CPU's optimizer step, the host shared by ``gpus_per_node`` GPUs (default: the
    host's); NVMe at each GPU's share of the host's drives. 0 where nothing is offloaded. When
    each runs in a step is :func:`parallel_step_time`'s."""
    d = check_gpus(data_parallel, "data_parallel")
    params, d, stage, codes = np.broadcast_arrays(check_params(params), d, check_stage(stage),
                                                  setting_codes(offload, tuple(OFFLOADS), "offload"))
    group = None if shard_group is None else check_shard_group(shard_group, d)
    check_offloads(stage, codes)
    host = check_host_settings(host, "host")
    per_node = (host.host.gpus if gpus_per_node is None
                else int(check_gpus(gpus_per_node, "gpus_per_node")))
    return host_seconds_of(params, d, stage, codes, group, get_layout(layout), host, per_node)


@lru_cache(maxsize=64)
def _offload_placement(code: int, gpus_per_node: int | None = None) -> Placement:
    """The placement of the offload of :data:`OFFLOADS` numbered ``code`` (made, and so
    checked, once)."""
    return Placement(gpus_per_node=gpus_per_node, **OFFLOADS[tuple(OFFLOADS)[code]])


def check_offloads(stage: np.ndarray, codes: np.ndarray) -> None:
    """Refuse an offload (codes: indices into :data:`OFFLOADS`) at a stage DeepSpeed does not
    offer it at, naming the setting (:func:`zerolib.core.memory.placement.check_combination`)."""
    for code in np.unique(codes[codes > 0]).tolist():
        placement = _offload_placement(code)
        check_combination(stage[codes == code], np.ones(1, dtype=np.int64), placement)


def host_seconds_of(params, d, stage, codes, group, layout, host: HostSettings | None = None,
                    gpus_per_node: int | None = None) -> Mapping[str, np.ndarray]:
    """:func:`offload_seconds` of checked values (offload codes: indices into
    :data:`OFFLOADS`; ``group`` dividing ``d``, or None; ``host`` None: the default host;
    ``gpus_per_node`` None: the host's GPUs), nothing checked again."""
    params, d, stage, codes = np.broadcast_arrays(params, d, stage, codes)
    group = d if group is None else np.broadcast_to(group, d.shape)
    host = node_host_settings(None) if host is None else host
    on_node = host.host.gpus if gpus_per_node is None else gpus_per_node
    out = {phase: np.zeros(d.shape) for phase in STEP_PHASES}
    moved = np.flatnonzero(codes.ravel() > 0)
    if not len(moved):
        return MappingProxyType(out)
    node = checked_node(d.ravel()[moved])
    for (g, code), rows in setting_groups((group.ravel()[moved], codes.ravel()[moved])):
        at = moved[rows]
        placement = _offload_placement(code, node).with_shard_group(g)
        gpus = d.ravel()[at]
        # place()'s checks held for every row when the settings were checked: its inner part.
        state = ModelState(params.ravel()[at], gpus, stage.ravel()[at], layout, np.full(len(at), g))
        traffic = HostTraffic(tiers_of(state, placement, gpus))
        # The node's GPUs share its host; the placement's node (checked_node) is for checks.
        seconds = traffic.seconds(host.host_link, host.nvme_link, host, on_node)
        cpu = traffic.cpu_seconds(host, on_node)
        for phase in STEP_PHASES:
            out[phase].ravel()[at] = seconds[phase] + (cpu if phase == "after_step" else 0.0)
    return MappingProxyType(out)


def setting_codes(value, allowed, name) -> np.ndarray:
    array = np.asarray(value, dtype=object)
    flat = array.ravel()
    for item in set(flat.tolist()):
        if item not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(map(str, allowed))}, got {echo(item)}")
    codes = np.zeros(array.shape, dtype=np.int64)
    for index, item in enumerate(allowed):
        codes[array == item] = index
    return codes


def setting_groups(columns):
    """(key, row indices) for each distinct row of ``columns`` (whole-number arrays of one
    shape, flattened): the per-key work runs once per distinct key, over its rows at once."""
    code = np.zeros(np.size(columns[0]), dtype=np.int64)
    levels = []
    for column in columns:    # one int64 code per row (mixed radix), then one 1-D unique
        values, inverse = np.unique(np.ravel(column), return_inverse=True)
        code = code * len(values) + np.ravel(inverse)
        levels.append(values)
    keys, inverse = np.unique(code, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.cumsum(np.bincount(inverse, minlength=len(keys)))[:-1]
    for key, rows in zip(keys.tolist(), np.split(order, bounds)):
        point = []
        for values in reversed(levels):
            key, digit = divmod(key, len(values))
            point.append(int(values[digit]))
        yield tuple(reversed(point)), rows
