"""The per-stage breakdown for one setting: the object behind ``zerolib estimate``.

Its ``as_dict()`` is the JSON contract (all values in bytes):
{"params", "gpus", "layout": {...}, "device": {...} | null,
 "stages": [{"stage", "parameters", "gradients", "optimizer", "total", "cluster_total", "fits"}]}
With a device, ``fits_judges`` says what ``fits`` judges: "model state" (a bare parameter
count), "peak" (a model: model state + working set), either followed by " and host memory"
when the CPU memory of a node is judged too.
With a model (:func:`estimate_model`) each stage row also carries ``working_set`` (bytes per
term), ``peak`` and ``pipeline_stage`` (the most-loaded stage's index), ``fits`` is judged
on the peak, and the object gains ``model``, ``tensor_parallel``, ``pipeline_parallel`` and
``working_set_settings``.

With a ``placement`` (:mod:`zerolib.core.memory.placement`: shard group, hpZ, offload) the object gains
``placement`` and ``host_memory`` (CPU memory per node in bytes, or null), each row's category
bytes and ``total`` are what stays on the GPU, and each row gains ``tiers``: per tier ("gpu",
"cpu", "nvme") the bytes per GPU of each item ("parameters", "hpz_secondary", "gradients",
"optimizer"), their ``total`` and ``per_node``. With ``host_memory`` a row gains ``host_fits``
(the node's CPU tier against it) and ``fits`` needs both.

With a ``link`` (a node or a link of :mod:`zerolib.core.catalogue.nodes` / :mod:`zerolib.core.catalogue.links`)
each stage row also carries ``communication`` (:func:`zerolib.core.step.tables.communication_rows`:
per collective kind the calls, bytes handed, sent and received per GPU and seconds; totals;
compute, exposed and step seconds and the network-wait fraction when a device is given), and
the object gains ``interconnect`` (with the ``bus_bandwidth`` of a ring over all its GPUs,
bytes per second) and ``compute_settings`` (tokens per GPU, mfu, FLOPs per parameter and token).

The ``communication`` object follows the placement: a shard group's all-gathers and
reduce-scatter run inside the group and each gradient shard is all-reduced across the replicas
(:mod:`zerolib.core.step.traffic`), hpZ gathers the backward pass from its in-node copy, and
``qwz`` / ``qgz`` (ZeRO++'s quantised weights and gradients) change the widths and turn the
reduce-scatter into two all-to-alls; each collective is timed on the link its ring uses.
Besides the keys above it holds:

- ``collectives["all_to_all"]``: qgZ's all-to-alls (zeros without qgZ);
- ``shard_group``, ``replicas``: G and N / G;
- ``qwz``, ``qgz``: whether ZeRO++'s quantised weights and gradients were asked for;
- ``cross_node_bytes``: the bytes that leave one node in the step (null for a single link);
- ``host_seconds``: the offload transfers' seconds (0 without offload; null without a link);
- ``schedule``: one entry per collective in use, in step order, with ``name``, ``label``,
  ``phase``, ``kind``, ``ring`` (all, group, replicas, hpz, node, nodes), ``ring_gpus``,
  ``link`` (the catalogue link it runs on), ``bus_bandwidth``, ``calls``, ``handed_bytes``,
  ``sent_bytes``, ``received_bytes``, ``cross_node_bytes`` and ``seconds``;
- ``host``: null without offload; else the PCIe link and NVMe link with their ``bandwidth``,
  ``to_gpu_bytes``, ``to_host_bytes``, ``nvme_read_bytes``, ``nvme_write_bytes``, ``seconds``
  and ``transfers`` (each transfer's ``name``, ``label``, ``phase``, ``direction``, ``bytes``;
  :mod:`zerolib.core.step.offload_traffic`).

``communication_seconds`` is the collectives alone; ``exposed_seconds`` and ``step_seconds``
include the host transfers that do not hide behind compute.
"""
from __future__ import annotations

from dataclasses import dataclass

