"""The node catalogue, and the interconnect a collective runs over: bus bandwidth and latency.

A :class:`Node` is a server: how many GPUs, the link between GPUs inside it, and its network
ports (how many, how fast, one per GPU or not). An :class:`Interconnect` is what a run uses:
a node (possibly with another GPU count per node), or a single link that joins every GPU alike
(all GPUs in one NVLink domain, or every GPU on its own network port).

The ring model (what :func:`bus_bandwidth` and :func:`ring_latency` compute):

- **Bus bandwidth** is the per-GPU, per-direction rate a ring collective runs at, the quantity
  NVIDIA's nccl-tests call "busbw" (``doc/PERFORMANCE.md``): time = bytes a GPU sends / bus
  bandwidth. Within one node it is the intra-node link's rate. A ring that spans nodes is
  bounded by its slowest link, the network port where it leaves a node. NCCL runs one ring
  (channel) per network port, each carrying its share of the data, so a node's rings together
  leave it at ``nics x port rate``; no GPU sends faster than its own intra-node link. Across
  nodes the bus bandwidth is therefore ``min(intra-node rate, nics x port rate)``: 8 x 50 =
  400 GB/s for a DGX H100 (8 NDR ports), against 450 GB/s of NVLink; 50 GB/s for a server with
  one 400 Gb/s port.
- **Latency**, NCCL's ring model (``src/graph/tuning.cc``): a base latency per collective plus
  one hop latency per ring step, the network's for the steps that cross nodes and the
  intra-node link's for the rest. A ring all-reduce takes 2(n - 1) steps, 2(nodes - 1) of them
  across nodes; an all-gather or reduce-scatter n - 1, nodes - 1 across.

Left out (the model is a bandwidth estimate, not a simulator): NCCL's tree and NVLink SHARP
algorithms (hierarchical all-reduce across nodes), the ~20 % protocol overhead below line rate,
congestion from other jobs and switch oversubscription, and small-message effects beyond the
latency term.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from zerolib.core.catalogue.links import BASE_LATENCY, LINKS, Link, get_link
from zerolib.core.inputs import MAX_GPUS, check_gpus, echo
from zerolib.core.intmath import ceil_div


@dataclass(frozen=True)
class Node:
    """A server of GPUs: the link inside it and its network ports."""

    name: str               # the key typed on the command line, e.g. "dgx-h100"
    label: str
    gpus: int               # GPUs per node
    intra: Link             # GPU-to-GPU inside the node
    network: Link           # one network port
    nics: int               # network ports for GPU traffic
    nic_per_gpu: bool       # one port per GPU (the port count follows the GPU count)
    source: str


def _node(name, label, gpus, intra, network, nics, nic_per_gpu, source) -> Node:
    return Node(name, label, gpus, LINKS[intra], LINKS[network], nics, nic_per_gpu, source)


NODES: Mapping[str, Node] = MappingProxyType({node.name: node for node in (
    _node("dgx-2", "DGX-2 (16 x V100)", 16, "nvlink2", "ib-edr", 8, False,
          "ZeRO paper (SC20), Sec. X-A: 'Each node consisted of 16 NVIDIA Tesla V100-SXM3-32GB "
          "GPUs, 8x 100Gbps Mellanox InfiniBand (ConnectX-5) cards' (one port per two GPUs), "
          "NVLink 2 through NVSwitch"),
    _node("dgx-a100", "DGX A100 (8 x A100)", 8, "nvlink3", "ib-hdr", 8, True,
          "NVIDIA HGX A100 blog: eight A100 and six NVSwitch; Narayanan et al. 2021, Sec. 5: "
          "'eight NVIDIA Mellanox 200Gbps HDR Infiniband HCAs for application communication'"),
    _node("dgx-h100", "DGX H100 (8 x H100)", 8, "nvlink4", "ib-ndr", 8, True,
          "NVIDIA DGX H100 datasheet: '4x OSFP ports serving 8x single-port NVIDIA ConnectX-7 "
          "VPI, 400 Gb/s InfiniBand/Ethernet'; HGX H100: eight H100 and four NVSwitch"),
    _node("dgx-b200", "DGX B200 (8 x B200)", 8, "nvlink5", "ib-ndr", 8, True,
          "NVIDIA DGX B200 datasheet: '8x single-port NVIDIA ConnectX-7 VPI (Up to 400Gb/s "
          "InfiniBand/Ethernet)', NVLink 5 through NVSwitch"),
    _node("mi300x-8", "8 x MI300X platform", 8, "xgmi-mi300x", "roce-400g", 8, True,
          "AMD ROCm MI300 documentation: eight MI300X OAMs, each with seven Infinity Fabric "
          "links, fully connected. Network: one 400 Gb/s port per GPU is the usual deployment, "
          "not stated in AMD's node documentation"),
    _node("pcie-8x-l40s", "8 x L40S on PCIe, one 400G port", 8, "pcie4-x16", "roce-400g", 1,
          False,
          "An example PCIe server (no NVLink): eight GPUs on PCIe 4.0 x16 and a single 400 Gb/s "
          "Ethernet port for the whole server, the shape of cloud instances such as AWS "
          "g6e.48xlarge (8 x L40S, 400 Gb/s); not a vendor's reference design"),
    _node("pcie-4x-a10", "4 x A10 on PCIe, one 100G port", 4, "pcie4-x16", "roce-100g", 1, False,
          "An example PCIe server (no NVLink): four GPUs on PCIe 4.0 x16 and one 100 Gb/s "
          "Ethernet port, the shape of cloud instances such as AWS g5.12xlarge (4 x A10G); not "
          "a vendor's reference design"),
)})


@dataclass(frozen=True)
class Interconnect:
    """What joins the GPUs of a run.

    ``gpus_per_node`` None means no node boundary: every GPU reaches every other over
    ``intra`` (one NVLink domain; or, for a network link, every GPU on its own port).
    """

    name: str
    label: str
    intra: Link
    network: Link | None = None
    gpus_per_node: int | None = None
    nics: int = 0

    def __post_init__(self):
        if (self.gpus_per_node is None) != (self.network is None):
            raise ValueError("an interconnect has both a GPU count per node and a network, or "
                             "neither")
        if self.gpus_per_node is not None:
            if not 1 <= self.gpus_per_node <= MAX_GPUS or self.nics < 1:
                raise ValueError("gpus_per_node and nics must be positive whole numbers")

    def __deepcopy__(self, memo) -> Interconnect:
        return self  # immutable (pandas deep-copies DataFrame.attrs, which carry it)

    @property
    def network_bandwidth(self) -> int | None:
        """Bytes per second a node's rings leave it at (all its ports together)."""
        return None if self.network is None else self.nics * self.network.bandwidth

    def as_dict(self) -> dict:
        return {"name": self.name, "intra": self.intra.as_dict(),
                "network": None if self.network is None else self.network.as_dict(),
                "gpus_per_node": self.gpus_per_node, "nics_per_node": self.nics or None}


