"""The placement options of ``zerolib estimate`` (``--shard-group``, ``--hpz``, offload ...).

Kept apart from ``estimate.py`` so that file only gains a few calls: these functions add the
arguments, turn them into a :class:`zerolib.core.memory.placement.Placement` (numbers parsed with
:mod:`zerolib.core.parse`), pick the stages a placement is offered at when ``--stage`` is not
given, and add the per-tier columns to the table and the CSV.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from zerolib.core.inputs import MAX_BYTES, MAX_GPUS
from zerolib.core.parse import parse_size, parse_whole
from zerolib.core.units import to_unit

if TYPE_CHECKING:
    from zerolib.core.memory.placement import Placement

OFFLOAD_TARGETS = ("cpu", "nvme")
# dest -> flag, for the messages
OPTIONS = {"shard_group": "--shard-group", "hpz": "--hpz", "offload_optimizer": "--offload-optimizer",
           "offload_params": "--offload-params",
           "host_memory": "--host-memory"}


def add_arguments(parser) -> None:
    group = parser.add_argument_group(
        "where the state lives",
        "Shard over a group of GPUs (HSDP, MiCS), keep ZeRO++'s hpZ copy, or offload to the "
        "host (ZeRO-Offload, ZeRO-Infinity; DeepSpeed's combinations). With any of these the "
        "category columns and 'per GPU' are what stays on the GPU; CPU and NVMe bytes are "
        "shown per GPU and per node. Without --stage only the stages that offer the setting "
        "are shown.")
    group.add_argument("--shard-group", metavar="G",
                       help="shard over groups of G GPUs (G divides --gpus), replicated across groups")
    group.add_argument("--hpz", action="store_true", default=None,
                       help="ZeRO++ hpZ (stage 3): a 16-bit parameter copy sharded within each node")
    group.add_argument("--offload-optimizer", choices=OFFLOAD_TARGETS,
                       help="optimizer state and fp32 gradients to CPU memory (stages 1-3) or "
                            "NVMe (stage 3)")
    group.add_argument("--offload-params", choices=OFFLOAD_TARGETS,
                       help="16-bit parameters to CPU memory or NVMe (stage 3 only)")
    group.add_argument("--host-memory", metavar="SIZE",
                       help="CPU memory per node, e.g. 1TiB, 2TB: judge the offloaded host "
                            "state against it (fits then needs both)")


def requested(args) -> bool:
    return any(getattr(args, dest, None) is not None for dest in OPTIONS)


def fields_from(args) -> dict:
    """The run's fields the placement flags give (flat names; only those given)."""
    out = {}
    if args.shard_group is not None:
        out["shard_group"] = parse_whole(args.shard_group, "--shard-group", maximum=MAX_GPUS)
    if args.hpz:
        out["hpz"] = True
    for dest in ("offload_optimizer", "offload_params"):
        if getattr(args, dest) is not None:
            out[dest] = getattr(args, dest)
    return out


def host_memory_from(args) -> int | None:
    if args.host_memory is None:
        return None
    return parse_size(args.host_memory, "--host-memory", maximum=MAX_BYTES)


def default_stages(placement: Placement | None, stages):
    """``--stage`` when given, otherwise the stages ``placement`` is offered at."""
    if placement is None or stages is not None:
        return stages
    from zerolib.core.memory.placement import offered_stages
    return offered_stages(placement)


def has_tiers(result: dict) -> bool:
    return bool(result["stages"]) and "tiers" in result["stages"][0]


def describe(result: dict, unit: str) -> str:
    fields = result["placement"]
    from zerolib.core.memory.placement import Placement
    text = Placement(**fields).describe()
    memory = result.get("host_memory")
    host = "" if memory is None else f"; host memory {to_unit(memory, unit):,.2f} {unit} per node"
    return (f"Placement: {text}; {fields['gpus_per_node']} GPUs per node{host}. Category columns "
            "and 'per GPU' are what stays on the GPU.")


def host_note(result: dict, unit: str) -> str | None:
    """What the CPU/GPU and NVMe/GPU columns hold, item by item (None when nothing is offloaded):
    a bare "CPU/GPU 2.00 GB" beside parameters on NVMe does not say it is DeepSpeed's
    ``max_in_cpu`` share kept in pinned memory."""
    fields = result["placement"]
    gradients = "fp32 gradients" if fields["host_gradient_bytes"] == 4 else "gradients"
    names = {"parameters": "16-bit parameters", "gradients": gradients, "optimizer": "optimizer state"}
    parts = []
    for tier in _offloads(result):
        items = [item for item in names if any(row["tiers"][tier][item] for row in result["stages"])]
        said = [names[item] for item in items]
        label = said[0] if len(said) == 1 else f"{', '.join(said[:-1])} and {said[-1]}"
        if tier == "cpu" and fields["offload_params"] == "nvme" and "parameters" in items:
            kept = max(row["tiers"]["cpu"]["parameters"] for row in result["stages"])
            label = label.replace(
                "16-bit parameters",
                f"{to_unit(kept, unit):,.2f} {unit} of the 16-bit parameters (with parameters on "
                f"NVMe DeepSpeed keeps up to offload_param.max_in_cpu = {fields['max_in_cpu']:,} "
                f"elements of each GPU's shard in pinned CPU memory)")
        if tier == "nvme" and fields["offload_params"] == "nvme" and "parameters" in items:
            label = label.replace("16-bit parameters", "the rest of the 16-bit parameters")
        parts.append(f"{'CPU' if tier == 'cpu' else 'NVMe'}/GPU holds {label}")
    if not parts:
        return None
    judged = ("; host fits compares CPU/node with --host-memory"
              if result.get("host_memory") is not None else "")
    return (f"Host columns: {'; '.join(parts)}; /node is that times the {fields['gpus_per_node']} "
            f"GPUs of a node{judged}.")


def _offloads(result: dict) -> list[str]:
    return [tier for tier in ("cpu", "nvme")
            if any(row["tiers"][tier]["total"] for row in result["stages"])]


def table_columns(result: dict, unit: str) -> tuple[list[str], list[list[str]]]:
    """Per tier that holds anything: bytes per GPU and per node; then host_fits if judged."""
    tiers = _offloads(result)
    names = {"cpu": "CPU", "nvme": "NVMe"}
    headers = [h for tier in tiers for h in (f"{names[tier]}/GPU [{unit}]", f"{names[tier]}/node [{unit}]")]
    cells = [[f"{to_unit(row['tiers'][tier][key], unit):,.2f}" for tier in tiers
              for key in ("total", "per_node")] for row in result["stages"]]
    if result.get("host_memory") is not None:
        headers.append("host fits")
        for row, line in zip(result["stages"], cells):
            line.append("yes" if row["host_fits"] else "no")
    return headers, cells


def csv_columns(result: dict) -> tuple[list[str], list[list]]:
    headers = ["gpu", "cpu", "nvme", "gpu_per_node", "cpu_per_node", "nvme_per_node", "host_fits"]
    rows = [[*(row["tiers"][t]["total"] for t in ("gpu", "cpu", "nvme")),
             *(row["tiers"][t]["per_node"] for t in ("gpu", "cpu", "nvme")),
             "" if row.get("host_fits") is None else row["host_fits"]] for row in result["stages"]]
    return headers, rows