from zerolib.core.catalogue.devices import Device, get_device
from zerolib.core.catalogue.models import TransformerConfig, get_model, parameter_count
from zerolib.core.catalogue.nodes import Interconnect, bus_bandwidth, interconnect
from zerolib.core.inputs import (
    MAX_BYTES,
    check_count,
    check_gpus,
    check_one,
    check_params,
    check_positive_int,
    check_single,
    check_stages,
)
from zerolib.core.memory.accounting import STAGES, Layout, get_layout, state_bytes
from zerolib.core.memory.model_parallel import check_parallel
from zerolib.core.memory.placement import Placement, check_placement, gpus_on_node, place
from zerolib.core.memory.working_set import (
    DEFAULT_SETTINGS,
    WorkingSetSettings,
    check_peak_inputs,
    rows_of,
)
from zerolib.core.step.engines import (
    DEFAULT_ENGINE,
    Engine,
    Overlap,
    check_engine_stage,
    get_engine,
)
from zerolib.core.step.offload_traffic import DEFAULT_HOST_LINK
from zerolib.core.step.tables import communication_rows
from zerolib.core.step.time import (
    DEFAULT_COMPUTE,
    DEFAULT_MFU,
    DEFAULT_TOKENS_PER_GPU,
    ComputeSettings,
)
from zerolib.core.step.traffic import MAX_MICRO_BATCHES

# The traffic options of estimate / estimate_model and their defaults (each needs a link).
TRAFFIC_DEFAULTS = {"qwz": False, "qgz": False, "host_link": DEFAULT_HOST_LINK,
                    "micro_batches": 1, "overlap": None}


@dataclass(frozen=True)
class Estimate:
    params: int
    gpus: int
    layout: Layout
    device: Device | None
    stages: tuple[dict, ...]
    model: TransformerConfig | None = None
    settings: WorkingSetSettings | None = None
    placement: Placement | None = None
    host_memory: int | None = None
    interconnect: Interconnect | None = None
    compute: ComputeSettings | None = None
    engine: Engine | None = None
    micro_batches: int = 1
    overlap: Overlap | None = None     # the rule the step times follow (None: no link)

    def as_dict(self) -> dict:
        out = {"params": self.params, "gpus": self.gpus, "layout": self.layout.as_dict(),
               "device": self.device.as_dict() if self.device else None,
               "stages": [dict(row) for row in self.stages]}
        if self.engine is not None:   # whose stages, validity rules and schedule
            out["engine"] = self.engine.name
        if self.interconnect is not None:
            out.update(micro_batches=self.micro_batches, overlap=self.overlap.as_dict())
        if self.device is not None:   # what "fits" judges: never one judgement for another
            judged = "peak" if self.model is not None else "model state"
            out["fits_judges"] = judged + (" and host memory" if self.host_memory is not None else "")
        if self.model is not None:
            out.update(model=self.model.name, tensor_parallel=self.settings.tensor_parallel,
                       pipeline_parallel=self.settings.pipeline_parallel,
                       working_set_settings=self.settings.as_dict())
        if self.placement is not None:
            on_node = int(gpus_on_node(self.gpus, self.placement.gpus_per_node))
            out.update(placement={**self.placement.as_dict(), "gpus_per_node": on_node},
                       host_memory=self.host_memory)
        if self.interconnect is not None:
            out.update(interconnect={**self.interconnect.as_dict(), "bus_bandwidth": int(
                           bus_bandwidth(self.interconnect, self.gpus))},
                       compute_settings=self.compute.as_dict())
        return out


def _with_communication(result: Estimate, what, link, gpus_per_node, compute,
                        traffic_options: dict, engine: Engine) -> Estimate:
    """``result`` with a ``communication`` object in every stage row (see the module doc)."""
    result = Estimate(result.params, result.gpus, result.layout, result.device, result.stages,
                      result.model, result.settings, result.placement, result.host_memory,
                      engine=engine)
    if link is None:
        if gpus_per_node is not None:
            raise ValueError("gpus_per_node needs a link")
        used = [name for name, value in traffic_options.items()
                if value != TRAFFIC_DEFAULTS[name]]
        if used:
            raise ValueError(f"{used[0]} needs a link")
        return result
    ic = interconnect(link, gpus_per_node)
    stages = [row["stage"] for row in result.stages]
    overlap = traffic_options["overlap"]
    if overlap is not None and not isinstance(overlap, Overlap):
        raise TypeError(f"overlap must be an Overlap or None, got {type(overlap).__name__}")
    rows = communication_rows(what, result.gpus, stages, result.layout, ic, result.device,
                              compute, result.placement, engine=engine, **traffic_options)
    by_stage = dict(zip(sorted(stages), rows))
    with_rows = tuple({**row, "communication": {
        **by_stage[row["stage"]], "qwz": traffic_options["qwz"], "qgz": traffic_options["qgz"]}}
        for row in result.stages)
    return Estimate(result.params, result.gpus, result.layout, result.device, with_rows,
                    result.model, result.settings, result.placement, result.host_memory, ic, compute,
                    engine, traffic_options["micro_batches"],
                    engine.overlap if overlap is None else overlap)


