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

**Achieved rates.** Every rate above is the one the interconnect's :class:`LinkEfficiency`
gives (:mod:`zerolib.core.catalogue.links`): by default what NCCL's ring reaches on each link,
370 of NVLink 4's 450 GB/s, 48 of an NDR port's 50 GB/s; ``"line-rate"`` gives the vendor's
figures (the earlier model). The JSON of every answer says which was used.

**A fully connected node** (eight MI300X, each joined to the seven others by its own Infinity
Fabric link) has no switch: a link joins each pair. A ring over p of its GPUs can use the links
between all p of them, because RCCL runs several rings (channels) at once, each over other
links (the GPUs of K_p are joined by p - 1 links each, enough for p - 1 edge-disjoint
directed rings): bus bandwidth (p - 1) x the link's rate, 7 x 48 = 336 GB/s for all eight
GPUs, one link's 48 GB/s for two. No published rccl-tests figure for the ring over eight
MI300X was found to hold this against; the 48 GB/s per link is AMD's (see the link).

**Across nodes, the intra-node steps.** NCCL's ring latency (``src/graph/tuning.cc``, NCCL
2.30.7) charges each step that stays inside a node ``max(intra-node hop latency, 3 x network
post overhead)`` once the ring spans nodes ("Inter-node rings still have to launch nsteps * net
overhead", the 3 for the Simple protocol); the overhead is 1 us on Intel hosts and 2 us on AMD
hosts (``getNetOverhead``), so an NVLink step (3.4 us) costs 6 us on a DGX A100 (AMD EPYC
hosts): 876 us for an all-reduce over 64 GPUs on 8 nodes against 585 us without it.

**A rail-optimised fabric** (NVIDIA's DGX SuperPOD: each GPU's port on its rail's leaf switch,
``data/ring_at_scale.md``): a ring over more than ``leaf_nodes`` nodes leaves its leaf through
the spine, and a spine oversubscribed ``oversubscription``:1 carries 1/r of what the leaves take
in, so its ring runs at ``min(intra-node rate, nics x port rate / r)``. This is the worst case,
every node's traffic through the spine (a ring placed leaf by leaf crosses it at two points only).
The defaults, no leaf limit and r = 1 (non-blocking, as the SuperPOD builds it), change nothing.

NVLink SHARP: an all-reduce whose GPUs sit on one node of a link with ``nvls`` (NVLink 4) runs
at NVLS's bus bandwidth (:mod:`zerolib.core.catalogue.links`), under the ``"achieved"``
efficiency. Left out (the model is a bandwidth estimate, not a simulator): NCCL's tree and
NVLS-tree algorithms (hierarchical all-reduce across nodes), congestion from other jobs, any
fall of the bus bandwidth with node count (none citable was found: ``data/ring_at_scale.md``),
the spine's extra hop latency, and small-message effects beyond the latency term (NCCL's LL and LL128
protocols, which cut it).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

import numpy as np

from zerolib.core.catalogue.links import (
    ACHIEVED,
    BASE_LATENCY,
    LINKS,
    Link,
    LinkEfficiency,
    get_link,
    link_efficiency,
)
from zerolib.core.defaults import MAX_OVERSUBSCRIPTION
from zerolib.core.inputs import MAX_GPUS, check_gpus, check_positive_int, echo
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
    host_cpu: str = "other"          # the host's CPU vendor: "intel", "amd" or "other"
    fully_connected: bool = False    # one ``intra`` link joins each pair of GPUs (no switch)

    def __post_init__(self):
        if self.host_cpu not in NET_OVERHEAD:
            raise ValueError(f"host_cpu must be one of {', '.join(NET_OVERHEAD)}, got "
                             f"{self.host_cpu!r}")


# NCCL's network post overhead per ring step by host CPU (getNetOverhead in src/graph/tuning.cc,
# NCCL 2.30.7: 1 us on Intel x86, 2 us on AMD x86, 1 us otherwise), in seconds; the Simple
# protocol pays it three times per step.
NET_OVERHEAD = {"intel": 1.0e-6, "amd": 2.0e-6, "other": 1.0e-6}
SIMPLE_OVERHEADS = 3


def _node(name, label, gpus, intra, network, nics, nic_per_gpu, source, host_cpu,
          fully_connected=False) -> Node:
    return Node(name, label, gpus, LINKS[intra], LINKS[network], nics, nic_per_gpu, source,
                host_cpu, fully_connected)


