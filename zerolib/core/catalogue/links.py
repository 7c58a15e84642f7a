"""The link catalogue: how fast bytes leave a GPU over each kind of connection, with sources.

Every bandwidth here is **per direction** (bytes per second one way, A to B). ``bandwidth`` is
the line rate, the figure NVIDIA's nccl-tests compare their "bus bandwidth" with (NCCL
maintainer S. Jeaugey, NVIDIA/nccl-tests issue #212: 450 GB/s per direction for H100 NVLink,
"the line rate"); ``achieved`` is what a ring collective reaches (below). Vendors
headline NVLink and PCIe **bidirectionally** (both directions added: "900 GB/s" for H100
NVLink is 450 GB/s each way), and network ports per direction (a 400 Gb/s InfiniBand port
carries 400 Gb/s each way, full duplex); ``headline`` quotes the vendor's figure and
``headline_is_bidirectional`` says which it is. These are line rates: NCCL itself reaches
about 80 % of NVLink's (its own model, ``src/graph/topo.h`` in NCCL 2.30.7, uses 20.6 GB/s per
H100 link of 25; Jeaugey: "with the protocol overhead (~20%) NCCL can get an effective NVLink
bandwidth of 370GB/s").

**Achieved bus bandwidth.** ``achieved`` is what NCCL's ring reaches on the link at large
messages, as nccl-tests report it (``busbw``: bytes a GPU sends per second, nccl-tests
``doc/PERFORMANCE.md``), each with its source in ``achieved_source``: a published measurement
where one was found, else NCCL's own model constant for the link (``src/graph/topo.h`` and
``topo.cc``, NCCL 2.30.7), named as such. :class:`LinkEfficiency` says which rate a collective
runs at: ``"achieved"`` (the default), ``"line-rate"`` (the vendor's figure, the chapter's
earlier model) or a fraction of the line rate in (0, 1]. How the bus bandwidth falls at small
messages is not a second factor: as in NCCL's own tuning model (``src/graph/tuning.cc``: time =
latency + bytes / bus bandwidth per algorithm and protocol) it is the latency term below. At
small messages NCCL switches to its LL and LL128 protocols, whose lower latency the model
leaves out, so small collectives are timed on the slow side; no published nccl-tests curve was
held against this fall.

**NVLink SHARP (NVLS).** On an NVSwitch node of the third generation (HGX H100 and H200) NCCL
runs an all-reduce inside the node on the switches themselves (NVLS, NCCL 2.17 and later, on by
default where the node has it), faster than its ring: ``nvls`` lists the bus bandwidth it
reaches by the node's GPUs in the collective, from the nccl-tests of NVIDIA/nccl issue #1455 (8
x H100 SXM, 2-4 GiB: "ALGO=RING busbw is about 365-370 GBps ... ALGO=NVLS ... Busbw increase
from 370 to 420, 440, 460, and 480 GBps when gpus increase from 4 to 5, 6, 7, and 8"), the same
as NCCL's maintainer gives for 8 GPUs (nccl-tests issue #212: "a peak busBw of ~480GB/s") and
within 2 % of S. Bekman's 8 x H200 (473.1 GB/s at 8 GiB, ml-engineering ``network/README.md``).
It applies to an all-reduce whose GPUs sit on one node, at the ``"achieved"`` efficiency only;
the reduce-scatters and all-gathers stay on the ring (their NVLS gain is not published here),
and so does an all-reduce across nodes (NCCL's NVLS-tree, measured at 310 GB/s on two nodes
and no gain on four in NVIDIA/nccl issue #1031, is left out). ``"ring"`` efficiency turns NVLS
off (NCCL_NVLS_ENABLE=0): the achieved ring rates alone.

**Across many nodes.** The achieved rate of a network port is the same whatever the node count.
Published nccl-tests on 3 to 32 nodes (``data/ring_at_scale.md``) sit below the ring model by
amounts that differ from cluster to cluster (5-14 % for H100 all-reduces on 4 and 8 nodes, the
8-node one closer), not by a fall with node count that a cited factor could carry, so none is
modelled; a cluster's own measured rate is set with a fraction of line rate.

``hop_latency`` is the time one step of a ring adds on that kind of link: NCCL's own tuning
constants for the ring algorithm with its Simple protocol, the one it uses for large messages
(``hwLat`` in ``src/graph/tuning.cc``, NCCL 2.30.7: NVLink 3.4 us, PCI 5.7 us, network 14.0 us
per step, on top of a base latency of 8.4 us per collective). They are NCCL's model constants,
not measurements.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

GBPS = 10**9               # bytes per second in one GB/s
GBIT = 10**9 // 8          # bytes per second in one Gb/s

# NCCL 2.30.7, src/graph/tuning.cc (Ring, Simple protocol), in seconds.
BASE_LATENCY = 8.4e-6      # baseLat: per collective
NVLINK_HOP = 3.4e-6        # hwLat[NVLINK]: per ring step
PCI_HOP = 5.7e-6           # hwLat[PCI]
NET_HOP = 14.0e-6          # hwLat[NET]

LINK_KINDS = ("nvlink", "pcie", "network")
# Bounds that keep every time derived from a link finite: up to 1 PB/s per direction, and a
# ring step of at most one second.
MAX_BANDWIDTH = 10**15
MAX_HOP_LATENCY = 1.0


@dataclass(frozen=True)
class Link:
    """One kind of connection out of a GPU (or out of a node, for a network port)."""

    name: str                 # the key typed on the command line, e.g. "nvlink4"
    label: str                # for legends, e.g. "NVLink 4 (H100)"
    kind: str                 # "nvlink" (incl. other GPU fabrics), "pcie" or "network"
    bandwidth: int            # bytes per second, per direction
    headline: str             # the vendor's figure as stated
    headline_is_bidirectional: bool
    hop_latency: float        # seconds per ring step (NCCL's constant for this kind of link)
    source: str
    achieved: int | None = None   # bytes per second NCCL's ring reaches (None: the line rate)
    achieved_source: str = ""
    # NVLS all-reduce bus bandwidth inside one node by GPUs in it: ((gpus, bytes/s), ...)
    nvls: tuple[tuple[int, int], ...] = ()
    nvls_source: str = ""

    def __post_init__(self):
        if self.kind not in LINK_KINDS:
            raise ValueError(f"kind must be one of {', '.join(LINK_KINDS)}, got {self.kind!r}")
        if not isinstance(self.bandwidth, int) or self.bandwidth <= 0:
            raise ValueError(f"bandwidth must be a positive whole number of bytes per second, "
                             f"got {self.bandwidth!r}")
        if self.bandwidth > MAX_BANDWIDTH:
            raise ValueError(f"bandwidth must be at most {MAX_BANDWIDTH:,} bytes per second, "
                             f"got {self.bandwidth!r}")
        if self.achieved is not None and (isinstance(self.achieved, bool)
                                          or not isinstance(self.achieved, int)
                                          or not 0 < self.achieved <= self.bandwidth):
            raise ValueError(f"achieved must be a whole number of bytes per second above 0 and at "
                             f"most the bandwidth {self.bandwidth:,}, got {self.achieved!r}")
        latency = self.hop_latency
        if (isinstance(latency, bool) or not isinstance(latency, (int, float))
                or not 0 <= latency <= MAX_HOP_LATENCY):   # NaN fails the comparison too
            raise ValueError(f"hop_latency must be 0 to {MAX_HOP_LATENCY:g} seconds, got "
                             f"{latency!r}")

    def __deepcopy__(self, memo) -> Link:
        return self  # immutable (pandas deep-copies DataFrame.attrs, which carry it)

    def as_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "bandwidth": self.bandwidth,
                "achieved_bandwidth": self.achieved_bandwidth, "hop_latency": self.hop_latency}

    def nvls_bandwidth(self, gpus) -> np.ndarray:
        """NVLS all-reduce bus bandwidth of ``gpus`` GPUs of one node (0 where it does not run)."""
        gpus = np.asarray(gpus, dtype=np.int64)
        out = np.zeros(gpus.shape)
        for count, rate in self.nvls:
            out = np.where(gpus == count, float(rate), out)
        return out

    @property
    def achieved_bandwidth(self) -> int:
        """Bytes per second per direction NCCL's ring reaches on this link at large messages."""
        return self.bandwidth if self.achieved is None else self.achieved