def _engine_stages(engine, stages, placement=None, gpus: int = 1) -> tuple[int, ...]:
    """The stages to report: the engine's when every stage was asked (the default; with a shard
    group smaller than every GPU, stage 0 and the stages the engine shards in groups), else
    the ones asked, each of which the engine must offer."""
    engine = get_engine(engine)
    if stages is STAGES:
        grouped = (placement is not None and placement.shard_group is not None
                   and 1 < placement.shard_group < gpus)
        stages = tuple(s for s in STAGES if s in engine.stages
                       and (not grouped or s == 0 or s in engine.group_stages))
    stages = check_stages(stages)
    for stage in stages:
        if stage not in engine.stages:
            raise ValueError(f"engine {engine.name} offers ZeRO stages "
                             f"{', '.join(map(str, engine.stages))}, got stage {stage}")
    return stages


def _compute(tokens_per_gpu, mfu) -> ComputeSettings:
    """The compute settings (checked when made); the defaults' object is made once."""
    if tokens_per_gpu is DEFAULT_TOKENS_PER_GPU and mfu is DEFAULT_MFU:
        return DEFAULT_COMPUTE
    return ComputeSettings(tokens_per_gpu, mfu)


def _host_memory(host_memory, placement) -> int | None:
    if host_memory is None:
        return None
    if placement is None:
        raise ValueError("host_memory needs a placement (it judges the CPU memory offload uses)")
    return check_count(host_memory, "host_memory", MAX_BYTES)


def estimate(params, gpus, layout: str | Layout = "mixed-adam",
             device: str | Device | None = None, stages=STAGES,
             placement: Placement | None = None, host_memory: int | None = None,
             link: str | Interconnect | None = None, gpus_per_node: int | None = None,
             tokens_per_gpu: int = DEFAULT_TOKENS_PER_GPU, mfu: float = DEFAULT_MFU,
             qwz: bool = False, qgz: bool = False,
             host_link: str = DEFAULT_HOST_LINK, engine: str | Engine = DEFAULT_ENGINE,
             micro_batches: int = 1, overlap: Overlap | None = None) -> Estimate:
    """Bytes per worker for each requested stage of one (params, gpus) setting; ``fits`` judges
    the model state against ``device`` (None without one), and with ``host_memory`` the CPU
    tier of a node against it. With ``link``, each stage's communication (a bare count: stage
    3 gathers one flat buffer per pass) as ``engine`` runs it over ``micro_batches``
    micro-batches (``tokens_per_gpu`` is the whole step's), timed under ``overlap`` (None: the
    engine's rule). See the module doc."""
    params = check_one(params, check_params, "params")
    gpus = check_one(gpus, check_gpus, "gpus")
    layout = get_layout(layout)
    device = get_device(device) if device is not None else None
    engine = get_engine(engine)
    stages = _engine_stages(engine, stages, placement, gpus)
    host_memory = _host_memory(host_memory, placement)
    if placement is None:   # Python ints, no arrays: one answer in microseconds
        capacity = None if device is None else device.capacity
        rows = [{"stage": stage, **state_bytes(params, gpus, stage, layout)} for stage in stages]
        for row in rows:
            row["fits"] = None if capacity is None else row["total"] <= capacity
        result = Estimate(params, gpus, layout, device, tuple(rows), host_memory=host_memory)
        return _with_communication(result, params, link, gpus_per_node,
                                   _compute(tokens_per_gpu, mfu),
                                   {"qwz": qwz, "qgz": qgz, "host_link": host_link,
                                    "micro_batches": micro_batches, "overlap": overlap}, engine)
    tiers = place(params, gpus, stages, layout, check_placement(placement))
    columns = {**tiers.gpu_categories(), "total": tiers.gpu}
    rows = []
    for index, stage in enumerate(stages):
        row = {"stage": stage, **{name: int(values[index]) for name, values in columns.items()}}
        if tiers is not None:
            row["cluster_total"] = row["total"] * gpus   # Python ints: exact
        row["fits"] = None if device is None else row["total"] <= device.capacity
        if tiers is not None:
            row["tiers"] = tiers.as_dict(index)
        if host_memory is not None:
            row["host_fits"] = row["tiers"]["cpu"]["per_node"] <= host_memory
            if row["fits"] is not None:
                row["fits"] = row["fits"] and row["host_fits"]
        rows.append(row)
    result = Estimate(params, gpus, layout, device, tuple(rows), placement=placement,
                      host_memory=host_memory)
    return _with_communication(result, params, link, gpus_per_node,
                               _compute(tokens_per_gpu, mfu),
                               {"qwz": qwz, "qgz": qgz, "host_link": host_link,
                                "micro_batches": micro_batches, "overlap": overlap}, engine)


