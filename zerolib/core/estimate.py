"""The per-stage breakdown for one setting: the object behind ``zerolib estimate``.

Its ``as_dict()`` is the JSON contract (all values in bytes):
{"params", "gpus", "layout": {...}, "device": {...} | null,
 "stages": [{"stage", "parameters", "gradients", "optimizer", "total", "cluster_total", "fits"}]}
With a device, ``fits_judges`` says what ``fits`` judges: "model state" (a bare parameter
count), "peak" (a model: model state + working set) or "peak_reserved" (an engine that judges
the reserved peak, zerolib.core.memory.conventions), either followed by " and host memory"
when the CPU memory of a node is judged too.
With a model (an architecture) each stage row also carries ``working_set`` (bytes per
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
bytes per second, and ``link_efficiency``: the rate its links ran at, "achieved" by default,
"line-rate" or a fraction, given as ``link_efficiency``) and ``compute_settings`` (tokens per
GPU, mfu, the recompute setting, FLOPs per parameter and token, the attention core's FLOPs per
token and what recomputation repeats of it).

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
- ``host``: null without offload; else the PCIe link with its ``bandwidth``, the NVMe rates
  per GPU (``nvme_read_bandwidth``, ``nvme_write_bandwidth``: its share of the host's drives,
  capped at the link; ``nvme_link`` and ``nvme_bandwidth`` null unless an explicit link times
  them), ``to_gpu_bytes``, ``to_host_bytes``, ``nvme_read_bytes``, ``nvme_write_bytes``,
  ``seconds`` (the transfers), ``transfers`` (each transfer's ``name``, ``label``, ``phase``,
  ``direction``, ``bytes``; :mod:`zerolib.core.step.offload_traffic`), ``host_settings`` (the
  host assumed: its CPUs, memory bandwidth and drives, the ``cpu_adam_rate`` or null, the
  basis) and ``cpu_step`` (the CPU's optimizer step per GPU: ``elements``, ``bytes``,
  ``gpus_on_node``, ``roofline_seconds``, ``seconds``);
- ``cpu_step_seconds``: the CPU's optimizer step (0 without an offloaded optimizer; null
  without a link), after the backward and before the next forward, hidden behind nothing.

``host`` (a name of :data:`zerolib.core.catalogue.hosts.HOSTS`; default: the node ``link``
names where the catalogue has its host, else DGX A100's) and ``cpu_adam_rate`` (parameters per
second the node's CPUs update, measured; default None: the roofline alone) set the host.

``communication_seconds`` is the collectives alone; ``exposed_seconds`` and ``step_seconds``
include the host transfers that do not hide behind compute and the CPU's optimizer step.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from zerolib.core.catalogue.devices import Device, device_at
from zerolib.core.catalogue.models import TransformerConfig, parameter_count
from zerolib.core.catalogue.nodes import NODES, Interconnect, bus_bandwidth, interconnect, with_fabric
from zerolib.core.defaults import DEFAULT_HOST_LINK, DEFAULT_MFU, DEFAULT_TOKENS_PER_GPU
from zerolib.core.inputs import MAX_BYTES, check_count, check_stages
from zerolib.core.memory.accounting import STAGES, Layout, get_layout, state_bytes
from zerolib.core.run import Cluster, Run
from zerolib.core.step.engines import (
    CONTEXT_PARALLEL_ENGINES,
    Engine,
    Overlap,
    check_engine_stage,
    get_engine,
)

if TYPE_CHECKING:
    from zerolib.core.memory.placement import Placement
    from zerolib.core.memory.working_set import WorkingSetSettings
    from zerolib.core.step.time import ComputeSettings

# A model's working set, the step's arithmetic (traffic, time, the parallel step model), the
# experts' and the placement's are imported where a run has an architecture, a link, experts or
# a placement: a bare count's answer, what `zerolib estimate --params 7B --gpus 64` asks,
# starts without them.

# The traffic options of a run and their defaults (each needs a link).
TRAFFIC_DEFAULTS = {"qwz": False, "qgz": False, "host_link": DEFAULT_HOST_LINK,
                    "host": None, "cpu_adam_rate": None, "micro_batches": 1, "overlap": None}


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
    run: Run | None = None             # the run this answers for

    def as_dict(self) -> dict:
        out = {"params": self.params, "gpus": self.gpus, "layout": self.layout.as_dict(),
               "device": self.device.as_dict() if self.device else None,
               "stages": [dict(row) for row in self.stages]}
        if self.engine is not None:   # whose stages, validity rules and schedule
            out["engine"] = self.engine.name
        if self.interconnect is not None:
            out.update(micro_batches=self.micro_batches, overlap=self.overlap.as_dict())
        if self.device is not None:   # what "fits" judges: never one judgement for another
            judged = self.settings.convention.judges if self.model is not None else "model state"
            out["fits_judges"] = judged + (" and host memory" if self.host_memory is not None else "")
        if self.model is not None:
            from zerolib.core.step.context_parallel_traffic import assumptions
            out.update(model=self.model.name, tensor_parallel=self.settings.tensor_parallel,
                       pipeline_parallel=self.settings.pipeline_parallel,
                       working_set_settings=self.settings.as_dict())
            out.update(assumptions(self.model, self.gpus, self.settings))   # CP and ZeRO-R
        if self.placement is not None:
            from zerolib.core.memory.placement import gpus_on_node
            on_node = int(gpus_on_node(self.gpus, self.placement.gpus_per_node))
            out.update(placement={**self.placement.as_dict(), "gpus_per_node": on_node},
                       host_memory=self.host_memory)
        if self.interconnect is not None:
            out.update(interconnect={**self.interconnect.as_dict(), "bus_bandwidth": int(
                           bus_bandwidth(self.interconnect, self.gpus))},
                       compute_settings=self.compute.as_dict())
        return out


def _fill_whole_nodes(gpus: int, ic: Interconnect, gpus_per_node: int | None) -> None:
    """A node size asked for must tile the GPUs (or hold them all), as everywhere else
    (:func:`~zerolib.core.memory.placement.gpus_on_node`): 12 GPUs on nodes of 8 are no cluster."""
    if gpus_per_node is not None and ic.gpus_per_node is not None:
        from zerolib.core.memory.placement import gpus_on_node
        gpus_on_node(gpus, ic.gpus_per_node)


DEFAULT_CLUSTER = Cluster()


def _interconnect_of(cluster: Cluster, link, gpus_per_node) -> Interconnect:
    """The interconnect ``link`` names, at the cluster's link efficiency, on its rail fabric."""
    return with_fabric(interconnect(link, gpus_per_node, cluster.link_efficiency), cluster.leaf_nodes,
                       cluster.oversubscription)


