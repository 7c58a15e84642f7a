"""The host catalogue: a node's CPUs, their memory bandwidth and its NVMe drives, with sources.

Offload puts work on the host: ZeRO-Offload's optimizer step runs on the node's CPUs, and
ZeRO-Infinity reads and writes the state on the node's NVMe drives. Two figures of each host
decide how long that takes:

- **Memory bandwidth**, the CPUs' peak DRAM rate: sockets x memory channels per socket x the
  rated transfer rate (MT/s) x 8 bytes per transfer, from the CPU vendor's sheet. It is the
  ceiling a STREAM-like loop approaches (sustained STREAM triad typically reaches 70-90 % of it)
  and a strict upper bound on what the CPU optimizer streams, so a time derived from it is a
  lower bound. The rated rate is the CPU's maximum; a node that fills two DIMMs per channel
  may run its memory slower (DDR5 on Sapphire Rapids: 4,400 MT/s at two per channel), which
  only makes the bound looser.
- **NVMe drives**, each drive's sequential read and write rate from its vendor's sheet, and
  how many the node has; DGX systems ship their data drives as one RAID 0 array (the DGX
  user guides: ``/raid``), so a node reads and writes at the drives' sum.

Every rate is in bytes per second (decimal: 1 GB/s = 10^9 B/s). ``gpus`` is how many GPUs share
the host: each GPU's optimizer step and NVMe traffic get 1 / gpus of it when all step at once.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from zerolib.core.inputs import echo

MEGA = 10**6
BYTES_PER_TRANSFER = 8     # one 64-bit DDR channel moves 8 bytes per transfer
MB_PER_S = 10**6


@dataclass(frozen=True)
class Drive:
    """One NVMe drive model: sequential rates in bytes per second."""

    name: str
    read: int
    write: int
    source: str


@dataclass(frozen=True)
class Host:
    """A node's CPUs, their memory and its NVMe drives."""

    name: str               # the key typed on the command line, e.g. "dgx-h100"
    label: str
    cpus: str               # as the node's sheet names them
    sockets: int
    channels_per_socket: int
    transfer_rate: int      # MT/s, the CPU's rated memory speed
    gpus: int               # GPUs sharing the host
    drives: int             # NVMe data drives, one RAID 0 array
    drive: Drive
    source: str

    @property
    def memory_bandwidth(self) -> int:
        """Peak DRAM bandwidth of the node's CPUs, bytes per second (exact)."""
        return self.sockets * self.channels_per_socket * self.transfer_rate * MEGA * BYTES_PER_TRANSFER

    @property
    def nvme_read(self) -> int:
        """The node's drives read together (RAID 0), bytes per second."""
        return self.drives * self.drive.read

    @property
    def nvme_write(self) -> int:
        return self.drives * self.drive.write

    def __deepcopy__(self, memo) -> Host:
        return self  # immutable (pandas deep-copies DataFrame.attrs, which carry it)

    def as_dict(self) -> dict:
        return {"name": self.name, "cpus": self.cpus, "memory_bandwidth": self.memory_bandwidth,
                "gpus": self.gpus, "drives": self.drives, "drive": self.drive.name,
                "drive_read": self.drive.read, "drive_write": self.drive.write,
                "nvme_read": self.nvme_read, "nvme_write": self.nvme_write}


# The DGX sheets name the data drives' count and size (3.84 TB U.2 NVMe), not their model: a
# PCIe 4.0 U.2 data-centre drive of that size is taken, Samsung's PM1733, whose launch sheet
# gives 6,400 MB/s sequential read and 3,800 MB/s write for the U.2 form (later sheets quote up
# to 7,000 MB/s read; the launch figure is kept). A faster or slower drive is a new Drive here.
PM1733 = Drive("Samsung PM1733 3.84 TB U.2 (PCIe 4.0)", 6_400 * MB_PER_S, 3_800 * MB_PER_S,
               "Samsung PM1733/PM1735 announcement (2019): U.2 6.4 GB/s read, 3.8 GB/s write")

HOSTS: Mapping[str, Host] = MappingProxyType({host.name: host for host in (
    Host("dgx-a100", "DGX A100 (2x AMD EPYC 7742)", "2x AMD EPYC 7742 (64 cores each)", 2, 8,
         3_200, 8, 8, PM1733,
         "NVIDIA DGX A100 datasheet (640 GB system: dual AMD Rome 7742, 2 TB memory, 30 TB = "
         "8x 3.84 TB U.2 NVMe); AMD EPYC 7742 product page: 8 channels of DDR4-3200, 204.8 "
         "GB/s per socket"),
    Host("dgx-h100", "DGX H100 (2x Xeon Platinum 8480C)",
         "2x Intel Xeon Platinum 8480C (56 cores each)", 2, 8, 4_800, 8, 8, PM1733,
         "NVIDIA DGX BasePOD reference architecture, core components: dual Xeon Platinum "
         "8480C, 2 TB DDR5, eight 3.84 TB U.2 NVMe drives for storage/cache; Intel 4th-gen "
         "Xeon Scalable (Sapphire Rapids): 8 channels of DDR5-4800 per socket"),
)})
DEFAULT_HOST = "dgx-a100"


def get_host(host: str | Host, name: str = "host") -> Host:
    """A host of :data:`HOSTS` by name (any case), or a :class:`Host` as it is."""
    if isinstance(host, Host):
        return host
    key = host.strip().lower() if isinstance(host, str) else None
    if key not in HOSTS:
        raise ValueError(f"{name} must be one of {', '.join(HOSTS)}, got {echo(host)}")
    return HOSTS[key]

