"""The link catalogue: how fast bytes leave a GPU over each kind of connection, with sources.

Every bandwidth here is **per direction** (bytes per second one way, A to B), the figure a ring
collective runs at: NVIDIA's nccl-tests compare their "bus bandwidth" with it (NCCL maintainer
S. Jeaugey, NVIDIA/nccl-tests issue #212: 450 GB/s per direction for H100 NVLink). Vendors
headline NVLink and PCIe **bidirectionally** (both directions added: "900 GB/s" for H100
NVLink is 450 GB/s each way), and network ports per direction (a 400 Gb/s InfiniBand port
carries 400 Gb/s each way, full duplex); ``headline`` quotes the vendor's figure and
``headline_is_bidirectional`` says which it is. These are line rates: NCCL itself reaches
about 80 % of NVLink's (its own model, ``src/graph/topo.h`` in NCCL 2.30.7, uses 20.6 GB/s per
H100 link of 25; Jeaugey: "with the protocol overhead (~20%) NCCL can get an effective NVLink
bandwidth of 370GB/s"), which the chapter leaves to the utilisation a reader chooses.

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

    def __post_init__(self):
        if self.kind not in LINK_KINDS:
            raise ValueError(f"kind must be one of {', '.join(LINK_KINDS)}, got {self.kind!r}")
        if not isinstance(self.bandwidth, int) or self.bandwidth <= 0:
            raise ValueError(f"bandwidth must be a positive whole number of bytes per second, "
                             f"got {self.bandwidth!r}")
        if self.bandwidth > MAX_BANDWIDTH:
            raise ValueError(f"bandwidth must be at most {MAX_BANDWIDTH:,} bytes per second, "
                             f"got {self.bandwidth!r}")
        latency = self.hop_latency
        if (isinstance(latency, bool) or not isinstance(latency, (int, float))
                or not 0 <= latency <= MAX_HOP_LATENCY):   # NaN fails the comparison too
            raise ValueError(f"hop_latency must be 0 to {MAX_HOP_LATENCY:g} seconds, got "
                             f"{latency!r}")

    def __deepcopy__(self, memo) -> Link:
        return self  # immutable (pandas deep-copies DataFrame.attrs, which carry it)

    def as_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "bandwidth": self.bandwidth,
                "hop_latency": self.hop_latency}


def _nvlink(name, label, per_direction_gbps, headline, source) -> Link:
    return Link(name, label, "nvlink", per_direction_gbps * GBPS, headline, True, NVLINK_HOP,
                source)


def _network(name, label, gbit, source) -> Link:
    return Link(name, label, "network", gbit * GBIT, f"{gbit} Gb/s per port", False, NET_HOP,
                source)


LINKS: Mapping[str, Link] = MappingProxyType({link.name: link for link in (
    _nvlink("nvlink2", "NVLink 2 (V100)", 150, "300 GB/s total bidirectional per GPU",
            "NVIDIA DGX-1 with Tesla V100 system architecture whitepaper: 'Each V100 GPU supports "
            "up to six links ... up to 300 GB/s in total bi-directional bandwidth' (six links of "
            "25 GB/s each way)"),
    _nvlink("nvlink3", "NVLink 3 (A100)", 300, "600 GB/s bidirectional per GPU",
            "NVIDIA, 'Introducing NVIDIA HGX A100' (developer blog): 12 NVLink ports per A100, "
            "'full NVLink bi-directional speed of 600 GB/s'"),
    _nvlink("nvlink4", "NVLink 4 (H100, H200)", 450, "900 GB/s bidirectional per GPU",
            "NVIDIA Hopper architecture page: '900 gigabytes/second (GB/s) bi-directional per "
            "GPU' (18 links); NVIDIA/nccl-tests issue #212: '450GB/s is the line rate'"),
    _nvlink("nvlink5", "NVLink 5 (B200)", 900, "1.8 TB/s bidirectional per GPU",
            "NVIDIA NVLink page: 18 NVLink connections of 100 GB/s, 'a total bandwidth of 1.8 "
            "terabytes per second', 'a 1.8TB/s bidirectional, direct GPU-to-GPU interconnect'"),
    Link("xgmi-mi300x", "Infinity Fabric (MI300X)", "nvlink", 64 * GBPS,
         "128 GB/s peak per link, direction not stated", True, NVLINK_HOP,
         "AMD ROCm MI300 documentation: eight MI300X fully connected by seven Infinity Fabric "
         "links each, so a ring uses one link per neighbour; AMD gives 128 GB/s peak per link "
         "without a direction, read here as 64 GB/s each way (not confirmed in an AMD "
         "document). Latency: NCCL's NVLink constant, for want of an RCCL one"),
    Link("pcie4-x16", "PCIe 4.0 x16", "pcie", 31_500_000_000, "64 GB/s (both directions)", True,
         PCI_HOP,
         "PCI-SIG PCIe 4.0: 16 GT/s per lane, 128b/130b encoding: 16 x 16 x 128/130 / 8 = "
         "31.5 GB/s each way; NVIDIA A100 datasheet: 'PCIe Gen4: 64GB/s'"),
    Link("pcie5-x16", "PCIe 5.0 x16", "pcie", 63_000_000_000, "128 GB/s (both directions)", True,
         PCI_HOP,
         "PCI-SIG PCIe 5.0: 'Delivers 32 GT/s raw bit rate and up to 128 GB/s via x16 "
         "configuration' (both directions: 63 GB/s each way after 128b/130b encoding); H100 "
         "datasheet: 'PCIe Gen5: 128GB/s'"),
    _network("ib-edr", "InfiniBand EDR 100 Gb/s", 100,
             "ZeRO paper (SC20), Sec. X-A: DGX-2 nodes with '8x 100Gbps Mellanox InfiniBand "
             "(ConnectX-5) cards'"),
    _network("ib-hdr", "InfiniBand HDR 200 Gb/s", 200,
             "Narayanan et al. 2021 (Megatron-LM, SC21), Sec. 5: 'eight NVIDIA Mellanox 200Gbps "
             "HDR Infiniband HCAs' per DGX A100 node"),
    _network("ib-ndr", "InfiniBand NDR 400 Gb/s", 400,
             "NVIDIA ConnectX-7 VPI user manual, supported protocols: 'NDR 400Gb/s and 400GbE'"),
    _network("roce-100g", "RoCE / Ethernet 100 Gb/s", 100,
             "NVIDIA ConnectX-7 user manual: '100GbE'; NCCL src/graph/topo.h: NET_BW 12.0 "
             "(GB/s) for '100Gbit'"),
    _network("roce-200g", "RoCE / Ethernet 200 Gb/s", 200,
             "NVIDIA ConnectX-7 user manual: 'NDR200 200Gb/s and 200GbE'"),
    _network("roce-400g", "RoCE / Ethernet 400 Gb/s", 400,
             "NVIDIA ConnectX-7 user manual: 'NDR 400Gb/s and 400GbE'; Llama 3 (arXiv "
             "2407.21783), Sec. 3.3.1: 'Both RoCE and Infiniband clusters leverage 400 Gbps "
             "interconnects between GPUs'"),
)})


def get_link(link: str | Link, name: str = "link") -> Link:
    """A catalogue link by name, or a Link passed through; ``name`` is what errors call it."""
    if isinstance(link, Link):
        return link
    if isinstance(link, str) and link.strip().lower() in LINKS:
        return LINKS[link.strip().lower()]
    raise ValueError(f"{name} must be one of {', '.join(LINKS)}, got {link!r}")