def _with_communication(result: Estimate, what, link, gpus_per_node, compute,
                        traffic_options: dict, engine: Engine, cluster: Cluster = DEFAULT_CLUSTER) -> Estimate:
    """``result`` (made with ``engine``, no link) with a ``communication`` object in every stage
    row (see the module doc)."""
    if link is None:
        if gpus_per_node is not None:
            raise ValueError("gpus_per_node needs a link")
        for name in ("link_efficiency", "leaf_nodes"):
            if getattr(cluster, name) is not None:
                raise ValueError(f"{name} needs a link")
        if cluster.oversubscription != 1:
            raise ValueError("oversubscription needs a link")
        used = [name for name, value in traffic_options.items()
                if value != TRAFFIC_DEFAULTS[name]]
        if used:
            raise ValueError(f"{used[0]} needs a link")
        return result
    from zerolib.core.step.offload_traffic import host_settings_for
    from zerolib.core.step.tables import communication_rows, step_traffic
    ic = _interconnect_of(cluster, link, gpus_per_node)
    _fill_whole_nodes(result.gpus, ic, gpus_per_node)
    stages = [row["stage"] for row in result.stages]
    options = dict(traffic_options)
    overlap = options["overlap"]
    if overlap is not None and not isinstance(overlap, Overlap):
        raise TypeError(f"overlap must be an Overlap or None, got {type(overlap).__name__}")
    host = host_settings_for(ic.name, options.pop("host"), options.pop("cpu_adam_rate"),
                             options.pop("host_link"))
    from zerolib.core.memory.placement import check_placement
    placement = replace(check_placement(result.placement), qwz=options["qwz"], qgz=options["qgz"])
    traffic = step_traffic(what, result.gpus, stages, result.layout, ic, placement, engine,
                           options["micro_batches"])
    rows = communication_rows(traffic, ic, result.device, compute, result.placement, host,
                              options["overlap"])
    by_stage = dict(zip(sorted(stages), rows))
    with_rows = tuple({**row, "communication": {
        **by_stage[row["stage"]], "qwz": traffic_options["qwz"], "qgz": traffic_options["qgz"]}}
        for row in result.stages)
    return replace(result, stages=with_rows, interconnect=ic, compute=compute, engine=engine,
                   micro_batches=traffic_options["micro_batches"],
                   overlap=engine.overlap if overlap is None else overlap)