def _nvlink(name, label, per_direction_gbps, headline, source, achieved, achieved_source,
            nvls=(), nvls_source="") -> Link:
    return Link(name, label, "nvlink", per_direction_gbps * GBPS, headline, True, NVLINK_HOP,
                source, achieved, achieved_source, nvls, nvls_source)


def _network(name, label, gbit, source, achieved_gbps, achieved_source) -> Link:
    return Link(name, label, "network", gbit * GBIT, f"{gbit} Gb/s per port", False, NET_HOP,
                source, achieved_gbps * GBPS, achieved_source)


# What NCCL reaches over one network port (nccl-tests busbw at large messages). NCCL maintainer
# S. Jeaugey, NVIDIA/nccl-tests issue #119: "We usually consider 24GB/s is the peak performance
# per 200G NIC (12 GB/s for 100G NICs)"; NCCL's A. Laddy, issue #267: "CX-7 NICs at NDR rate
# (400Gbps) should achieve up to 48-49GB/s per NIC". RoCE ports use the same ConnectX NICs; no
# separate RoCE figure was found, so they take the InfiniBand figure of their rate.
_NIC_100G = ("NVIDIA/nccl-tests issue #119 (S. Jeaugey): '12 GB/s for 100G NICs' (96 % of "
             "12.5 GB/s)")
