"""Published nccl-tests bus bandwidths of rings across 3 to 32 nodes, beside zerolib's ring model.

The table (``data/ring_at_scale.csv``, described in ``data/ring_at_scale.md``) holds every
published multi-node point found with its node count, collective and cluster stated: the GPU,
the intra-node link and network port (catalogue names), ports and GPUs per node, and the bus
bandwidth nccl-tests printed, each with its source and locator. Two-node points are left out:
at two nodes NCCL runs its tree or NVLS-tree all-reduce by default, whose busbw can exceed the
network's (NVIDIA/nccl-tests issue #196), so they do not measure the ring.

:func:`comparison` sets each beside :func:`zerolib.core.catalogue.nodes.bus_bandwidth` at the
``"ring"`` efficiency (the achieved rates, no NVLS: across nodes NVLS does not apply):
``min(intra-node rate, ports x port rate)``, the same at every node count. What the points
show (``data/ring_at_scale.md``): below the model by amounts that differ from cluster to
cluster, not a fall with node count that a cited factor could carry.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from zerolib.core.catalogue.links import LINKS, LinkEfficiency
from zerolib.core.catalogue.nodes import Interconnect, bus_bandwidth
from zerolib.paths import data_file

FILENAME = "ring_at_scale.csv"
MAX_FILE_BYTES = 200_000
COLUMNS = ("id", "gpu", "intra", "network", "nics_per_node", "gpus_per_node", "nodes",
           "collective", "message", "busbw_gbps", "nccl", "source", "locator", "caveat")
RING = LinkEfficiency("ring")


@dataclass(frozen=True)
class Point:
    """One published point beside the model (bytes per second, per GPU and direction)."""

    id: str
    nodes: int
    collective: str
    measured: int     # nccl-tests busbw as published
    model: int        # zerolib's ring bus bandwidth for the same cluster and GPU count
    ratio: float      # measured / model


def ring_at_scale(data_dir=None) -> pd.DataFrame:
    """The table of published points (``data/ring_at_scale.csv``), bounded in size."""
    path = data_file(data_dir, FILENAME, "published nccl-tests bus bandwidths across nodes")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise ValueError(f"{path.name} is larger than {MAX_FILE_BYTES:,} bytes")
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"{path} lacks the column(s) {', '.join(missing)}")
    return frame


def cluster_of(row) -> Interconnect:
    """The interconnect a row describes, its links at the achieved ring rates (no NVLS)."""
    intra, network = LINKS[row["intra"]], LINKS[row["network"]]
    return Interconnect(row["id"], row["gpu"], intra, network, int(row["gpus_per_node"]),
                        int(row["nics_per_node"]), RING)


def point(row) -> Point:
    """One row beside the model."""
    nodes = int(row["nodes"])
    gpus = nodes * int(row["gpus_per_node"])
    model = int(round(float(bus_bandwidth(cluster_of(row), np.int64(gpus)))))
    measured = int(round(float(row["busbw_gbps"]) * 10**9))
    return Point(row["id"], nodes, row["collective"], measured, model, measured / model)


def comparison(data_dir=None) -> pd.DataFrame:
    """Every published point with zerolib's ring bus bandwidth (bytes/s) and the ratio."""
    rows = [point(row) for row in ring_at_scale(data_dir).to_dict("records")]
    return pd.DataFrame([vars(p) for p in rows])