def _engine_stages(run: Run, engine: Engine, placement: Placement | None) -> tuple[int, ...]:
    """The stages to answer for: the run's, each of which the engine must offer; or (None) every
    stage the engine offers that the run can use: with a shard group smaller than every GPU,
    stage 0 and those the engine shards in groups; with a pipeline, those it runs beside one;
    with offload, those that offer it; with ZeRO++'s qwZ or qgZ, stage 3."""
    gpus, p = run.cluster.gpus, run.parallel.pipeline
    if run.trainer.stages is not None:
        stages = check_stages(run.trainer.stages)
        for stage in stages:
            if stage not in engine.stages:
                raise ValueError(f"engine {engine.name} offers ZeRO stages "
                                 f"{', '.join(map(str, engine.stages))}, got stage {stage}")
        return stages
    if run.trainer.qwz or run.trainer.qgz:
        return (3,)
    if placement is None:
        offered = STAGES
    else:
        from zerolib.core.memory.placement import offered_stages
        offered = offered_stages(placement)
    grouped = (placement is not None and placement.shard_group is not None
               and 1 < placement.shard_group < gpus)
    kept = tuple(s for s in offered if s in engine.stages
                 and (not grouped or s == 0 or s in engine.group_stages)
                 and (p == 1 or s in engine.pipeline_stages))
    return kept or tuple(offered)


def _with_experts(result: Estimate, expert_parallel: int, expert_tensor_parallel: int | None,
                  micro_batches: int | None) -> Estimate:
    """``result`` with expert parallelism: each row's model state recounted with the routed
    experts sharded over the expert-data-parallel group
    (:func:`zerolib.core.memory.expert_parallel.expert_model_state`) at the pipeline stage whose
    model state plus working set (:func:`zerolib.core.memory.working_set.working_set` there) is
    the largest, which can differ from the stage without expert parallelism (the first stage's
    embedding outweighs its experts once they are spread); ``peak`` and ``fits`` follow, and
    ``expert_parallel`` (what was assumed, both parts) and ``expert_traffic``
    (:func:`zerolib.core.step.expert_parallel_traffic.expert_traffic`: the all-to-alls per step on
    that stage) are added. The working set is the one zerolib computes for the stage: under
    uniform routing a GPU's experts hold as many token rows as without expert parallelism (at
    ETP other than t, the rows its ETP ranks gather: the settings carry ETP)."""
    from zerolib.core.memory.expert_parallel import check_expert_layout, stage_parameters, state_of
    from zerolib.core.memory.model_parallel import candidate_stages
    from zerolib.core.memory.working_set import working_set
    from zerolib.core.step.expert_parallel_traffic import expert_traffic
    s, config = result.settings, result.model
    t, p = s.tensor_parallel, s.pipeline_parallel
    if result.gpus % (t * p):
        raise ValueError(f"gpus must be a multiple of tensor_parallel x pipeline_parallel "
                         f"({t} x {p}), got {result.gpus}")
    d = result.gpus // (t * p)
    lay = check_expert_layout(config, t, p, d, expert_parallel, expert_tensor_parallel)
    # each pipeline stage's parameters once; the ZeRO stage changes only how they are sharded
    held = {int(r): stage_parameters(config, lay, int(r), schedule=s.pipeline_schedule,
                                     chunks=s.pipeline_chunks)
            for r in sorted({int(r) for r in candidate_stages(config, p)})}
    rows = []
    for row in result.stages:
        best = None
        for r, params in held.items():
            state = state_of(lay, params, row["stage"], result.layout)
            terms = working_set(config, row["stage"], s, result.layout, pipeline_stage=r)
            peak = state.total + sum(terms.values())
            if best is None or peak > best[0]:
                best = (peak, r, state, terms)
        peak, r, state, terms = best
        traffic = expert_traffic(config, s.seq_len, s.micro_batch, expert_parallel, tensor_parallel=t,
                                 moe_layers=state.parameters.expert_layers,
                                 micro_batches=micro_batches or p,   # None: enough to fill the pipeline
                                 options=replace(s.activation_options,
                                                 expert_tensor_parallel=lay.expert_tensor_parallel))
        new = {name: state.category(name) for name in ("parameters", "gradients", "optimizer")}
        fits = None if result.device is None else bool(peak <= result.device.capacity)
        rows.append({**row, "pipeline_stage": r, **new, "total": state.total,
                     "cluster_total": state.total * result.gpus, "working_set": dict(terms),
                     "peak": peak, "fits": fits, "expert_parallel": state.as_dict(),
                     "expert_traffic": traffic.as_dict()})
    return replace(result, stages=tuple(rows))