_NIC_200G = ("NVIDIA/nccl-tests issue #119 (S. Jeaugey): 'We usually consider 24GB/s is the "
             "peak performance per 200G NIC' (96 % of 25 GB/s)")
_NIC_400G = ("NVIDIA/nccl-tests issue #267 (A. Laddy): 'CX-7 NICs at NDR rate (400Gbps) should "
             "achieve up to 48-49GB/s per NIC'; the lower end, 48 GB/s (96 % of 50 GB/s)")
_ROCE = "; no RoCE figure published, the InfiniBand NIC's of the same rate is used"
# NCCL's PCIe model (src/graph/topo.cc, NCCL 2.30.7): width x per-lane rate / 80 with 120 for
# 16 GT/s and 240 for 32 GT/s (in 100 Mb/s), 24 and 48 GB/s at x16; no published ring busbw
# over PCIe alone was found.
_PCIE = ("no published nccl-tests figure found; NCCL's own PCIe model, src/graph/topo.cc "
         "(NCCL 2.30.7): bw = width x speed / 80 = 16 x {speed} / 80 = {gbps} GB/s")


LINKS: Mapping[str, Link] = MappingProxyType({link.name: link for link in (
    _nvlink("nvlink2", "NVLink 2 (V100)", 150, "300 GB/s total bidirectional per GPU",
            "NVIDIA DGX-1 with Tesla V100 system architecture whitepaper: 'Each V100 GPU supports "
            "up to six links ... up to 300 GB/s in total bi-directional bandwidth' (six links of "
            "25 GB/s each way)", 120 * GBPS,
            "no published nccl-tests figure found; NCCL's own model, src/graph/topo.h (NCCL "
            "2.30.7): SM70_NVLINK_BW 20.0 GB/s per link, x 6 links = 120 GB/s"),
    _nvlink("nvlink3", "NVLink 3 (A100)", 300, "600 GB/s bidirectional per GPU",
            "NVIDIA, 'Introducing NVIDIA HGX A100' (developer blog): 12 NVLink ports per A100, "
            "'full NVLink bi-directional speed of 600 GB/s'", 230 * GBPS,
            "NVIDIA/nccl-tests issue #149 (S. Jeaugey, NCCL): 'The total effective bandwidth "
            "should therefore be 240GB/s on A100, but some other bottlenecks on the GPUs limits "
            "it to ~230GB/s'"),
    _nvlink("nvlink4", "NVLink 4 (H100, H200)", 450, "900 GB/s bidirectional per GPU",
            "NVIDIA Hopper architecture page: '900 gigabytes/second (GB/s) bi-directional per "
            "GPU' (18 links); NVIDIA/nccl-tests issue #212: '450GB/s is the line rate'",
            370 * GBPS,
            "NVIDIA/nccl-tests issue #212 (S. Jeaugey, NCCL): 'With the protocol overhead "
            "(~20%) NCCL can get an effective NVLink bandwidth of 370GB/s, which you can observe "
            "as \"BusBw\" when running non-allreduce operations, or when running with "
            "NCCL_ALGO=RING'",
            ((5, 420 * GBPS), (6, 440 * GBPS), (7, 460 * GBPS), (8, 480 * GBPS)),
            "NVIDIA/nccl issue #1455 (8 x H100 SXM, all_reduce_perf -b 2G -e 4G): 'ALGO=NVLS ... "
            "Busbw increase from 370 to 420, 440, 460, and 480 GBps when gpus increase from 4 to "
            "5, 6, 7, and 8'; nccl-tests issue #212 (S. Jeaugey): 'On 8 GPUs, you should reach a "
            "peak busBw of ~480GB/s'"),
    _nvlink("nvlink5", "NVLink 5 (B200)", 900, "1.8 TB/s bidirectional per GPU",
            "NVIDIA NVLink page: 18 NVLink connections of 100 GB/s, 'a total bandwidth of 1.8 "
            "terabytes per second', 'a 1.8TB/s bidirectional, direct GPU-to-GPU interconnect'",
            721_800_000_000,
            "no published nccl-tests ring figure found; NCCL's own model, src/graph/topo.h (NCCL "
            "2.30.7): SM100_NVLINK_BW 40.1 GB/s per link, x 18 links = 721.8 GB/s"),
    Link("xgmi-mi300x", "Infinity Fabric (MI300X)", "nvlink", 64 * GBPS,
         "128 GB/s peak per link (both directions)", True, NVLINK_HOP,
         "AMD ROCm MI300 documentation: eight MI300X fully connected by seven Infinity Fabric "
         "links each; AMD ROCm blog 'Understanding RCCL Bandwidth and xGMI Performance on AMD "
         "Instinct MI300X' (Kolla, Alizadeh, Lee, 2025): 'xGMI's raw bandwidth is rated up to "
         "64 GB/s for each point-to-point link between GPUs'. One link; the node "
         "(mi300x-8) uses all seven. Latency: NCCL's NVLink constant, for want of an RCCL one",
         48 * GBPS,
         "AMD ROCm blog 'Understanding RCCL Bandwidth and xGMI Performance on AMD Instinct "
         "MI300X' (2025): 'CRC bit correction and protocol overhead ... reduce the usable "
         "bandwidth to approximately 48 GB/s per link. This represents about 75% of the "
         "theoretical peak'"),
    Link("pcie4-x16", "PCIe 4.0 x16", "pcie", 31_500_000_000, "64 GB/s (both directions)", True,
         PCI_HOP,
         "PCI-SIG PCIe 4.0: 16 GT/s per lane, 128b/130b encoding: 16 x 16 x 128/130 / 8 = "
         "31.5 GB/s each way; NVIDIA A100 datasheet: 'PCIe Gen4: 64GB/s'",
         24 * GBPS, _PCIE.format(speed=120, gbps=24)),
    Link("pcie5-x16", "PCIe 5.0 x16", "pcie", 63_000_000_000, "128 GB/s (both directions)", True,
         PCI_HOP,
         "PCI-SIG PCIe 5.0: 'Delivers 32 GT/s raw bit rate and up to 128 GB/s via x16 "
         "configuration' (both directions: 63 GB/s each way after 128b/130b encoding); H100 "
         "datasheet: 'PCIe Gen5: 128GB/s'", 48 * GBPS, _PCIE.format(speed=240, gbps=48)),
    _network("ib-edr", "InfiniBand EDR 100 Gb/s", 100,
             "ZeRO paper (SC20), Sec. X-A: DGX-2 nodes with '8x 100Gbps Mellanox InfiniBand "
             "(ConnectX-5) cards'", 12, _NIC_100G),
    _network("ib-hdr", "InfiniBand HDR 200 Gb/s", 200,
             "Narayanan et al. 2021 (Megatron-LM, SC21), Sec. 5: 'eight NVIDIA Mellanox 200Gbps "
             "HDR Infiniband HCAs' per DGX A100 node", 24, _NIC_200G),
    _network("ib-ndr", "InfiniBand NDR 400 Gb/s", 400,
             "NVIDIA ConnectX-7 VPI user manual, supported protocols: 'NDR 400Gb/s and 400GbE'",
             48, _NIC_400G),
    _network("roce-100g", "RoCE / Ethernet 100 Gb/s", 100,
             "NVIDIA ConnectX-7 user manual: '100GbE'; NCCL src/graph/topo.h: NET_BW 12.0 "
             "(GB/s) for '100Gbit'", 12, _NIC_100G + _ROCE),
    _network("roce-200g", "RoCE / Ethernet 200 Gb/s", 200,
             "NVIDIA ConnectX-7 user manual: 'NDR200 200Gb/s and 200GbE'", 24,
             _NIC_200G + _ROCE),
    _network("roce-400g", "RoCE / Ethernet 400 Gb/s", 400,
             "NVIDIA ConnectX-7 user manual: 'NDR 400Gb/s and 400GbE'; Llama 3 (arXiv "
             "2407.21783), Sec. 3.3.1: 'Both RoCE and Infiniband clusters leverage 400 Gbps "
             "interconnects between GPUs'", 48, _NIC_400G + _ROCE),
)})


