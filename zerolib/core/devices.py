"""The accelerator catalogue: memory capacity in bytes, with where each figure comes from.

Vendors print "80GB" where the memory is 80 GiB (HBM stacks come in powers of two): an
A100 80GB reports 81920 MiB in nvidia-smi. Capacities here are the nominal GiB figures; the
memory a job can actually allocate is a little lower (ECC, driver, CUDA context), which the
working-set layer's reserve accounts for.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
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
