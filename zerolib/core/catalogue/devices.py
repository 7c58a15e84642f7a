"""The accelerator catalogue: memory capacity in bytes and peak dense 16-bit FLOP/s, with
where each figure comes from.

Vendors print "80GB" where the memory is 80 GiB (HBM stacks come in powers of two): an
A100 80GB reports 81920 MiB in nvidia-smi. Capacities here are the nominal GiB figures; the
memory a job can actually allocate is a little lower (ECC, driver, CUDA context), which the
working-set layer's reserve accounts for.

Peaks are dense (no 2:4 structured sparsity) tensor-core FLOP/s in bf16 with fp32 accumulation.
Vendors headline the sparse figure for several parts ("shown with sparsity; specifications 1/2
lower without sparsity"): the dense value is half of it, and each source says which it read.
V100 and T4 have no bf16: their entry is the fp16 tensor-core peak (``peak_dtype`` says so),
the 16-bit format mixed-precision training uses on them.

A device is added here and nowhere else: ``node`` names the server of
:data:`zerolib.core.catalogue.nodes.NODES` it usually comes in, which the planner (and its
explorer) run on when a plan names no links; the CLI's ``--device`` choices and the explorers'
menus read this catalogue.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from zerolib.core.inputs import MAX_BYTES, echo
from zerolib.core.units import GB, GiB, check_unit

MAX_PEAK_FLOPS = 10**21   # FLOP/s of one device: a zettaFLOP/s, far beyond any part


@dataclass(frozen=True)
class Device:
    name: str        # the key used on the command line, e.g. "a100-80gb"
    label: str       # for legends, e.g. "A100 80GB"
    capacity: int    # bytes
    source: str
    peak_flops: int | None = None   # dense 16-bit tensor-core FLOP/s; None: not catalogued
    peak_dtype: str = ""            # "bf16", or "fp16" on parts without bf16
    peak_source: str = ""
    # The node it usually comes in (a key of nodes.NODES): what a plan runs on when it names no
    # links. None: sold in no usual server, so a plan must be told its links.
    node: str | None = None

    def __post_init__(self):
        # Whole numbers in range, so every time and fit derived from a device stays finite.
        if isinstance(self.capacity, bool) or not isinstance(self.capacity, int) or not (
                1 <= self.capacity <= MAX_BYTES):
            raise ValueError(f"capacity must be a whole number of bytes, 1 to {MAX_BYTES:,}, got "
                             f"{echo(self.capacity)}")
        if self.peak_flops is not None and (
                isinstance(self.peak_flops, bool) or not isinstance(self.peak_flops, int)
                or not 1 <= self.peak_flops <= MAX_PEAK_FLOPS):
            raise ValueError(f"peak_flops must be None or a whole number of FLOP/s, 1 to "
                             f"{MAX_PEAK_FLOPS:,}, got {echo(self.peak_flops)}")

    def __deepcopy__(self, memo) -> Device:
        return self  # immutable (pandas deep-copies DataFrame.attrs, which carry it)

    def as_dict(self) -> dict:
        return {"name": self.name, "capacity": self.capacity}


TFLOPS = 10**12   # FLOP/s in one TFLOP/s


DEVICES: Mapping[str, Device] = MappingProxyType({d.name: d for d in (
    Device("v100-32gb", "V100 32GB", 32 * GiB,
           "NVIDIA Tesla V100 datasheet: 32 GB HBM2 (4 stacks of 8 GiB)",
           125 * TFLOPS, "fp16",
           "NVIDIA A100 Tensor Core GPU Architecture whitepaper, Table 1 (V100 column): 'Peak "
           "FP16 Tensor TFLOPS with FP32 Accumulate 125', 'Peak BF16 Tensor TFLOPS ... NA' "
           "(Volta has no bf16 and no sparsity)",
           node="dgx-2"),
    Device("a100-40gb", "A100 40GB", 40 * GiB,
           "NVIDIA A100 Tensor Core GPU datasheet: 40GB HBM2; nvidia-smi reports 40960 MiB",
           312 * TFLOPS, "bf16",
           "NVIDIA A100 datasheet: 'BFLOAT16 Tensor Core 312 TFLOPS | 624 TFLOPS*' (* with "
           "sparsity); Narayanan et al. 2021, Sec. 5: 'The peak device throughput of an A100 "
           "GPU with 16-bit precision is 312 teraFLOP/s'",
           node="dgx-a100"),
    Device("a100-80gb", "A100 80GB", 80 * GiB,
           "NVIDIA A100 Tensor Core GPU datasheet: 80GB HBM2e; nvidia-smi reports 81920 MiB",
           312 * TFLOPS, "bf16",
           "NVIDIA A100 datasheet: 'BFLOAT16 Tensor Core 312 TFLOPS | 624 TFLOPS*' (* with "
           "sparsity)",
           node="dgx-a100"),
    Device("h100-80gb", "H100 80GB", 80 * GiB,
           "NVIDIA H100 Tensor Core GPU datasheet (SXM5): 80GB HBM3 (5 stacks of 16 GiB)",
           989_500_000_000_000, "bf16",
           "NVIDIA H100 Tensor Core GPU datasheet (SXM): 'BF16 Tensor Core 1,979 teraFLOPS*', "
           "'* With sparsity', specifications 1/2 lower without: 989.5 dense",
           node="dgx-h100"),
    Device("h200-141gb", "H200 141GB", 141 * GiB,
           ("NVIDIA H200 Tensor Core GPU datasheet: 141GB HBM3e; taken as 141 GiB (nvidia-smi "
            "reports about 140.4 GiB usable)"),
           989_500_000_000_000, "bf16",
           "NVIDIA H200 Tensor Core GPU datasheet (SXM): 'BF16 Tensor Core 1,979 TFLOPS' with "
           "sparsity, as the H100 SXM: 989.5 dense",
           node="dgx-h100"),  # HGX/DGX H200: NVLink 4 and 8 x 400 Gb/s ports, as the H100's
    Device("rtx4090-24gb", "RTX 4090 24GB", 24 * GiB,
           "NVIDIA GeForce RTX 4090 specifications: 24 GB GDDR6X (12 x 2 GiB modules)",
           165_200_000_000_000, "bf16",
           "NVIDIA Ada GPU Architecture whitepaper v2.1, Appendix A: 'Peak BF16 Tensor TFLOPS "
           "with FP32 Accumulate 165.2/330.4' (dense/sparse)"),
    Device("b200-180gb", "B200 180GB", 180 * GiB,
           "NVIDIA DGX B200 datasheet: 1,440GB total GPU memory for 8 GPUs, 180GB HBM3e per GPU, "
           "taken as 180 GiB like the other parts (the 192 GB of the launch announcements is "
           "the stacks' physical size, not what HGX/DGX B200 expose)",
           2_250 * TFLOPS, "bf16",
           "NVIDIA HGX B200: FP16/BF16 Tensor Core 4.5 petaFLOPS per GPU, and the Blackwell "
           "datasheet's note 'Specifications in sparse. Dense is one-half of the sparse spec "
           "shown': 2.25 petaFLOPS dense",
           node="dgx-b200"),
    Device("mi300x-192gb", "MI300X 192GB", 192 * GiB,
           "AMD ROCm documentation, GPU architecture specifications: MI300X VRAM 192 GiB HBM3",
           1_307_400_000_000_000, "bf16",
           "AMD ROCm documentation, MI300 architecture, 'Peak-performance capabilities of the "
           "MI300X': Matrix BF16 1307.4 TFLOPS dense (2614.9 with structured sparsity)",
           node="mi300x-8"),
    Device("l40s-48gb", "L40S 48GB", 48 * GiB,
           "NVIDIA L40S datasheet: 48GB GDDR6 with ECC",
           362_050_000_000_000, "bf16",
           "NVIDIA L40S datasheet: 'BF16 Tensor Core 362.05 | 733*' TFLOPS (* with sparsity). "
           "Some analyses read 362.05 as an fp16-accumulate rate, which would put bf16 with "
           "fp32 accumulation at about half; the datasheet's figure is used",
           node="pcie-8x-l40s"),
    Device("l4-24gb", "L4 24GB", 24 * GiB,
           "NVIDIA L4 Tensor Core GPU datasheet: 24GB GDDR6",
           121 * TFLOPS, "bf16",
           "NVIDIA L4 datasheet: 'BF16 Tensor Core 242 teraFLOPS*' (* with sparsity); Ada "
           "whitepaper, Appendix D: 121 | 242"),
    Device("a10-24gb", "A10 24GB", 24 * GiB,
           "NVIDIA A10 Tensor Core GPU datasheet: 24GB GDDR6",
           125 * TFLOPS, "bf16",
           "NVIDIA A10 datasheet: 'BFLOAT16 Tensor Core 125 TF | 250 TF*' (* with sparsity)",
           node="pcie-4x-a10"),
    Device("t4-16gb", "T4 16GB", 16 * GiB,
           "NVIDIA T4 Tensor Core GPU datasheet: 16GB GDDR6",
           65 * TFLOPS, "fp16",
           "NVIDIA T4 datasheet: 'Mixed Precision (FP16/FP32) 65 FP16 TFLOPS' (Turing has no "
           "bf16 and no sparsity)"),
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