EFFICIENCY_NAMES = ("achieved", "ring", "line-rate")
# The links a GPU copies to and from its host's memory over (offload's host link).
HOST_LINKS = tuple(name for name, link in LINKS.items() if link.kind == "pcie")


@dataclass(frozen=True)
class LinkEfficiency:
    """The rate a collective runs at on each link: ``"achieved"`` (NCCL's published or modelled
    bus bandwidth, :attr:`Link.achieved_bandwidth`, and NVLS all-reduce inside a node where the
    link has it, :attr:`Link.nvls`: the default), ``"ring"`` (the same rates with NVLS off,
    NCCL_NVLS_ENABLE=0), ``"line-rate"`` (the vendor's per-direction figure) or a fraction in
    (0, 1] of the line rate of every link alike."""

    setting: str | float = "achieved"

    def __post_init__(self):
        value = self.setting
        allowed = f"{' or '.join(EFFICIENCY_NAMES)} or a fraction above 0 and at most 1"
        if isinstance(value, str) and value.strip().lower() in EFFICIENCY_NAMES:
            object.__setattr__(self, "setting", value.strip().lower())
            return
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise TypeError(f"link_efficiency must be {allowed}, got {value!r}")
        if isinstance(value, str) or not 0 < value <= 1:   # NaN fails the comparison too
            raise ValueError(f"link_efficiency must be {allowed}, got {value!r}")
        object.__setattr__(self, "setting", float(value))

    def __deepcopy__(self, memo) -> LinkEfficiency:
        return self  # immutable (pandas deep-copies DataFrame.attrs, which carry it)

    def rate(self, link: Link) -> float:
        """Bytes per second per direction a ring runs at on ``link``."""
        if self.setting in ("achieved", "ring"):
            return float(link.achieved_bandwidth)
        if self.setting == "line-rate":
            return float(link.bandwidth)
        return link.bandwidth * self.setting

    @property
    def nvls(self) -> bool:
        """Whether an all-reduce inside a node runs on NVLink SHARP where the link has it."""
        return self.setting == "achieved"

    @property
    def name(self) -> str:
        """What output says was used: "achieved", "line-rate" or the fraction."""
        return self.setting if isinstance(self.setting, str) else f"{self.setting:g}"

    @property
    def words(self) -> str:
        """The same in a sentence: "the links at line rate" and so on."""
        if self.setting == "achieved":
            return "the links at the bus bandwidth NCCL reaches"
        if self.setting == "ring":
            return "the links at the bus bandwidth NCCL's ring reaches (no NVLS)"
        if self.setting == "line-rate":
            return "the links at line rate"
        return f"the links at {self.name} of line rate"


ACHIEVED = LinkEfficiency()
LINE_RATE = LinkEfficiency("line-rate")


def link_efficiency(value=None) -> LinkEfficiency:
    """A :class:`LinkEfficiency` from None (the default, achieved), a name or a fraction."""
    if value is None:
        return ACHIEVED
    if isinstance(value, LinkEfficiency):
        return value
    return LinkEfficiency(value)


def get_link(link: str | Link, name: str = "link") -> Link:
    """A catalogue link by name, or a Link passed through; ``name`` is what errors call it."""
    if isinstance(link, Link):
        return link
    if isinstance(link, str) and link.strip().lower() in LINKS:
        return LINKS[link.strip().lower()]
    raise ValueError(f"{name} must be one of {', '.join(LINKS)}, got {link!r}")