def estimate_model(model: str | TransformerConfig, gpus,
                   settings: WorkingSetSettings = DEFAULT_SETTINGS,
                   layout: str | Layout = "mixed-adam", device: str | Device | None = None,
                   stages=STAGES, placement: Placement | None = None,
                   host_memory: int | None = None, link: str | Interconnect | None = None,
                   gpus_per_node: int | None = None, tokens_per_gpu: int | None = None,
                   mfu: float = DEFAULT_MFU, qwz: bool = False, qgz: bool = False,
                   host_link: str = DEFAULT_HOST_LINK, engine: str | Engine = DEFAULT_ENGINE,
                   micro_batches: int = 1, overlap: Overlap | None = None) -> Estimate:
    """The breakdown of a model preset: persistent state and working set per stage, ``fits``
    judged on the peak (see :func:`zerolib.core.memory.working_set.stage_rows`). With ``link``, each
    stage's communication, per layer for stage 3; ``tokens_per_gpu`` defaults to the working
    set's sequence length x micro-batch x ``micro_batches``, and full recomputation there costs
    8 FLOPs per parameter and token instead of 6. ``engine`` decides which stages exist and
    which run beside a pipeline (the planner's rule), and the schedule."""
    config, layout = get_model(model), get_layout(layout)
    gpus = check_single(gpus, check_gpus, "gpus")
    device = get_device(device) if device is not None else None
    host_memory = _host_memory(host_memory, placement)
    engine = get_engine(engine)
    stages = _engine_stages(engine, stages, placement, gpus)
    if isinstance(settings, WorkingSetSettings):   # (check_peak_inputs names a wrong type)
        # The planner's rule, the engine's: a stage it does not run beside a pipeline is refused.
        if engine.pipeline_stages == (0, 1):   # DeepSpeed's rule, in its words
            check_parallel(config, 1, settings.pipeline_parallel, stage=stages)
        check_engine_stage(engine, stages, settings.pipeline_parallel)
    # Checked once here; the rows beneath trust them.
    rows = rows_of(check_peak_inputs(config, gpus, stages, settings, layout, placement), device,
                   host_memory)
    result = Estimate(parameter_count(config), gpus, layout, device, tuple(rows), config, settings,
                      placement, host_memory)
    if link is not None and (settings.tensor_parallel != 1 or settings.pipeline_parallel != 1):
        raise ValueError("a link with tensor or pipeline parallelism is not modelled here: the "
                         "step model times data-parallel collectives only (see zerolib plan)")
    m = check_positive_int(micro_batches, "micro_batches", MAX_MICRO_BATCHES)
    tokens = (settings.seq_len * settings.micro_batch * m if tokens_per_gpu is None
              else tokens_per_gpu)
    return _with_communication(result, config, link, gpus_per_node,
                               ComputeSettings(tokens, mfu, settings.recompute == "full"),
                               {"qwz": qwz, "qgz": qgz, "host_link": host_link,
                                "micro_batches": m, "overlap": overlap}, engine)