def interconnect(name: str | Node | Link | Interconnect,
                 gpus_per_node: int | None = None) -> Interconnect:
    """The interconnect named ``name``: a node of :data:`NODES` or a link of
    :data:`~zerolib.core.catalogue.links.LINKS` (every GPU joined by that link alike).

    ``gpus_per_node`` changes a node's GPU count; where the node has one port per GPU the port
    count follows it. A single link has no nodes, so it takes no GPU count.
    """
    if isinstance(name, Interconnect):
        if gpus_per_node is not None:
            raise ValueError("gpus_per_node applies to a node by name, not to an Interconnect")
        return name
    if isinstance(name, str) and name.strip().lower() in NODES:
        name = NODES[name.strip().lower()]
    if isinstance(name, Node):
        node = name
        per_node = node.gpus
        if gpus_per_node is not None:
            per_node = int(check_gpus(gpus_per_node, "gpus_per_node"))
        nics = per_node if node.nic_per_gpu else node.nics
        return Interconnect(node.name, node.label, node.intra, node.network, per_node, nics)
    try:
        link = get_link(name)
    except ValueError:
        raise ValueError(f"link must be a node ({', '.join(NODES)}) or a link "
                         f"({', '.join(LINKS)}), got {echo(name)}") from None
    if gpus_per_node is not None:
        raise ValueError(f"gpus_per_node needs a node ({', '.join(NODES)}); the link {link.name} "
                         "joins every GPU alike")
    return Interconnect(link.name, link.label, link)


