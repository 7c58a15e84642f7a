"""The accelerator catalogue: memory capacity in bytes, with where each figure comes from.

Vendors print "80GB" where the memory is 80 GiB (HBM stacks come in powers of two): an
A100 80GB reports 81920 MiB in nvidia-smi. Capacities here are the nominal GiB figures; the
memory a job can actually allocate is a little lower (ECC, driver, CUDA context), which the
working-set layer's reserve accounts for.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from zerolib.core.units import GB, GiB, check_unit


@dataclass(frozen=True)
class Device:
    name: str        # the key used on the command line, e.g. "a100-80gb"
    label: str       # for legends, e.g. "A100 80GB"
    capacity: int    # bytes
    source: str

    def as_dict(self) -> dict:
        return {"name": self.name, "capacity": self.capacity}


DEVICES: Mapping[str, Device] = MappingProxyType({d.name: d for d in (
    Device("v100-32gb", "V100 32GB", 32 * GiB,
           "NVIDIA Tesla V100 datasheet: 32 GB HBM2 (4 stacks of 8 GiB)"),
    Device("a100-40gb", "A100 40GB", 40 * GiB,
           "NVIDIA A100 Tensor Core GPU datasheet: 40GB HBM2; nvidia-smi reports 40960 MiB"),
    Device("a100-80gb", "A100 80GB", 80 * GiB,
           "NVIDIA A100 Tensor Core GPU datasheet: 80GB HBM2e; nvidia-smi reports 81920 MiB"),
    Device("h100-80gb", "H100 80GB", 80 * GiB,
           "NVIDIA H100 Tensor Core GPU datasheet (SXM5): 80GB HBM3 (5 stacks of 16 GiB)"),
    Device("h200-141gb", "H200 141GB", 141 * GiB,
           ("NVIDIA H200 Tensor Core GPU datasheet: 141GB HBM3e; taken as 141 GiB (nvidia-smi "
            "reports about 140.4 GiB usable)")),
    Device("rtx4090-24gb", "RTX 4090 24GB", 24 * GiB,
           "NVIDIA GeForce RTX 4090 specifications: 24 GB GDDR6X (12 x 2 GiB modules)"),
)})


def get_device(device: str | Device) -> Device:
    """A catalogue device by name, or a Device passed through."""
    if isinstance(device, Device):
        return device
    if isinstance(device, str) and device.lower() in DEVICES:
        return DEVICES[device.lower()]
    raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")


def capacity_text(device: str | Device, unit: str = "GB") -> str:
    """``'80 GiB = 85.9 GB'``: the nominal GiB, and GB too when that is the unit shown."""
    device = get_device(device)
    gib = f"{device.capacity / GiB:g} GiB"
    return gib if check_unit(unit) == GiB else f"{gib} = {device.capacity / GB:.1f} GB"


# Which reading of "80GB" a fit is judged against. "nominal": the vendor's figure in GiB (HBM
# comes in powers of two; the catalogue's capacity). "decimal": the same figure in GB (10^9), as
# a reader who takes the label literally would. "reported": the total that NVML (nvidia-smi)
# reports, where it is published.
CAPACITY_BASES = ("nominal", "decimal", "reported")
# NVML's total memory, MiB: Modal, "Why does an NVIDIA H100 80GB card offer 85.52 GB?"
# (thundergolfer.com/blog/nvidia-gpu-memory-capacity), table of nvidia-smi readings per GPU.
REPORTED_MIB: Mapping[str, int] = MappingProxyType({
    "a100-40gb": 40_960, "a100-80gb": 81_920, "h100-80gb": 81_559, "h200-141gb": 143_771,
    "a10-24gb": 23_028, "l40s-48gb": 46_068, "l4-24gb": 23_034, "t4-16gb": 15_360,
})
_MARKETED_GB = re.compile(r"-(\d+)gb$")


def device_at(device: str | Device, basis: str = "nominal") -> Device:
    """``device`` with its capacity read on ``basis`` (see :data:`CAPACITY_BASES`); the label
    says which reading it is, so every figure and table that shows the line names it."""
    device = get_device(device)
    if basis not in CAPACITY_BASES:
        raise ValueError(f"basis must be one of {', '.join(CAPACITY_BASES)}, got {basis!r}")
    if basis == "nominal":
        return device
    if basis == "decimal":
        marketed = _MARKETED_GB.search(device.name)
        if marketed is None:
            raise ValueError(f"device {device.name!r} names no GB figure to read decimally")
        return replace(device, label=f"{device.label} read as {marketed.group(1)} GB",
                       capacity=int(marketed.group(1)) * GB,
                       source=device.source + "; the label's figure read as decimal GB")
    if device.name not in REPORTED_MIB:
        raise ValueError(f"no published nvidia-smi total for {device.name}; reported capacities "
                         f"are known for {', '.join(REPORTED_MIB)}")
    mib = REPORTED_MIB[device.name]
    return replace(device, label=f"{device.label} as reported ({mib:,} MiB)", capacity=mib * 2**20,
                   source="NVML total memory as nvidia-smi reports it (Modal, 'Why does an NVIDIA "
                          "H100 80GB card offer 85.52 GB?', table of readings)")