NODES: Mapping[str, Node] = MappingProxyType({node.name: node for node in (
    _node("dgx-2", "DGX-2 (16 x V100)", 16, "nvlink2", "ib-edr", 8, False,
          "ZeRO paper (SC20), Sec. X-A: 'Each node consisted of 16 NVIDIA Tesla V100-SXM3-32GB "
          "GPUs, 8x 100Gbps Mellanox InfiniBand (ConnectX-5) cards' (one port per two GPUs), "
          "NVLink 2 through NVSwitch; NVIDIA DGX-2 datasheet: 'Dual Intel Xeon Platinum 8168'",
          "intel"),
    _node("dgx-a100", "DGX A100 (8 x A100)", 8, "nvlink3", "ib-hdr", 8, True,
          "NVIDIA HGX A100 blog: eight A100 and six NVSwitch; Narayanan et al. 2021, Sec. 5: "
          "'eight NVIDIA Mellanox 200Gbps HDR Infiniband HCAs for application communication'; "
          "NVIDIA DGX A100 datasheet: 'Dual AMD Rome 7742, 128 cores total'", "amd"),
    _node("dgx-h100", "DGX H100 (8 x H100)", 8, "nvlink4", "ib-ndr", 8, True,
          "NVIDIA DGX H100 datasheet: '4x OSFP ports serving 8x single-port NVIDIA ConnectX-7 "
          "VPI, 400 Gb/s InfiniBand/Ethernet'; HGX H100: eight H100 and four NVSwitch; CPU: "
          "'Dual Intel Xeon Platinum 8480C'", "intel"),
    _node("dgx-b200", "DGX B200 (8 x B200)", 8, "nvlink5", "ib-ndr", 8, True,
          "NVIDIA DGX B200 datasheet: '8x single-port NVIDIA ConnectX-7 VPI (Up to 400Gb/s "
          "InfiniBand/Ethernet)', NVLink 5 through NVSwitch; CPU: '2 Intel Xeon Platinum "
          "8570'", "intel"),
    _node("mi300x-8", "8 x MI300X platform", 8, "xgmi-mi300x", "roce-400g", 8, True,
          "AMD ROCm MI300 documentation: eight MI300X OAMs, each with seven Infinity Fabric "
          "links, fully connected (one link per pair of GPUs, no switch). Network: one "
          "400 Gb/s port per GPU is the usual deployment, not stated in AMD's node "
          "documentation; the host CPU is the server maker's choice (not stated): NCCL's "
          "default overhead", "other", True),
    _node("pcie-8x-l40s", "8 x L40S on PCIe, one 400G port", 8, "pcie4-x16", "roce-400g", 1,
          False,
          "An example PCIe server (no NVLink): eight GPUs on PCIe 4.0 x16 and a single 400 Gb/s "
          "Ethernet port for the whole server, the shape of cloud instances such as AWS "
          "g6e.48xlarge (8 x L40S, 400 Gb/s); not a vendor's reference design. Host CPU not "
          "stated for the example: NCCL's default overhead", "other"),
    _node("pcie-4x-a10", "4 x A10 on PCIe, one 100G port", 4, "pcie4-x16", "roce-100g", 1, False,
          "An example PCIe server (no NVLink): four GPUs on PCIe 4.0 x16 and one 100 Gb/s "
          "Ethernet port, the shape of cloud instances such as AWS g5.12xlarge (4 x A10G); not "
          "a vendor's reference design. Host CPU not stated for the example: NCCL's default "
          "overhead", "other"),
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
    efficiency: LinkEfficiency = ACHIEVED   # the rate each link runs at (default: achieved)
    host_cpu: str = "other"                 # the node's host CPU vendor (NCCL's net overhead)
    fully_connected: bool = False           # one intra link per pair of GPUs in a node
    leaf_nodes: int | None = None           # nodes under one rail leaf switch (None: all)
    oversubscription: float = 1.0           # the spine's r:1 (1: non-blocking)

    def __post_init__(self):
        if (self.gpus_per_node is None) != (self.network is None):
            raise ValueError("an interconnect has both a GPU count per node and a network, or "
                             "neither")
        if self.gpus_per_node is not None:
            if not 1 <= self.gpus_per_node <= MAX_GPUS or self.nics < 1:
                raise ValueError("gpus_per_node and nics must be positive whole numbers")
        if not isinstance(self.efficiency, LinkEfficiency):
            raise TypeError(f"efficiency must be a LinkEfficiency, got {echo(self.efficiency)}")
        if self.host_cpu not in NET_OVERHEAD:
            raise ValueError(f"host_cpu must be one of {', '.join(NET_OVERHEAD)}, got "
                             f"{self.host_cpu!r}")
        check_fabric(self.leaf_nodes, self.oversubscription)

    def __deepcopy__(self, memo) -> Interconnect:
        return self  # immutable (pandas deep-copies DataFrame.attrs, which carry it)

    @property
    def network_bandwidth(self) -> int | None:
        """Bytes per second a node's ports carry at line rate (all of them together)."""
        return None if self.network is None else self.nics * self.network.bandwidth

    @property
    def intra_rate(self) -> float:
        """Bytes per second per direction of one intra-node link at the interconnect's
        efficiency (what a point-to-point message inside a node runs at)."""
        return self.efficiency.rate(self.intra)

    @property
    def network_rate(self) -> float | None:
        """Bytes per second a node's rings leave it at (all its ports together) at the
        interconnect's efficiency."""
        return None if self.network is None else self.nics * self.efficiency.rate(self.network)

    def spine_share(self, nodes) -> np.ndarray | float:
        """The fraction of the ports' rate a ring over ``nodes`` nodes gets: 1 inside one rail
        leaf, 1 / oversubscription once it spans more than ``leaf_nodes`` nodes (a plain 1.0,
        which broadcasts, on a fabric where nothing is cut: the planner's rings stay as fast)."""
        if self.leaf_nodes is None or self.oversubscription == 1:
            return 1.0
        return np.where(np.asarray(nodes) > self.leaf_nodes, 1.0 / self.oversubscription, 1.0)

    @property
    def fabric_words(self) -> str:
        """The rail fabric in words ("" when non-blocking or one leaf holds every node)."""
        if self.leaf_nodes is None or self.oversubscription == 1:
            return ""
        return f"; {self.leaf_nodes:,} nodes per rail leaf, spine {self.oversubscription:g}:1 beyond"

    def inside_rate(self, per_node) -> np.ndarray:
        """Bus bandwidth of a ring's GPUs inside one node when ``per_node`` of them sit on it:
        one link's rate behind a switch; on a fully connected node the p - 1 links among them
        (one at least)."""
        if not self.fully_connected:
            return np.full(np.shape(per_node), self.intra_rate)
        return self.intra_rate * np.maximum(np.asarray(per_node, dtype=np.float64) - 1, 1.0)

    def as_dict(self) -> dict:
        return {"name": self.name, "intra": self.intra.as_dict(),
                "network": None if self.network is None else self.network.as_dict(),
                "gpus_per_node": self.gpus_per_node, "nics_per_node": self.nics or None,
                "link_efficiency": self.efficiency.name, "host_cpu": self.host_cpu,
                "fully_connected": self.fully_connected, "leaf_nodes": self.leaf_nodes,
                "oversubscription": self.oversubscription}


def check_fabric(leaf_nodes, oversubscription) -> None:
    """``leaf_nodes`` a whole number of nodes or None, ``oversubscription`` a number from 1
    (non-blocking) to :data:`MAX_OVERSUBSCRIPTION`; a ValueError or TypeError names the field."""
    if leaf_nodes is not None:
        check_positive_int(leaf_nodes, "leaf_nodes", MAX_GPUS)
    if isinstance(oversubscription, bool) or not isinstance(oversubscription, (int, float)):
        raise TypeError(f"oversubscription must be a number from 1 to {MAX_OVERSUBSCRIPTION:g}, "
                        f"got {echo(oversubscription)}")
    if not 1.0 <= oversubscription <= MAX_OVERSUBSCRIPTION:
        raise ValueError(f"oversubscription must be a number from 1 (non-blocking) to "
                         f"{MAX_OVERSUBSCRIPTION:g}, got {echo(oversubscription)}")


def with_fabric(ic: Interconnect, leaf_nodes=None, oversubscription=1.0) -> Interconnect:
    """``ic`` on a rail-optimised fabric: ``leaf_nodes`` nodes under one rail leaf (None: one
    leaf holds every node) and a spine oversubscribed ``oversubscription``:1 (1: non-blocking)."""
    check_interconnect(ic)
    check_fabric(leaf_nodes, oversubscription)
    leaf_nodes = None if leaf_nodes is None else int(leaf_nodes)
    if leaf_nodes == ic.leaf_nodes and oversubscription == ic.oversubscription:
        return ic
    return replace(ic, leaf_nodes=leaf_nodes, oversubscription=float(oversubscription))


def interconnect(name: str | Node | Link | Interconnect,
                 gpus_per_node: int | None = None, efficiency=None) -> Interconnect:
    """The interconnect named ``name``: a node of :data:`NODES` or a link of
    :data:`~zerolib.core.catalogue.links.LINKS` (every GPU joined by that link alike).

    ``gpus_per_node`` changes a node's GPU count; where the node has one port per GPU the port
    count follows it. A single link has no nodes, so it takes no GPU count. ``efficiency``
    (a :class:`~zerolib.core.catalogue.links.LinkEfficiency`, ``"achieved"``, ``"line-rate"``
    or a fraction; None: achieved, or an Interconnect's own) is the rate its links run at.
    """
    if isinstance(name, Interconnect):
        if gpus_per_node is not None:
            raise ValueError("gpus_per_node applies to a node by name, not to an Interconnect")
        if efficiency is None:
            return name
        return replace(name, efficiency=link_efficiency(efficiency))
    efficiency = link_efficiency(efficiency)
    if isinstance(name, str) and name.strip().lower() in NODES:
        name = NODES[name.strip().lower()]
    if isinstance(name, Node):
        node = name
        per_node = node.gpus
        if gpus_per_node is not None:
            per_node = int(check_gpus(gpus_per_node, "gpus_per_node"))
        nics = per_node if node.nic_per_gpu else node.nics
        return Interconnect(node.name, node.label, node.intra, node.network, per_node, nics,
                            efficiency, node.host_cpu, node.fully_connected)
    try:
        link = get_link(name)
    except ValueError:
        raise ValueError(f"link must be a node ({', '.join(NODES)}) or a link "
                         f"({', '.join(LINKS)}), got {echo(name)}") from None
    if gpus_per_node is not None:
        raise ValueError(f"gpus_per_node needs a node ({', '.join(NODES)}); the link {link.name} "
                         "joins every GPU alike")
    return Interconnect(link.name, link.label, link, efficiency=efficiency)


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
    if ic.network is None:
        return np.full(nodes.shape, ic.intra_rate)
    # The ring's GPUs on each node: the whole node's share a node's ports ``sharing`` ways.
    per_node = np.full(nodes.shape, ic.gpus_per_node // np.asarray(sharing, dtype=np.int64))
    inside = ic.inside_rate(np.maximum(per_node, 1))
    ports = ic.network_rate * ic.spine_share(nodes) / np.asarray(sharing, dtype=np.float64)
    across = np.minimum(inside, ports)
    return np.where(nodes <= 1, inside, across)


def bus_bandwidth(ic: Interconnect, gpus) -> np.ndarray:
    """Bytes per second per GPU and direction that a ring over ``gpus`` GPUs runs at (float64)."""
    check_interconnect(ic)
    gpus = check_gpus(gpus)
    if ic.network is None:
        return np.full(gpus.shape, ic.intra_rate)
    nodes = _nodes(ic, gpus)
    inside = ic.inside_rate(np.minimum(gpus, ic.gpus_per_node))
    return np.where(nodes <= 1, inside,
                    np.minimum(inside, ic.network_rate * ic.spine_share(nodes)))


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
    nodes = np.asarray(nodes)
    across = RING_STEPS[kind] * (nodes - 1)
    if ic.network is None:
        return np.where(gpus > 1, BASE_LATENCY + steps * ic.intra.hop_latency, 0.0)
    # A ring that spans nodes launches a network post on every step (NCCL tuning.cc): its steps
    # inside a node cost at least three net overheads of the host CPU.
    spanning = max(ic.intra.hop_latency, SIMPLE_OVERHEADS * NET_OVERHEAD[ic.host_cpu])
    inside_hop = np.where(nodes > 1, spanning, ic.intra.hop_latency)
    latency = BASE_LATENCY + (steps - across) * inside_hop + across * ic.network.hop_latency
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


def cluster_interconnect(links: str | Interconnect, gpus_per_node: int | None = None,
                         efficiency=None) -> Interconnect:
    """The interconnect a plan runs on: a node of :data:`zerolib.core.catalogue.nodes.NODES` (with
    ``gpus_per_node`` GPUs; one port per GPU where the node has that), ``"INTRA,NETWORK"`` (two
    links of :data:`zerolib.core.catalogue.links.LINKS`: GPUs joined by INTRA inside a node of
    ``gpus_per_node`` and one NETWORK port per GPU), or one link joining every GPU alike; its
    links at ``efficiency`` (None: the achieved bus bandwidth, see
    :class:`zerolib.core.catalogue.links.LinkEfficiency`)."""
    if isinstance(links, str) and "," in links:
        parts = [part.strip().lower() for part in links.split(",")]
        if len(parts) != 2 or not all(parts):
            raise ValueError(f"links must be a node ({', '.join(NODES)}), a link, or two links "
                             f"INTRA,NETWORK like nvlink4,ib-ndr; got {echo(links)}")
        intra, network = get_link(parts[0]), get_link(parts[1])
        if network.kind != "network":
            raise ValueError(f"the second of two links must be a network link, got {network.name}")
        if gpus_per_node is None:
            raise ValueError("two links INTRA,NETWORK need gpus_per_node")
        k = check_positive_int(gpus_per_node, "gpus_per_node", MAX_GPUS)
        return Interconnect(f"{intra.name},{network.name}", f"{intra.label} inside, "
                            f"{network.label} across", intra, network, k, k,
                            link_efficiency(efficiency))
    if isinstance(links, str) and links.strip().lower() in LINKS:
        return interconnect(links, efficiency=efficiency)   # one link, every GPU alike: no nodes
    return interconnect(links, gpus_per_node, efficiency)