def _with_parallel_step(result: Estimate, run: Run, micro_batches: int) -> Estimate:
    """``result`` timed by the planner's step model
    (:func:`zerolib.core.step.parallel.parallel_step_time`, ring attention over C, the experts'
    all-to-alls and their own gradient group) where tensor, pipeline, context or expert
    parallelism is set (t, p, C or E above 1, or an ETP given): each
    row gains ``parallel_step`` (``parts``: seconds of each part of
    :data:`zerolib.core.step.parallel.PARTS`, ``step_seconds``, ``network_wait_fraction``,
    ``bubble_fraction``, ``context_parallel``, ``expert_parallel``,
    ``expert_tensor_parallel``; ETP other than t adds its all-gathers and reduce-scatters and
    reduces the experts over t x d / (ETP x E)), the same numbers
    ``zerolib plan`` gives the configuration (a shard group and offload to CPU memory included,
    as the planner searches them). Needs a device; not with ZeRO++ (hpZ, qwZ, qgZ), NVMe offload
    or ``tokens_per_gpu`` (the step's tokens are seq_len / C x micro_batch x micro_batches;
    beside a pipeline, micro_batches are the run's, p when not given)."""
    from zerolib.core.memory import expert_parallel_rules as ep_rules
    from zerolib.core.memory.activations import context_parallel_tokens
    from zerolib.core.step.offload_traffic import host_settings_for
    from zerolib.core.step.parallel import ParallelSettings, parallel_step_time
    from zerolib.core.step.time import ComputeSettings
    engine, mfu = get_engine(run.trainer.engine), run.trainer.mfu
    expert_parallel, expert_tensor_parallel = run.parallel.expert, run.parallel.expert_tensor
    overlap = run.trainer.overlap
    options = {key: value for key, value in _traffic_options(run).items()
               if key not in ("micro_batches", "overlap")}
    tokens_per_gpu = run.batch.tokens_per_gpu
    s, config = result.settings, result.model
    c = s.context_parallel
    if result.device is None:
        raise ValueError("a link with model parallelism (tensor, pipeline, context or expert) "
                         "needs a device (the step model times compute beside the collectives)")
    used = [name for name in ("qwz", "qgz") if options[name]]
    if tokens_per_gpu is not None:
        used.insert(0, "tokens_per_gpu")
    placement = result.placement
    offload = "none"
    if placement is not None:   # the planner's: a shard group, offload to CPU memory
        if placement.hpz_partition > 1 or "nvme" in (placement.offload_optimizer,
                                                     placement.offload_params):
            used.insert(0, "ZeRO++'s hpZ or NVMe offload")
        offload = {(): "none", ("optimizer",): "optimizer",
                   ("optimizer", "parameters"): "optimizer+parameters"}.get(tuple(
                       name for name, where in (("optimizer", placement.offload_optimizer),
                                                ("parameters", placement.offload_params))
                       if where == "cpu"), "none")
    if placement is None or offload == "none":
        used += [name for name in ("host", "cpu_adam_rate") if options[name] is not None]
    if used:
        raise ValueError(f"{used[0]} is not modelled with model parallelism (tensor, pipeline, "
                         "context or expert) and a link (the planner's step model times them)")
    # The planner's engine rules (plan_settings, expert_parallel_rules): only these layouts
    # are ones plan would time.
    if c > 1 and not engine.context_parallel:
        raise ValueError(f"engine {engine.name} runs no ring-attention context parallelism (the "
                         f"engines that do: {', '.join(CONTEXT_PARALLEL_ENGINES)})")
    # (DeepSpeed-MoE's E | d is E | d x C here: it runs no context parallelism)
    if engine.name in ep_rules.BORROWS_CONTEXT and expert_parallel > 1 and expert_parallel % c:
        raise ValueError(f"engine {engine.name} spreads experts over the whole context-parallel "
                         f"group: context_parallel ({c}) must divide expert_parallel, got {expert_parallel}")
    gpus_per_node = _node_gpus(run, None)
    ic = _interconnect_of(run.cluster, run.cluster.link, gpus_per_node)
    _fill_whole_nodes(result.gpus, ic, gpus_per_node)
    stages = [row["stage"] for row in result.stages]
    settings = ParallelSettings(
        seq_len=s.seq_len, micro_batch=s.micro_batch, tensor_parallel=s.tensor_parallel,
        pipeline_parallel=s.pipeline_parallel,
        data_parallel=result.gpus // (s.tensor_parallel * s.pipeline_parallel), stage=stages,
        micro_batches=micro_batches, chunks=s.pipeline_chunks,
        sequence_parallel=s.sequence_parallel, recompute=s.recompute, layout=result.layout,
        mfu=mfu, element_bytes=s.element_bytes, host_link=options["host_link"],
        shard_group=None if placement is None else placement.shard_group, offload=offload,
        host=None if offload == "none" else host_settings_for(ic.name, options["host"],
                                                               options["cpu_adam_rate"]),
        context_parallel=c, expert_parallel=expert_parallel, capacity_factor=s.capacity_factor,
        expert_tensor_parallel=expert_tensor_parallel, engine=engine, overlap=overlap,
        partition_activations=s.partition_activations, cpu_checkpointing=s.cpu_checkpointing,
        flash_attention=s.flash_attention,
        first_layers=0 if s.pipeline_layers is None else s.pipeline_layers[0],
        last_layers=0 if s.pipeline_layers is None else s.pipeline_layers[1])
    times = parallel_step_time(config, ic, result.device, settings)
    rows = tuple({**row, "parallel_step": {
        "parts": {part: float(seconds[i]) for part, seconds in times.parts.items()},
        "step_seconds": float(times.step_seconds[i]),
        "network_wait_fraction": float(times.network_wait_fraction[i]),
        "bubble_fraction": float(times.bubble_fraction[i]),
        "context_parallel": c, "expert_parallel": expert_parallel,
        "expert_tensor_parallel": (s.tensor_parallel if expert_tensor_parallel is None
                                   else expert_tensor_parallel)}}
        for i, row in enumerate(result.stages))
    tokens = context_parallel_tokens(s.seq_len, c) * s.micro_batch * micro_batches
    return replace(result, stages=rows, interconnect=ic,
                   compute=ComputeSettings.for_run(config, s, mfu, tokens), engine=engine,
                   micro_batches=micro_batches, overlap=engine.overlap if overlap is None else overlap)


