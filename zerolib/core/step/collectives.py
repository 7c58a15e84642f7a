"""One ring collective: the bytes a GPU hands to it, sends and receives, and how long it takes.

Vocabulary (each term as the chapter uses it):

- **all-reduce**: every GPU contributes a buffer of S bytes and every GPU ends with the
  element-wise sum of all of them (S bytes);
- **reduce-scatter**: every GPU contributes S bytes and ends with 1/n of the sum (its own
  chunk);
- **all-gather**: every GPU contributes a chunk of S/n bytes and ends with all n chunks (S);
- **broadcast**: one GPU's S bytes are copied to all the others.

S is the size NVIDIA's nccl-tests call the collective's size (``doc/PERFORMANCE.md``: for an
all-gather "the total array", ``sendcount * n``). Under a **ring** the n GPUs pass chunks of
ceil(E / n) elements to their neighbour, so a flat buffer of E elements is padded to n chunks;
per GPU:

=================  ======================  ===============================
collective         hands over (per call)   sends = receives
=================  ======================  ===============================
all-reduce         E elements              2 (n - 1) chunks
reduce-scatter     n chunks (padded)       (n - 1) chunks
all-gather         1 chunk                 (n - 1) chunks
=================  ======================  ===============================

which is nccl-tests' bus-bandwidth factor, 2(n - 1)/n for an all-reduce and (n - 1)/n for the
other two, applied to the padded size. An all-reduce is a reduce-scatter followed by an
all-gather (ZeRO paper, SC20, Sec. VII-A). Time = latency + bytes sent / bus bandwidth, from
the one ring model every collective of the step is timed by: :func:`ring_placement` puts a
ring's GPUs (``size`` of them, ``stride`` ranks apart) on the nodes, :func:`ring_timing` gives
its latency and bus bandwidth on an interconnect of :mod:`zerolib.core.catalogue.nodes` (see
:mod:`zerolib.core.step.time`), every link at the interconnect's efficiency (by default the bus
bandwidth NCCL reaches, :class:`~zerolib.core.catalogue.links.LinkEfficiency`). One GPU alone
runs no collective: 0 bytes, 0 seconds.

Bytes are whole: ``elements x bits / 8`` rounded up, with the width in bits of the dtype that is
communicated (a layout's gradient or parameter width). All arrays are int64 and broadcast.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zerolib.core.catalogue.nodes import Interconnect, check_ring_kind, spanning_latency_of
from zerolib.core.inputs import (
    MAX_BYTES,
    broadcast,
    check_bits,
    check_gpus,
    check_params,
    echo,
    whole_in_range,
)
from zerolib.core.intmath import ceil_div

KINDS = ("all_reduce", "reduce_scatter", "all_gather")
KIND_LABELS = {"all_reduce": "all-reduce", "reduce_scatter": "reduce-scatter",
               "all_gather": "all-gather", "broadcast": "broadcast"}
# nccl-tests doc/PERFORMANCE.md: busbw = algbw x factor; the numerator of the factor over
# (n - 1)/n, i.e. sent bytes = factor x S.
CHUNKS_SENT = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1}


def to_bytes(elements, bits: int):
    """Whole bytes of ``elements`` values of ``bits`` bits each (rounded up)."""
    if bits % 8 == 0:
        return elements * (bits // 8)
    return ceil_div(elements * bits, 8)


def ring_placement(size, stride, gpus_per_node: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(GPUs of the ring on one node, nodes the ring spans) for a ring over ``size`` GPUs whose
    ranks are ``stride`` apart, ranks filling nodes of ``gpus_per_node`` in order (None: no
    nodes, every GPU joined alike). The one placement rule of every ring the step times."""
    size = np.asarray(size, dtype=np.int64)
    if gpus_per_node is None:
        return size, np.ones_like(size)
    per_node = np.clip(gpus_per_node // np.asarray(stride, dtype=np.int64), 1, size)
    return per_node, ceil_div(size, per_node)


def across_bandwidth(ic: Interconnect, per_node, nodes=1) -> np.ndarray:
    """Bytes per second a GPU gets out of its node when ``per_node`` GPUs of its ring sit on each
    of ``nodes`` nodes: the node's ports shared among the K / per_node rings that leave it at
    once (and cut by an oversubscribed spine beyond one rail leaf), and no faster than the
    ring's GPUs inside the node (both at the interconnect's efficiency)."""
    per_node = np.asarray(per_node, dtype=np.float64)
    share = ic.network_rate * ic.spine_share(nodes) * per_node / ic.gpus_per_node
    return np.minimum(ic.inside_rate(per_node), share)


def ring_timing(ic: Interconnect, kind: str, size, stride=1) -> tuple[np.ndarray, np.ndarray]:
    """(seconds of latency per call, bus bandwidth per GPU and direction) of a ring ``kind``
    over ``size`` GPUs whose ranks are ``stride`` apart on ``ic`` (float64, broadcast)."""
    size, stride = np.broadcast_arrays(np.asarray(size, dtype=np.int64),
                                       np.asarray(stride, dtype=np.int64))
    check_ring_kind(kind)
    return ring_timing_of(ic, kind, check_gpus(size), stride)


def ring_timing_of(ic: Interconnect, kind: str, size, stride=1) -> tuple[np.ndarray, np.ndarray]:
    """:func:`ring_timing` of a checked ``kind`` and ``size`` (the rings of a checked
    :class:`~zerolib.core.step.traffic.Traffic` or settings object): nothing is checked again."""
    size, stride = np.broadcast_arrays(np.asarray(size, dtype=np.int64),
                                       np.asarray(stride, dtype=np.int64))
    per_node, nodes = ring_placement(size, stride, ic.gpus_per_node)
    if ic.gpus_per_node is None:
        bandwidth = np.full(size.shape, ic.intra_rate)
    else:
        bandwidth = np.where(nodes <= 1, ic.inside_rate(per_node),
                             across_bandwidth(ic, per_node, nodes))
    if kind == "all_reduce" and ic.intra.nvls and ic.efficiency.nvls:
        # NVLink SHARP: an all-reduce on one node's switches (links.py: NVLS)
        nvls = ic.intra.nvls_bandwidth(per_node)
        bandwidth = np.where((nodes <= 1) & (nvls > 0), nvls, bandwidth)
    return spanning_latency_of(ic, kind, size, nodes), bandwidth


def _check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    return kind


@dataclass(frozen=True)
class RingVolume:
    """Bytes per GPU for one call (int64 arrays): what it hands over, sends and receives."""

    handed: np.ndarray
    sent: np.ndarray

    @property
    def received(self) -> np.ndarray:
        """A ring GPU receives exactly as much as it sends."""
        return self.sent


def ring_volume(kind: str, elements, gpus, bits: int) -> RingVolume:
    """Bytes per GPU of one ring ``kind`` over a buffer of ``elements`` values on ``gpus`` GPUs.

    ``elements`` is the whole buffer (E above, before padding), ``bits`` the communicated width.
    """
    _check_kind(kind)
    bits = check_bits(bits)
    elements, gpus = broadcast(elements=check_params(elements, "elements"), gpus=check_gpus(gpus))
    chunk = ceil_div(elements, gpus)
    alone = gpus == 1
    handed = {"all_reduce": elements, "reduce_scatter": gpus * chunk, "all_gather": chunk}[kind]
    sent = CHUNKS_SENT[kind] * (gpus - 1) * chunk
    return RingVolume(np.where(alone, 0, to_bytes(handed, bits)), to_bytes(sent, bits))


def collective_seconds(kind: str, sent_bytes, calls, gpus, ic: Interconnect) -> np.ndarray:
    """Seconds for ``calls`` ring collectives of ``kind`` that together send ``sent_bytes`` per
    GPU: each call pays the ring's latency, the bytes go at the bus bandwidth (float64)."""
    _check_kind(kind)
    latency, bandwidth = ring_timing(ic, kind, check_gpus(gpus))
    if isinstance(sent_bytes, (str, bytes, bool, np.bool_)):
        raise TypeError(f"sent_bytes must be a number of bytes, got {echo(sent_bytes)}")
    try:
        sent = np.asarray(sent_bytes, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"sent_bytes must be a number of bytes, got {echo(sent_bytes)}") from None
    if not np.all((sent >= 0) & (sent <= MAX_BYTES)):   # NaN fails both
        raise ValueError(f"sent_bytes must be bytes from 0 to {MAX_BYTES:,}, got {echo(sent_bytes)}")
    calls = whole_in_range(calls, "calls", 0, MAX_BYTES, "a whole number of calls, 0 or more")
    return calls.astype(np.float64) * latency + sent / bandwidth
