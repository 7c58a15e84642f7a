"""What offload moves between a GPU and its host in one step: PCIe copies and NVMe reads and
writes, per GPU, for the placements of :mod:`zerolib.core.memory.placement`; and the CPU's
optimizer step on the host.

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
another, after the copies (data from the drives passes through CPU memory), each at the GPU's
share of the node's drives: min(the drives' summed rate / GPUs on the node, the host link's
rate), the drives of :mod:`zerolib.core.catalogue.hosts` read and written as one RAID 0 array
(a DGX H100's eight PCIe 4.0 drives: 8 x 6.4 GB/s read, 8 x 3.8 GB/s written, 6.4 and 3.8 GB/s
per GPU, against 31.5 GB/s of PCIe 4.0 x16; ZeRO-Infinity's DGX-2 reached 1.6 GB/s of NVMe
per GPU, its Fig. 2(b)). An explicit ``nvme_link`` times them at that
link's rate instead (the model before drives were catalogued). What overlaps what is
:mod:`zerolib.core.step.time`'s: forward and backward copies run while the GPU computes (the
parameter fetches are prefetched, the gradients copied bucket by bucket), the after-step ones do
not.

**The CPU's optimizer step.** With the optimizer offloaded, Adam runs on the host's CPUs
(DeepSpeed's ``DeepSpeedCPUAdam``, "5X--7X faster than the standard PyTorch implementation",
DeepSpeed's ZeRO-Offload tutorial) over each GPU's partition, after the backward pass (the
gradients must all have arrived) and before the next forward (which needs the updated
parameters): in DeepSpeed's default ZeRO-Offload it overlaps nothing on the GPU (Ren et al.,
Sec. 4.1 and Fig. 5: the single-GPU schedule runs the CPU step between one iteration's backward
and the next one's forward; their one-step *delayed parameter update*, Sec. 5.2, which overlaps
it with the next step's compute from the first iterations on, is not DeepSpeed's default and
is not modelled here). With
the state on NVMe it runs between the state's read and its write-back (DeepSpeed's
``pipeline_read`` / ``pipeline_write`` default to false: no overlap). Its time per GPU is the
larger of

- a **roofline** on the host's memory bandwidth (always applied, a lower bound): Adam streams
  each element of the partition through memory once: it reads the fp32 master parameter,
  momentum and variance (the layout's optimizer bytes) and the host gradient (4 bytes), and
  writes the three back and the 16-bit parameter (2 bytes): 2 x 12 + 4 + 2 = 30 bytes per
  parameter for mixed-precision Adam. The node's GPUs step at once, so a GPU's partition gets
  1 / (GPUs on the node) of the bandwidth: time = partition x 30 B x GPUs on node / bandwidth.
  For Llama-2-70B (68,976,648,192 parameters) on one DGX A100 node (409.6 GB/s): 30 x
  68,976,648,192 / 409.6e9 = 5.05 s a step;
- a **measured rate** when one is given (``cpu_adam_rate``, parameters per second the node's
  CPUs update together, e.g. from DeepSpeed's CPU-Adam benchmark on that host): time =
  partition x GPUs on node / rate.

Left out: write-allocate reads of the written lines (non-temporal stores avoid them), the
gradient's fp16-to-fp32 conversion passes and the loss-scale overflow check (each one more
read of the gradients), NUMA placement.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

import numpy as np

from zerolib.core.catalogue.hosts import DEFAULT_HOST, HOSTS, Host, get_host
from zerolib.core.catalogue.links import HOST_LINKS, LINKS, Link, get_link  # noqa: F401 (HOST_LINKS: where callers find it)
from zerolib.core.defaults import DEFAULT_HOST_LINK, MAX_CPU_ADAM_RATE  # noqa: F401
from zerolib.core.inputs import echo
from zerolib.core.intmath import ceil_div
from zerolib.core.memory.accounting import Layout, get_layout
from zerolib.core.memory.placement import Placement, TierState, check_placement, place
from zerolib.core.step.collectives import to_bytes
from zerolib.core.step.traffic import STEP_PHASES

DIRECTIONS = ("to_gpu", "to_host", "nvme_read", "nvme_write")


def check_cpu_adam_rate(value, name: str = "cpu_adam_rate") -> float | None:
    """None (the roofline alone) or a measured rate: parameters per second, above 0."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer,
                                                                     np.floating)):
        raise TypeError(f"{name} must be a number of parameters per second above 0 (or None), "
                        f"got {echo(value)}")
    if not math.isfinite(value) or not 0 < value <= MAX_CPU_ADAM_RATE:
        raise ValueError(f"{name} must be a number of parameters per second above 0 and at most "
                         f"{MAX_CPU_ADAM_RATE:.0e}, got {echo(value)}")
    return float(value)