def check_interconnect(ic, name: str = "ic") -> Interconnect:
    """An :class:`Interconnect` (a name is not one: :func:`interconnect` turns it into one)."""
    if not isinstance(ic, Interconnect):
        raise TypeError(f"{name} must be an Interconnect, such as zl.interconnect('dgx-h100'), "
                        f"got {echo(ic)}")
    return ic


def _nodes(ic: Interconnect, gpus: np.ndarray) -> np.ndarray:
    if ic.gpus_per_node is None:
        return np.ones_like(gpus)
    return ceil_div(gpus, ic.gpus_per_node)


def spanning_bandwidth(ic: Interconnect, nodes, sharing=1) -> np.ndarray:
    """Bytes per second per GPU and direction of a ring that spans ``nodes`` nodes while
    ``sharing`` rings leave each node at once (float64): the intra-node rate inside one node;
    across nodes ``min(intra-node rate, nics x port rate / sharing)``, the node's ports shared
    by its rings. One ring per node (``sharing`` 1) is :func:`bus_bandwidth`'s ring over all
    GPUs; the rings of concurrent groups (the all-reduces across shard groups, one per shard
    index) share the ports."""
    nodes = np.asarray(nodes)
    inside = float(ic.intra.bandwidth)
    if ic.network is None:
        return np.full(nodes.shape, inside)
    across = np.minimum(inside, float(ic.network_bandwidth) / np.asarray(sharing, dtype=np.float64))
    return np.where(nodes <= 1, inside, across)


def bus_bandwidth(ic: Interconnect, gpus) -> np.ndarray:
    """Bytes per second per GPU and direction that a ring over ``gpus`` GPUs runs at (float64)."""
    check_interconnect(ic)
    gpus = check_gpus(gpus)
    return spanning_bandwidth(ic, _nodes(ic, gpus))


# Ring steps of one collective over n ranks and over n nodes (NCCL src/graph/tuning.cc). NCCL
# runs an all-to-all as n - 1 point-to-point exchanges, which tuning.cc does not model: counted
# here as n - 1 steps, like a reduce-scatter (an assumption).
RING_STEPS = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1, "all_to_all": 1}


def check_ring_kind(kind: str) -> None:
    """``kind`` is a collective of :data:`RING_STEPS`; anything else names them."""
    if kind not in RING_STEPS:
        raise ValueError(f"kind must be one of {', '.join(RING_STEPS)}, got {kind!r}")


def spanning_latency(ic: Interconnect, kind: str, gpus, nodes) -> np.ndarray:
    """Seconds of latency of one collective of ``kind`` over ``gpus`` GPUs spread over ``nodes``
    nodes (0 for one GPU): the base latency plus a hop latency per step, the network's for the
    ``nodes`` - 1 steps (per pass) that cross nodes."""
    check_ring_kind(kind)
    return spanning_latency_of(ic, kind, check_gpus(gpus), nodes)


def spanning_latency_of(ic: Interconnect, kind: str, gpus: np.ndarray, nodes) -> np.ndarray:
    """:func:`spanning_latency` of a checked ``kind`` and int64 ``gpus`` (the step's rings,
    whose sizes their door checked)."""
    steps = RING_STEPS[kind] * (gpus - 1)
    across = RING_STEPS[kind] * (np.asarray(nodes) - 1)
    inter_hop = ic.network.hop_latency if ic.network is not None else ic.intra.hop_latency
    latency = BASE_LATENCY + (steps - across) * ic.intra.hop_latency + across * inter_hop
    return np.where(gpus > 1, latency, 0.0)


def ring_latency(ic: Interconnect, kind: str, gpus) -> np.ndarray:
    """Seconds of latency of one ring collective of ``kind`` over ``gpus`` GPUs (0 for one GPU):
    the base latency plus a hop latency per step, the network's for the steps across nodes."""
    check_ring_kind(kind)
    return latency_of(ic, kind, check_gpus(gpus))


def latency_of(ic: Interconnect, kind: str, gpus: np.ndarray) -> np.ndarray:
    """:func:`ring_latency` of a checked ``kind`` and int64 ``gpus`` (a caller that checked
    them once, such as the planner's rings)."""
    return spanning_latency_of(ic, kind, gpus, _nodes(ic, gpus))
