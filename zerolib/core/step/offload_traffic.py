"""What offload moves between a GPU and its host in one step: PCIe copies and NVMe reads and
writes, per GPU, for the placements of :mod:`zerolib.core.memory.placement`.

ZeRO-Offload (Ren et al., USENIX ATC 2021, Fig. 2 and Sec. 4) keeps the 16-bit parameters on
the GPU and the optimizer step on the CPU, and moves the least it can: each step the GPU's
gradients go **down** to the host (its fp16 gradient edge, 2M bytes for M parameters on one
GPU) and the updated 16-bit parameters come back **up** (2M): 4M per step, which the paper
shows to be the minimum of any offload strategy. With N GPUs each moves its own partition
(its Fig. 4: partitions offloaded ZeRO-2 style). zerolib counts, per GPU and step:

- ``offload_optimizer`` (cpu or nvme), stages 1-3: the GPU's reduced gradient partition,
  ceil(P / shards) elements at the layout's gradient width, down during the backward pass;
  after the CPU's step, the partition's updated parameters at the parameter width, up (unless
  the parameters live on the host too: then the CPU updates them in place and nothing comes
  up). This is ZeRO-Offload's convention (what the GPU holds is what crosses; an engine that
  converts to fp32 before the copy would move 4 bytes per gradient).
- ``offload_params`` (cpu or nvme), stage 3 (ZeRO-Infinity): the GPU's parameter shard, the
  bytes the host tier holds, comes up before each layer's forward and again before its backward
  (both passes gather it); with the optimizer on the GPU the updated shard goes back down after
  the step.
- **NVMe** (ZeRO-Infinity, DeepSpeed's ``device: nvme``): every byte that a step uses and the
  placement keeps on NVMe is read from the drives when used and written back when it changes:
  the optimizer state (and the fp32 gradients beside it) read for the step and written after
  it, the gradients written as they arrive; parameters on NVMe read in each pass (forward and
  backward) and written once after the update.

**Time.** PCIe is full duplex: a link's rate applies in each direction at once, so a phase's
copies take max(bytes up, bytes down) / rate; NVMe reads and writes of a phase run one after
another at the NVMe link's rate, after the copies (data from the drives passes through CPU
memory). The link is one of :data:`zerolib.core.catalogue.links.LINKS` (PCIe 4.0 or 5.0 x16 by
default; a real NVMe drive is slower: 1.6 GB/s per GPU of NVMe bandwidth on the DGX-2 of
ZeRO-Infinity's Fig. 2(b), against 3.0 GB/s of CPU memory per GPU). What overlaps what is
:mod:`zerolib.core.step.time`'s: forward and backward copies run while the GPU computes (the
parameter fetches are prefetched, the gradients copied bucket by bucket), the after-step ones do
not. The CPU's optimizer step itself takes time that the model leaves out, as it leaves out
the GPU's.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

import numpy as np

from zerolib.core.catalogue.links import LINKS, Link, get_link
from zerolib.core.intmath import ceil_div
from zerolib.core.memory.accounting import Layout, get_layout
from zerolib.core.memory.placement import Placement, TierState, check_placement, place
from zerolib.core.step.collectives import to_bytes
from zerolib.core.step.traffic import STEP_PHASES

DIRECTIONS = ("to_gpu", "to_host", "nvme_read", "nvme_write")
DEFAULT_HOST_LINK = "pcie4-x16"
# The links a GPU copies to and from its host's memory over.
HOST_LINKS = tuple(name for name, link in LINKS.items() if link.kind == "pcie")


@dataclass(frozen=True)
class HostSlot:
    """One transfer of a step between a GPU, its host's memory and the host's NVMe drives."""

    name: str
    label: str
    phase: str        # forward | backward | after_step
    direction: str    # to_gpu | to_host | nvme_read | nvme_write


HOST_SLOTS: tuple[HostSlot, ...] = (
    HostSlot("parameters_up_forward", "parameter shard from the host, before each layer's "
             "forward", "forward", "to_gpu"),
    HostSlot("parameters_from_nvme_forward", "parameter shard read from NVMe for the forward",
             "forward", "nvme_read"),
    HostSlot("parameters_up_backward", "parameter shard from the host, before each layer's "
             "backward", "backward", "to_gpu"),
    HostSlot("parameters_from_nvme_backward", "parameter shard read from NVMe for the "
             "backward", "backward", "nvme_read"),
    HostSlot("gradients_down", "reduced gradient partition to the host, during backward",
             "backward", "to_host"),
    HostSlot("gradients_to_nvme", "fp32 gradient partition written to NVMe", "backward",
             "nvme_write"),
    HostSlot("optimizer_from_nvme", "optimizer state and fp32 gradients read from NVMe for the "
             "step", "after_step", "nvme_read"),
    HostSlot("optimizer_to_nvme", "optimizer state written back to NVMe after the step",
             "after_step", "nvme_write"),
    HostSlot("parameters_up_after_step", "updated parameter partition back to the GPU after the "
             "CPU's step", "after_step", "to_gpu"),
    HostSlot("parameters_down_after_step", "updated parameter shard back to the host after the "
             "GPU's step", "after_step", "to_host"),
    HostSlot("parameters_to_nvme", "updated parameter shard written to NVMe", "after_step",
             "nvme_write"),
)
HOST_SLOT_NAMES = tuple(s.name for s in HOST_SLOTS)


@dataclass(frozen=True)
class HostTraffic:
    """Bytes per GPU of each slot of :data:`HOST_SLOTS` in one step (int64 arrays broadcast
    like the placement's :class:`~zerolib.core.memory.placement.TierState`; 0 where unused)."""

    tiers: TierState = field(repr=False)

    @cached_property
    def bytes(self) -> Mapping[str, np.ndarray]:
        t, p = self.tiers, self.tiers.placement
        zero = np.zeros(t.params.shape, dtype=np.int64)
        out = dict.fromkeys(HOST_SLOT_NAMES, zero)
        layout = t.layout
        shard = ceil_div(t.params, t.state.shards)     # the GPU's partition, elements
        optimizer = p.offload_optimizer != "none"
        if p.offload_params != "none":
            host_params = t.bytes["cpu"]["parameters"] + t.bytes["nvme"]["parameters"]
            nvme_params = t.bytes["nvme"]["parameters"]
            out.update(parameters_up_forward=host_params, parameters_up_backward=host_params,
                       parameters_from_nvme_forward=nvme_params,
                       parameters_from_nvme_backward=nvme_params,
                       parameters_to_nvme=nvme_params)
            if not optimizer:
                out["parameters_down_after_step"] = host_params
        if optimizer:
            out["gradients_down"] = to_bytes(shard, layout.bits_per_param("gradients"))
            if p.offload_params == "none":
                out["parameters_up_after_step"] = to_bytes(shard,
                                                           layout.bits_per_param("parameters"))
            nvme = t.bytes["nvme"]
            out.update(gradients_to_nvme=nvme["gradients"],
                       optimizer_from_nvme=nvme["optimizer"] + nvme["gradients"],
                       optimizer_to_nvme=nvme["optimizer"])
        return MappingProxyType(out)

    def by_direction(self) -> dict[str, np.ndarray]:
        """Bytes per direction of :data:`DIRECTIONS` in the step."""
        out = {d: np.zeros(self.tiers.params.shape, dtype=np.int64) for d in DIRECTIONS}
        for s in HOST_SLOTS:
            out[s.direction] = out[s.direction] + self.bytes[s.name]
        return out

    def phase_bytes(self, phase: str) -> dict[str, np.ndarray]:
        """Bytes per direction in ``phase``."""
        out = {d: np.zeros(self.tiers.params.shape, dtype=np.int64) for d in DIRECTIONS}
        for s in HOST_SLOTS:
            if s.phase == phase:
                out[s.direction] = out[s.direction] + self.bytes[s.name]
        return out

    def seconds(self, host_link: str | Link = DEFAULT_HOST_LINK,
                nvme_link: str | Link | None = None) -> Mapping[str, np.ndarray]:
        """Seconds per phase (float64): PCIe copies both ways at once, then NVMe reads and
        writes one after another (see the module doc)."""
        host = get_link(host_link)
        nvme = host if nvme_link is None else get_link(nvme_link)
        out = {}
        for phase in STEP_PHASES:
            b = self.phase_bytes(phase)
            copies = np.maximum(b["to_gpu"], b["to_host"]).astype(np.float64) / host.bandwidth
            drives = (b["nvme_read"] + b["nvme_write"]).astype(np.float64) / nvme.bandwidth
            out[phase] = copies + drives
        return MappingProxyType(out)


def host_traffic(params, gpus, stage, layout: str | Layout = "mixed-adam",
                 placement: Placement | None = None) -> HostTraffic:
    """What ``placement``'s offload moves per GPU and step (nothing without offload); arguments
    as :func:`zerolib.core.memory.placement.place`, which checks them."""
    return HostTraffic(place(params, gpus, stage, get_layout(layout), check_placement(placement)))