def check_host_link(host_link: str | Link) -> Link:
    """The PCIe link offload copies run on (a name of :data:`zerolib.core.catalogue.links.LINKS`)."""
    try:
        link = get_link(host_link, "host_link")
    except ValueError:   # name the PCIe links, the only ones allowed here
        raise ValueError(f"host_link must be a PCIe link ({', '.join(HOST_LINKS)}), got "
                         f"{echo(host_link)}") from None
    if link.kind != "pcie":
        raise ValueError(f"host_link must be a PCIe link ({', '.join(HOST_LINKS)}), got {link.name}")
    return link


@dataclass(frozen=True)
class HostSettings:
    """The host offload runs on (:data:`zerolib.core.catalogue.hosts.HOSTS`: its memory bandwidth
    bounds the CPU's optimizer step, its drives time NVMe), optionally a measured CPU-Adam rate
    in parameters per second for the whole node (None: the roofline alone), the PCIe link each
    GPU copies to and from it over (``host_link``, one of :data:`HOST_LINKS`), and a link to
    time NVMe at instead of the host's drives (``nvme_link``; None: the drives)."""

    host: Host | str = DEFAULT_HOST
    cpu_adam_rate: float | None = None
    host_link: Link | str = DEFAULT_HOST_LINK
    nvme_link: Link | str | None = None

    def __post_init__(self):
        object.__setattr__(self, "host", get_host(self.host))
        object.__setattr__(self, "cpu_adam_rate", check_cpu_adam_rate(self.cpu_adam_rate))
        object.__setattr__(self, "host_link", check_host_link(self.host_link))
        if self.nvme_link is not None:
            object.__setattr__(self, "nvme_link", get_link(self.nvme_link, "nvme_link"))

    def with_host_link(self, host_link: Link) -> HostSettings:
        """These settings over ``host_link``, a PCIe link the caller checked
        (:func:`check_host_link`), made without checking the rest again."""
        if host_link is self.host_link:
            return self
        twin = copy.copy(self)
        object.__setattr__(twin, "host_link", host_link)
        return twin

    def __deepcopy__(self, memo) -> HostSettings:
        return self  # immutable

    @property
    def basis(self) -> str:
        return "roofline" if self.cpu_adam_rate is None else "roofline and measured rate"

    def as_dict(self) -> dict:
        return {"host": self.host.as_dict(), "cpu_adam_rate": self.cpu_adam_rate,
                "cpu_step_basis": self.basis}


DEFAULT_HOST_SETTINGS = HostSettings()
# Each catalogued host at the roofline alone, made once: the default for a node of its name.
HOST_SETTINGS: Mapping[str, HostSettings] = MappingProxyType(
    {name: HostSettings(name) for name in HOSTS})


def node_host_settings(node_name: str | None) -> HostSettings:
    """The default settings for a run on the node ``node_name``: its own host where the
    catalogue has it (:data:`zerolib.core.catalogue.hosts.HOSTS`), else
    :data:`DEFAULT_HOST_SETTINGS`; the roofline alone."""
    key = node_name.strip().lower() if isinstance(node_name, str) else None
    return HOST_SETTINGS.get(key, DEFAULT_HOST_SETTINGS)


def host_settings_for(node_name: str | None, host: Host | str | None = None,
                      cpu_adam_rate: float | None = None, host_link: Link | str = DEFAULT_HOST_LINK,
                      nvme_link: Link | str | None = None) -> HostSettings:
    """``host`` (None: :func:`node_host_settings`' host for ``node_name``) with
    ``cpu_adam_rate`` (None: the roofline alone) and the links of :class:`HostSettings`,
    checked: a door's host settings."""
    if host is None and cpu_adam_rate is None and host_link == DEFAULT_HOST_LINK and nvme_link is None:
        return node_host_settings(node_name)
    return HostSettings(node_host_settings(node_name).host if host is None else host,
                        cpu_adam_rate, host_link, nvme_link)



def check_host_settings(value, name: str = "host_settings") -> HostSettings:
    """A :class:`HostSettings` (None: :data:`DEFAULT_HOST_SETTINGS`)."""
    if value is None:
        return DEFAULT_HOST_SETTINGS
    if not isinstance(value, HostSettings):
        raise TypeError(f"{name} must be a HostSettings, got {type(value).__name__}")
    return value