def _compute(tokens_per_gpu, mfu) -> ComputeSettings:
    """The compute settings (checked when made); the defaults' object is made once."""
    from zerolib.core.step.time import DEFAULT_COMPUTE, ComputeSettings
    if tokens_per_gpu is DEFAULT_TOKENS_PER_GPU and mfu is DEFAULT_MFU:
        return DEFAULT_COMPUTE
    return ComputeSettings(tokens_per_gpu, mfu)


def _host_memory(host_memory, placement) -> int | None:
    if host_memory is None:
        return None
    if placement is None:
        raise ValueError("host_memory needs a placement (it judges the CPU memory offload uses)")
    return check_count(host_memory, "host_memory", MAX_BYTES)


def estimate(run: Run | str | TransformerConfig | int, gpus: int | None = None,
             **fields) -> Estimate:
    """The answer for one :class:`~zerolib.core.run.Run`: bytes per GPU for each of its ZeRO
    stages; with an architecture, the working set and the peak judged against the device; with
    a link, what each GPU communicates and the step time (see the module doc).

    The short form builds the run: ``estimate(7e9, 64)``, ``estimate("llama-2-7b", 8,
    device="h100-80gb", micro_batch=2)`` is ``estimate(Run.of(model, gpus, **fields))``, the
    fields by their flat names (:data:`zerolib.core.run.FIELDS`)."""
    if isinstance(run, Run):
        if gpus is not None or fields:
            raise TypeError("give a Run, or a model with gpus and fields, not both")
    else:
        run = Run.of(run, gpus, **fields)
    return _estimate_count(run) if run.config is None else _estimate_model(run)


def _traffic_options(run: Run) -> dict:
    t, c = run.trainer, run.cluster
    return {"qwz": t.qwz, "qgz": t.qgz, "host_link": c.host_link, "host": c.host,
            "cpu_adam_rate": c.cpu_adam_rate, "micro_batches": run.batch.micro_batches or 1,
            "overlap": t.overlap}


def _node_gpus(run: Run, placement: Placement | None) -> int | None:
    """The GPUs per node the link's node model takes: ``cluster.gpus_per_node`` when the link is
    a node, or a plain link with no placement to use it (which the link then refuses)."""
    c = run.cluster
    if c.gpus_per_node is None or c.link is None:   # (a cluster's node size, unused without a link)
        return None
    if placement is not None and c.link.strip().lower() not in NODES:
        return None
    return c.gpus_per_node


def _device(run: Run) -> Device | None:
    c = run.cluster
    if c.device is None or isinstance(c.device, Device):
        return c.device
    return device_at(c.device, c.capacity)


def _estimate_count(run: Run) -> Estimate:
    """A bare parameter count: model state per stage (the seed's worksheet), its placement and,
    with a link, its communication."""
    params, gpus, t, c = run.model, run.cluster.gpus, run.trainer, run.cluster
    if run.parallel.model_parallel != 1 or run.parallel.expert != 1 or \
            run.parallel.expert_tensor is not None:
        raise ValueError("tensor, pipeline, context and expert parallelism need a model "
                         "(a bare parameter count has no architecture)")
    layout, device, engine = get_layout(t.layout_of), _device(run), get_engine(t.engine)
    placement = run.placement()
    stages = _engine_stages(run, engine, placement)
    host_memory = _host_memory(c.host_memory, placement)
    tokens = DEFAULT_TOKENS_PER_GPU if run.batch.tokens_per_gpu is None else run.batch.tokens_per_gpu
    # compute settings time a link's step; a bare answer needs none
    compute = None if c.link is None else _compute(tokens, t.mfu if t.mfu != DEFAULT_MFU
                                                   else DEFAULT_MFU)
    if placement is None:   # Python ints, no arrays: one answer in microseconds
        capacity = None if device is None else device.capacity
        rows = [{"stage": stage, **state_bytes(params, gpus, stage, layout)} for stage in stages]
        for row in rows:
            row["fits"] = None if capacity is None else row["total"] <= capacity
        result = Estimate(params, gpus, layout, device, tuple(rows), host_memory=host_memory,
                          engine=engine, run=run)
        return _with_communication(result, params, c.link, _node_gpus(run, placement), compute,
                                   _traffic_options(run), engine, c)
    from zerolib.core.memory.placement import check_placement, place
    tiers = place(params, gpus, stages, layout, check_placement(placement))
    columns = {**tiers.gpu_categories(), "total": tiers.gpu}
    rows = []
    for index, stage in enumerate(stages):
        row = {"stage": stage, **{name: int(values[index]) for name, values in columns.items()}}
        row["cluster_total"] = row["total"] * gpus   # Python ints: exact
        row["fits"] = None if device is None else row["total"] <= device.capacity
        row["tiers"] = tiers.as_dict(index)
        if host_memory is not None:
            row["host_fits"] = row["tiers"]["cpu"]["per_node"] <= host_memory
            if row["fits"] is not None:
                row["fits"] = row["fits"] and row["host_fits"]
        rows.append(row)
    result = Estimate(params, gpus, layout, device, tuple(rows), placement=placement,
                      host_memory=host_memory, engine=engine, run=run)
    return _with_communication(result, params, c.link, _node_gpus(run, placement), compute,
                               _traffic_options(run), engine, c)