def _settings(value: HostSettings | None) -> HostSettings:
    # Below the door: settings already checked (or None for the default).
    return DEFAULT_HOST_SETTINGS if value is None else value


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

    @cached_property
    def cpu_step_elements(self) -> np.ndarray:
        """Elements the CPU's optimizer step updates for this GPU: its partition when the
        optimizer is offloaded, else 0."""
        t = self.tiers
        if t.placement.offload_optimizer == "none":
            return np.zeros(t.params.shape, dtype=np.int64)
        return np.broadcast_to(ceil_div(t.params, t.state.shards), t.params.shape)

    @cached_property
    def cpu_step_bytes(self) -> np.ndarray:
        """Bytes the CPU's optimizer step streams through host memory for this GPU (see the
        module doc): the optimizer state read and written, the host gradients read, the
        16-bit parameters written. 0 without an offloaded optimizer."""
        t = self.tiers
        if t.placement.offload_optimizer == "none":
            return np.zeros(t.params.shape, dtype=np.int64)
        optimizer = t.bytes["cpu"]["optimizer"] + t.bytes["nvme"]["optimizer"]
        gradients = t.bytes["cpu"]["gradients"] + t.bytes["nvme"]["gradients"]
        written = to_bytes(self.cpu_step_elements, t.layout.bits_per_param("parameters"))
        return 2 * optimizer + gradients + written

    def _on_node(self, gpus_on_node) -> np.ndarray:
        on_node = self.tiers.gpus_on_node if gpus_on_node is None else gpus_on_node
        return np.broadcast_to(np.asarray(on_node, dtype=np.float64), self.tiers.params.shape)

    def cpu_roofline_seconds(self, host: HostSettings | None = None,
                             gpus_on_node=None) -> np.ndarray:
        """The memory-bandwidth lower bound of the CPU's optimizer step per GPU: its bytes at
        its 1 / (GPUs on the node) share of the host's memory bandwidth."""
        settings = _settings(host)
        return (self.cpu_step_bytes.astype(np.float64) * self._on_node(gpus_on_node)
                / settings.host.memory_bandwidth)

    def cpu_seconds(self, host: HostSettings | None = None, gpus_on_node=None) -> np.ndarray:
        """Seconds of the CPU's optimizer step per GPU: the roofline, or the measured rate's
        time where that is longer (see the module doc). ``gpus_on_node``: how many GPUs share
        the host (default: the placement's)."""
        settings = _settings(host)
        seconds = self.cpu_roofline_seconds(settings, gpus_on_node)
        if settings.cpu_adam_rate is not None:
            rated = (self.cpu_step_elements.astype(np.float64) * self._on_node(gpus_on_node)
                     / settings.cpu_adam_rate)
            seconds = np.maximum(seconds, rated)
        return seconds

    def nvme_bandwidth(self, host_link: str | Link = DEFAULT_HOST_LINK,
                       nvme_link: str | Link | None = None, host: HostSettings | None = None,
                       gpus_on_node=None) -> tuple[np.ndarray, np.ndarray]:
        """(read, write) bytes per second of one GPU's NVMe traffic: its share of the host's
        drives, capped at the host link (or ``nvme_link``'s rate both ways, where given)."""
        if nvme_link is not None:
            rate = np.full(self.tiers.params.shape, float(get_link(nvme_link).bandwidth))
            return rate, rate
        drives = _settings(host).host
        link = float(get_link(host_link).bandwidth)
        on_node = self._on_node(gpus_on_node)
        return (np.minimum(drives.nvme_read / on_node, link),
                np.minimum(drives.nvme_write / on_node, link))

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
                nvme_link: str | Link | None = None, host: HostSettings | None = None,
                gpus_on_node=None) -> Mapping[str, np.ndarray]:
        """Seconds of the transfers per phase (float64): PCIe copies both ways at once, then
        NVMe reads and writes one after another at the GPU's share of the drives (see the
        module doc). The CPU's optimizer step is :meth:`cpu_seconds`."""
        link = get_link(host_link)
        read, write = self.nvme_bandwidth(link, nvme_link, host, gpus_on_node)
        out = {}
        for phase in STEP_PHASES:
            b = self.phase_bytes(phase)
            copies = np.maximum(b["to_gpu"], b["to_host"]).astype(np.float64) / link.bandwidth
            drives = b["nvme_read"] / read + b["nvme_write"] / write
            out[phase] = copies + drives
        return MappingProxyType(out)


def host_traffic(params, gpus, stage, layout: str | Layout = "mixed-adam",
                 placement: Placement | None = None) -> HostTraffic:
    """What ``placement``'s offload moves per GPU and step (nothing without offload); arguments
    as :func:`zerolib.core.memory.placement.place`, which checks them."""
    return HostTraffic(place(params, gpus, stage, get_layout(layout), check_placement(placement)))