def _estimate_model(run: Run) -> Estimate:
    """An architecture: persistent state and working set per stage, ``fits`` judged on the peak
    (see :func:`zerolib.core.memory.working_set.stage_rows`). With a link, each stage's
    communication, per layer for stage 3; the step's tokens default to the sequence length x
    micro-batch x micro-batches, and the recompute setting chooses the FLOPs
    (:meth:`zerolib.core.step.time.ComputeSettings.for_run`). The engine decides which stages
    exist and which run beside a pipeline (the planner's rule), and the schedule. Expert
    parallelism E (and ETP) spreads a mixture of experts' routed experts (:func:`_with_experts`;
    not with a placement). With a link and model parallelism (tensor, pipeline, context or
    expert) the step is timed by the planner's step model (:func:`_with_parallel_step`)."""
    from zerolib.core.memory.model_parallel import check_parallel
    from zerolib.core.memory.working_set import check_peak_inputs, rows_of
    from zerolib.core.step.time import ComputeSettings
    config, gpus, t, c, par = run.config, run.cluster.gpus, run.trainer, run.cluster, run.parallel
    layout, device, engine = get_layout(t.layout_of), _device(run), get_engine(t.engine)
    placement = run.placement()
    host_memory = _host_memory(c.host_memory, placement)
    stages = _engine_stages(run, engine, placement)
    settings = run.working_set_settings()
    # The planner's rule, the engine's: a stage it does not run beside a pipeline is refused.
    if engine.pipeline_stages == (0, 1):   # DeepSpeed's rule, in its words
        check_parallel(config, 1, settings.pipeline_parallel, stage=stages)
    check_engine_stage(engine, stages, settings.pipeline_parallel)
    expert_parallel, expert_tensor_parallel = par.expert, par.expert_tensor
    # Checked once here; the rows beneath trust them.
    rows = rows_of(check_peak_inputs(config, gpus, stages, settings, layout, placement), device,
                   host_memory)
    result = Estimate(parameter_count(config), gpus, layout, device, tuple(rows), config, settings,
                      placement, host_memory, engine=engine, run=run)
    m = run.batch.micro_batches or 1
    p = settings.pipeline_parallel
    if c.link is not None and p > 1:
        m = settings.micro_batches or p   # a pipeline's micro-batches: None fills it
    if expert_parallel != 1 or expert_tensor_parallel is not None:
        from zerolib.core.memory.trainer_peak import summed
        if not summed(settings.convention):   # the planner's rule too (plan_settings)
            raise ValueError(f"expert_parallel is not modelled under engine {engine.name}'s "
                             f"memory convention yet: the experts' spread is counted with the "
                             f"chapter's sum, not the engine's moments and reserved peak")
        if placement is not None:
            raise ValueError("expert_parallel is not modelled with a placement here: the shard "
                             "groups and offload assume one data-parallel group for all model "
                             "state")
        # the experts' traffic per step: the step's micro-batches where a link times it
        result = _with_experts(result, expert_parallel, expert_tensor_parallel,
                               m if c.link is not None else settings.micro_batches)
    if c.link is not None and (settings.tensor_parallel != 1 or p != 1
                               or settings.context_parallel != 1 or expert_parallel != 1
                               or expert_tensor_parallel is not None):
        return _with_parallel_step(result, run, m)
    tokens = (settings.seq_len * settings.micro_batch * m if run.batch.tokens_per_gpu is None
              else run.batch.tokens_per_gpu)
    # without a link the micro-batches are the pipeline's alone (the working set's)
    return _with_communication(result, config, c.link, _node_gpus(run, placement),
                               ComputeSettings.for_run(config, settings, t.mfu, tokens),
                               {**_traffic_options(run), "micro_batches": m if c.link else 1},
                               engine, c)
