"""What :func:`zerolib.core.planner.plan` is asked: its settings, checked once at the door
(:func:`plan_settings`), and the links a device is planned on when none are named."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

from zerolib.core.catalogue.devices import DEVICES, Device, device_at, get_device
from zerolib.core.catalogue.links import Link
from zerolib.core.catalogue.models import TransformerConfig
from zerolib.core.catalogue.nodes import NODES, Interconnect, with_fabric
from zerolib.core.inputs import (
    check_positive_int,
    check_sequence,
    echo,
)
from zerolib.core.memory import context_parallel as cp_rules
from zerolib.core.memory import expert_parallel_rules as ep_rules
from zerolib.core.memory.accounting import STAGES, Layout, get_layout
from zerolib.core.memory.activations import CHAPTER_RECOMPUTE, RECOMPUTE
from zerolib.core.memory.model_parallel import (
    ALL_CHUNKS,
    MAX_CHUNKS,
    check_first_last,
)
from zerolib.core.memory.trainer_peak import summed
from zerolib.core.memory.working_set import MAX_MICRO_BATCH, WorkingSetSettings
from zerolib.core.run import Run
from zerolib.core.step.engines import (
    CONTEXT_PARALLEL_ENGINES,
    DEFAULT_ENGINE,
    Engine,
    Overlap,
    check_overlap,
    get_engine,
)
from zerolib.core.step.offload_traffic import DEFAULT_HOST_SETTINGS, HostSettings, host_settings_for
from zerolib.core.step.parallel import (
    OFFLOADS,
    check_host_link,
    cluster_interconnect,
)

if TYPE_CHECKING:  # pandas is imported where a frame is built: commands that build none start without it
    pass

SCHEDULE_NAMES = {1: "1F1B"}      # v > 1: "interleaved, v chunks"
# Shard groups a plan tries under stages 1-3: every divisor G of d, or only G = d (the paper's ZeRO).
SHARD_GROUPS = ("all", "whole")


# The node a device usually comes in, for plans that name no links: each catalogue entry says
# (Device.node), so a device added to the catalogue is planned with no edit here.
DEFAULT_LINKS: Mapping[str, str] = MappingProxyType({
    device.name: device.node for device in DEVICES.values() if device.node is not None})


# ZeRO-R's activation options a plan can search (Rajbhandari et al. SC20 Sec. VI-A): (P_a,
# P_a+cpu) as DeepSpeed's activation_checkpointing sets partition_activations, cpu_checkpointing.
ZERO_R: Mapping[str, tuple[bool, bool]] = MappingProxyType({
    "none": (False, False), "partition": (True, False), "partition+cpu": (True, True)})
# The recomputations a plan searches when none are named: the chapter's three, or an engine's
# own policies (torchtitan's train configs: op-level selective or full checkpointing,
# torchtitan/config/job_config.py ActivationCheckpoint.mode, "selective" with
# selective_ac_option "op"; Korthikanti's selective is not torchtitan's).
ENGINE_RECOMPUTE: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "torchtitan": ("none", "op-selective", "full")})

# Engines that offer ZeRO-R, whose plans search P_a by default: DeepSpeed has it (and the paper
# describes it); Megatron-LM and FSDP2 have no partitioned checkpoints.
ZERO_R_ENGINES = ("paper", "deepspeed")

MAX_PLAN_MICRO_BATCH = 1024  # largest micro-batch a plan enumerates up to


def links_for(device: str | Device, links=None) -> str | Interconnect:
    """``links`` as given, or the node ``device`` usually comes in (:data:`DEFAULT_LINKS`)."""
    if links is not None:
        return links
    device = get_device(device)
    if device.node is None:
        raise ValueError(f"links must be given for {device.name} (no usual node for it): a node "
                         f"such as dgx-h100, or two links like pcie4-x16,roce-100g")
    return device.node


def schedule_name(chunks: int) -> str:
    return SCHEDULE_NAMES.get(int(chunks), f"interleaved, {int(chunks)} chunks")


def _choices(values, allowed, name) -> tuple:
    values = check_sequence(values, name, ", ".join(map(str, allowed)))
    if not values:
        raise ValueError(f"{name} must name at least one of {', '.join(map(str, allowed))}")
    for value in values:
        # True == 1, but stages=(True,) is no stage 1 (where the choices are not booleans)
        if isinstance(value, bool) and not any(isinstance(a, bool) for a in allowed):
            raise TypeError(f"{name} must be from {', '.join(map(str, allowed))}, got "
                            f"{echo(value)} (a boolean)")
        if value not in allowed:
            raise ValueError(f"{name} must be from {', '.join(map(str, allowed))}, got {echo(value)}")
    return tuple(dict.fromkeys(values))


@dataclass(frozen=True)
class PlanSettings:
    """What :func:`plan` was asked (validated)."""

    model: TransformerConfig
    gpus: int
    gpus_per_node: int
    device: Device
    seq_len: int
    global_batch: int
    interconnect: Interconnect
    host_link: Link
    layout: Layout
    mfu: float
    host_memory: int | None
    max_micro_batch: int
    stages: tuple[int, ...]
    recompute: tuple[str, ...]
    chunks: tuple[int, ...] | str     # the schedules named, or ALL_CHUNKS
    offload: tuple[str, ...]
    sequence_parallel: tuple[bool, ...]
    shard_groups: str
    working_set: WorkingSetSettings
    host: HostSettings = DEFAULT_HOST_SETTINGS   # offload's host: the CPU step, the drives
    context_parallel: tuple[int, ...] = (1,)   # the CP degrees searched (1: none)
    engine: Engine = get_engine(DEFAULT_ENGINE)   # whose schedule and validity rules
    overlap: Overlap | None = None                # None: the engine's own overlap rule
    expert_parallel: tuple[int, ...] = (1,)   # the EP degrees searched (1: none)
    zero_r: tuple[str, ...] = ("none",)       # ZeRO-R's options searched (names of ZERO_R)
    # The ETP degrees searched besides t (None: ETP = t only; expert_parallel_rules)
    expert_tensor_parallel: tuple[int, ...] | None = None
    run: Run | None = None       # the run the plan was asked for (its fixed settings)
    # Uneven stages searched beside the even split: None, the planner's (one layer fewer on the
    # first and last stage); (FIRST, LAST) wherever it splits the layers; "even": none.
    pipeline_layers: tuple[int, int] | str | None = None

    def __deepcopy__(self, memo) -> PlanSettings:
        return self  # immutable (pandas deep-copies DataFrame.attrs, which carry it)

    def as_dict(self) -> dict:
        return {"model": self.model.name, "gpus": self.gpus, "gpus_per_node": self.gpus_per_node,
                "device": self.device.as_dict(), "seq_len": self.seq_len,
                "global_batch": self.global_batch, "links": self.interconnect.as_dict(),
                "host_link": self.host_link.as_dict(),
                "layout": self.layout.as_dict(), "mfu": self.mfu, "host_memory": self.host_memory,
                "max_micro_batch": self.max_micro_batch, "stages": list(self.stages),
                "recompute": list(self.recompute),
                "chunks": self.chunks if self.chunks == ALL_CHUNKS else list(self.chunks),
                "offload": list(self.offload), "sequence_parallel": list(self.sequence_parallel),
                "shard_groups": self.shard_groups,
                "engine": self.engine.name, "overlap": (self.overlap or self.engine.overlap).as_dict(),
                "flash_attention": self.working_set.flash_attention,
                "reserve_bytes": self.working_set.reserve_bytes,
                # what fits judges (allocated or reserved peak) and the trainer's memory settings
                "fits_judges": self.working_set.convention.judges,
                "trainer_memory": {name: value for name, value in (
                    (name, getattr(self.working_set, name)) for name in MEMORY_FIELDS)},
                "host_settings": self.host.as_dict(),
                # a mixture of experts' token buffers (None: dropless); a dense model has none
                **({"capacity_factor": self.working_set.capacity_factor} if self.model.experts else {}),
                **({"context_parallel": list(self.context_parallel)} if self.context_parallel != (1,) else {}),
                **({"expert_parallel": list(self.expert_parallel)} if self.expert_parallel != (1,) else {}),
                **({"zero_r": list(self.zero_r)} if self.zero_r != ("none",) else {}),
                **({"expert_tensor_parallel": list(self.expert_tensor_parallel)}
                   if self.expert_tensor_parallel is not None else {}),
                **({"pipeline_layers": self.pipeline_layers if isinstance(self.pipeline_layers, str)
                    else list(self.pipeline_layers)} if self.pipeline_layers is not None else {})}


@dataclass(frozen=True)
class Search:
    """What :func:`zerolib.core.planner.plan` searches beside the run's fixed settings: the ZeRO
    ``stages``, ``recompute`` settings (None: the engine's, :data:`ENGINE_RECOMPUTE`, else the
    chapter's none, selective and full), pipeline schedules (``chunks``: 1 for 1F1B, v >= 2
    interleaved, or ``"all"`` that the layers allow), ``offload`` options, sequence parallelism
    on and off, shard groups (``"all"`` divisors of d, or ``"whole"``), the context-parallel,
    expert-parallel and expert-tensor-parallel degrees (None: the engine's and the model's
    defaults: what the engine can run, context parallelism up to 16 where it runs ring
    attention, :func:`zerolib.core.memory.context_parallel.default_degrees`), ZeRO-R's
    options (None: the engine's default) and micro-batches up to ``max_micro_batch``. Checked
    by :func:`plan_settings`, which knows the model and engine."""

    stages: tuple = STAGES
    recompute: tuple | None = None
    chunks: tuple | str = ALL_CHUNKS
    offload: tuple = tuple(OFFLOADS)
    sequence_parallel: tuple = (False, True)
    shard_groups: str = "all"
    context_parallel: tuple | None = None
    expert_parallel: tuple | None = None
    expert_tensor_parallel: tuple | None = None
    zero_r: tuple | None = None
    max_micro_batch: int = 8
    pipeline_layers: tuple | str | None = None


# The trainer's memory settings a plan carries (zerolib.core.memory.trainer_memory), engine aside
MEMORY_FIELDS = ("norms", "fp8", "fp8_all_gather", "compile", "recompute_method",
                 "recompute_layers", "loss", "loss_chunks", "logits_freed", "reserved_ppm",
                 "reshard_after_forward")
SEARCH_FIELDS = tuple(f.name for f in fields(Search))
# The short form's options that name a run field by another name
_RUN_ALIASES = {"links": "link"}


def plan_request(run, gpus=None, gpus_per_node=None, device=None, seq_len=None,
                 global_batch=None, *, search: Search | None = None, **options) -> tuple[Run, Search]:
    """The run and the search a plan is asked for: ``(run, search)`` as given, or built from the
    short form ``(model, gpus, gpus_per_node, device, seq_len, global_batch, **options)``, whose
    options are a run's fields (:data:`zerolib.core.run.FIELDS`; ``links`` is the run's
    ``link``) and the search's (:class:`Search`)."""
    if search is not None and not isinstance(search, Search):
        raise TypeError(f"search must be a Search, got {type(search).__name__}")
    if isinstance(run, Run):
        if options or any(v is not None for v in (gpus, gpus_per_node, device, seq_len, global_batch)):
            raise TypeError("give a Run and a Search, or a model with the plan's settings, not both")
        return run, search or Search()
    searched = {name: options.pop(name) for name in SEARCH_FIELDS if name in options}
    if searched and search is not None:
        raise TypeError("give a Search or its fields, not both")
    for alias, name in _RUN_ALIASES.items():
        if alias in options:
            options[name] = options.pop(alias)
    if options.get("recompute_method", "uniform") != "uniform" or options.get("recompute_layers", 1) != 1:
        options["recompute"] = "full"   # the method's own (the rows that recompute fully read it)
    given = {name: value for name, value in (("gpus_per_node", gpus_per_node), ("device", device),
                                             ("seq_len", seq_len), ("global_batch", global_batch))
             if value is not None}
    return Run.of(run, gpus, **given, **options), search or _search(searched)


def _search(fields_by_name: dict) -> Search:
    return Search(**fields_by_name)


def plan_settings(run, gpus=None, gpus_per_node=None, device=None, seq_len=None,
                  global_batch=None, *, search: Search | None = None, **options) -> PlanSettings:
    """Check every input of :func:`plan` (ValueError/TypeError naming it): a run and a search,
    or the short form (:func:`plan_request`). The run fixes the model, the cluster (device, GPUs
    per node, links, host), the trainer (engine, layout, mfu, flash attention, buffers, reserve,
    and its memory convention's settings as ``estimate`` honours them: fp8, fp8 all-gather,
    compile, loss, norms, Megatron-LM's recompute method and layers for the rows that recompute
    fully, the allocator's reserve) and the batch (sequence, global batch); its parallel layout,
    ZeRO stage, recomputation and micro-batch are the search's. ``host`` (None: the node of the
    links where the host catalogue has it, else DGX A100's) and ``cpu_adam_rate`` (None: the
    roofline alone) time offload's CPU step and NVMe. ``zero_r`` names the ZeRO-R options
    searched (:data:`ZERO_R`; None: "none" only, DeepSpeed's default: its
    ``activation_checkpointing`` config has ``partition_activations`` and ``cpu_checkpointing``
    false; only the engines of :data:`ZERO_R_ENGINES` offer the others). ``context_parallel``
    above 1 only for an engine that runs it (``Engine.context_parallel``: Megatron-LM, FSDP2
    with torchtitan); None (the default) searches 1, 2, 4, 8, 16 under such an engine (those
    the GPUs and the sequence's 2C chunks allow), 1 under the others.
    ``expert_tensor_parallel`` names the ETP degrees searched
    (:func:`zerolib.core.memory.expert_parallel_rules.check_etp_degrees`; None: under
    Megatron-LM every divisor of a mixture's expert width, else ETP = t only)."""
    run, search = plan_request(run, gpus, gpus_per_node, device, seq_len, global_batch,
                               search=search, **options)
    return _settings_of(run, search)


def _recompute(recompute, trainer, config: TransformerConfig) -> tuple[str, ...]:
    """The recomputations searched: those named (any of RECOMPUTE), else the engine's own;
    op-selective only where it is modelled (dense blocks with standard attention)."""
    modelled = not (config.experts or config.kv_lora_rank)
    if recompute is None:
        return tuple(r for r in ENGINE_RECOMPUTE.get(trainer.engine_name, CHAPTER_RECOMPUTE)
                     if modelled or r != "op-selective")
    named = _choices(recompute, RECOMPUTE, "recompute")
    if "op-selective" in named and not modelled:
        raise ValueError(f"recompute 'op-selective' is modelled for dense blocks with standard "
                         f"attention, got {config.name} (experts or latent attention)")
    return named


def _working_set(trainer) -> WorkingSetSettings:
    """The trainer's working-set settings; with Megatron-LM's recompute method or layers (which
    need full recomputation) they are held at recompute "full", the rows that recompute fully
    reading them (the planner's rows choose their own recomputation)."""
    method = (trainer.recompute_method, trainer.recompute_layers)
    if method == ("uniform", 1):
        return trainer.working_set()
    every = trainer.replace(recompute_method="uniform", recompute_layers=1).working_set()
    return replace(every, recompute="full", recompute_method=method[0], recompute_layers=method[1])


def _settings_of(run: Run, search: Search) -> PlanSettings:
    config = run.config
    if config is None:
        raise ValueError("a plan needs a model's architecture (a preset, a config.json or "
                         "Megatron-LM arguments), not a bare parameter count")
    c, t, b = run.cluster, run.trainer, run.batch
    convention = _working_set(t).convention
    if not summed(convention) and (search.expert_parallel not in (None, (1,), [1], 1)
                                   or search.expert_tensor_parallel is not None):
        raise ValueError(f"expert_parallel and expert_tensor_parallel are not planned under "
                         f"engine {t.engine_name}'s memory convention (estimate spreads experts "
                         f"with the chapter's count): plan its mixtures with expert_parallel (1,)")
    gpus = c.gpus
    if c.device is None:
        raise ValueError("device must be given to plan (cluster.device: what each GPU holds)")
    device = c.device if isinstance(c.device, Device) else device_at(c.device, c.capacity)
    k = c.gpus_per_node
    if k is None:   # the node's own: the run's link, or the node the device comes in
        node = NODES.get(links_for(device, c.link).strip().lower()) if isinstance(
            links_for(device, c.link), str) else None
        if node is None:
            raise ValueError("gpus_per_node must be given to plan over links that name no node")
        k = node.gpus
    if gpus > k and gpus % k:
        raise ValueError(f"gpus ({gpus}) must fill whole nodes of gpus_per_node ({k})")
    seq_len = run.seq_len
    if config.position_embedding == "learned" and seq_len > config.max_positions:
        raise ValueError(f"seq_len must be at most {config.max_positions} for {config.name} "
                         f"(learned position embeddings), got {seq_len}")
    if b.global_batch is None:
        raise ValueError("global_batch must be given to plan (batch.global_batch: sequences per step)")
    global_batch = b.global_batch
    if t.partition_activations or t.cpu_checkpointing:
        raise ValueError("working_set's partition_activations and cpu_checkpointing are the "
                         "plan's to search: give zero_r instead")
    working_set = _working_set(t)
    max_micro_batch = check_positive_int(search.max_micro_batch, "max_micro_batch",
                                         min(MAX_PLAN_MICRO_BATCH, MAX_MICRO_BATCH))
    chunks = search.chunks
    if not (isinstance(chunks, str) and chunks == ALL_CHUNKS):
        chunks = tuple(dict.fromkeys(check_positive_int(v, "chunks", MAX_CHUNKS) for v in
                                     check_sequence(chunks, "chunks", f"whole numbers, 1 (1F1B) to "
                                                    f"{MAX_CHUNKS} (interleaved), or "
                                                    f"'{ALL_CHUNKS}'")))
        if not chunks:
            raise ValueError("chunks must name at least one schedule (1: 1F1B; 2 or more: "
                             "interleaved)")
    ic = with_fabric(cluster_interconnect(links_for(device, c.link), k, c.link_efficiency), c.leaf_nodes,
                     c.oversubscription)
    engine = get_engine(t.engine)
    cp = (cp_rules.default_degrees(engine.context_parallel, seq_len, gpus, working_set.flash_attention)
          if search.context_parallel is None else
          cp_rules.check_degrees(search.context_parallel, seq_len, working_set.flash_attention))
    if cp != (1,) and not engine.context_parallel:
        raise ValueError(f"context_parallel must be (1,) for engine {engine.name}: it runs no "
                         f"ring-attention context parallelism (the engines that do: "
                         f"{', '.join(CONTEXT_PARALLEL_ENGINES)})")
    if not summed(convention):   # (1,): the experts kept whole (see the refusal above)
        search = replace(search, expert_parallel=(1,))
    zero_r = ("none",) if search.zero_r is None else search.zero_r
    zero_r = _choices(zero_r, tuple(ZERO_R), "zero_r")
    if zero_r != ("none",) and engine.name.split(" ")[0] not in ZERO_R_ENGINES:
        raise ValueError(f"zero_r must be ('none',) for engine {engine.name}: it has no partitioned "
                         f"activation checkpoints (DeepSpeed's activation_checkpointing has them)")
    return PlanSettings(
        config, gpus, k, device, seq_len, global_batch,
        ic, check_host_link(c.host_link),
        get_layout(t.layout_of), t.mfu,
        c.host_memory, max_micro_batch, _choices(search.stages, STAGES, "stages"),
        _recompute(search.recompute, t, config), chunks,
        _choices(search.offload, tuple(OFFLOADS), "offload"),
        _choices(search.sequence_parallel, (False, True), "sequence_parallel"),
        _choices([search.shard_groups], SHARD_GROUPS, "shard_groups")[0], working_set,
        host_settings_for(ic.name, c.host, c.cpu_adam_rate), cp, engine,
        check_overlap(t.overlap), ep_rules.check_degrees(search.expert_parallel, config, gpus), zero_r,
        ep_rules.check_etp_degrees(search.expert_tensor_parallel, config, gpus, engine), run,
        _pipeline_layers(search.pipeline_layers))


def _pipeline_layers(value):
    """The uneven stages searched (:attr:`PlanSettings.pipeline_layers`), checked."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "even"):
        return None if value is None else "even"
    try:
        return check_first_last(value)
    except (TypeError, ValueError):
        raise ValueError(f"pipeline_layers must be None (the planner's search), 'even' or two "
                         f"whole numbers FIRST, LAST of 1 or more, got {echo(value)}") from None


# --- the planner's helpers that need no peak ---------------------------------------------------

def zero_r_expand(s: PlanSettings, columns: Mapping[str, np.ndarray], reason: np.ndarray,
                  size: int, passes: int) -> tuple[Mapping[str, np.ndarray], np.ndarray, int]:
    """Each runnable-so-far row once per ZeRO-R option of ``s.zero_r`` that changes it (P_a:
    full recomputation, t > 1, no sequence parallelism; P_a+cpu: full recomputation), with
    ``partition_activations`` and ``cpu_checkpointing`` columns; unchanged for ("none",).
    ``passes``: the planner's reason code of a configuration that breaks no rule."""
    if s.zero_r == ("none",):
        return columns, reason, size
    live = np.flatnonzero((reason == passes) & (columns["recompute"] == RECOMPUTE.index("full")))
    splits = (columns["tensor_parallel"][live] > 1) & ~columns["sequence_parallel"][live]
    # (live rows, options): each option's effective (P_a, cpu) as a code 2 pa + cpu.
    codes = np.stack([np.full(len(live), cpu, dtype=np.int64) + 2 * (pa & splits)
                      for pa, cpu in (ZERO_R[name] for name in s.zero_r)], axis=1)
    keep = np.ones(codes.shape, dtype=bool)     # an option repeating an earlier one: dropped
    for j in range(1, codes.shape[1]):
        keep[:, j] = np.all(codes[:, :j] != codes[:, j:j + 1], axis=1)
    counts = np.ones(size, dtype=np.int64)
    counts[live] = keep.sum(axis=1)
    total = int(counts.sum())
    code = np.zeros(total, dtype=np.int64)       # the other rows: none
    starts = np.cumsum(counts) - counts
    ranks = np.cumsum(keep, axis=1) - 1
    for j in range(codes.shape[1]):    # option j of a live row sits at its start + its rank
        at = keep[:, j]
        code[starts[live[at]] + ranks[at, j]] = codes[at, j]
    out = {name: np.repeat(values, counts) for name, values in columns.items()}
    out["partition_activations"], out["cpu_checkpointing"] = code >= 2, (code % 2) == 1
    return MappingProxyType(out), np.repeat(reason, counts), total


def describe_configuration(c) -> str:
    """One configuration in words: ``'t 8 + SP x p 4 (1F1B) x d 2, ZeRO-1 over 2, selective
    recomputation, micro-batch 1 x 512, no offload'``."""
    t, p, d = int(c["tensor_parallel"]), int(c["pipeline_parallel"]), int(c["data_parallel"])
    sp = " + SP" if bool(c["sequence_parallel"]) else ""
    sp += f" x C {cp}" if (cp := int(c.get("context_parallel", 1))) > 1 else ""
    sp += f" x E {e}" if (e := int(c.get("expert_parallel", 1))) > 1 else ""
    sp += f" (ETP {k})" if (k := int(c.get("expert_tensor_parallel", t))) != t else ""
    stage, group = int(c["stage"]), int(c["shard_group"])
    zero = "no ZeRO" if stage == 0 else f"ZeRO-{stage}" + (f" over {group}" if group != d * cp else "")
    offload = {"none": "no offload", "optimizer": "optimizer on CPU",
               "optimizer+parameters": "optimizer and parameters on CPU"}[str(c["offload"])]
    recompute = "no" if str(c["recompute"]) == "none" else str(c["recompute"])
    zero_r = {(True, True): " with P_a+cpu", (True, False): " with P_a",
              (False, True): " with checkpoints on the CPU"}.get(
        (bool(c.get("partition_activations", False)), bool(c.get("cpu_checkpointing", False))), "")
    split = ""
    if (first := int(c.get("first_layers", 0))) > 0:
        split = f"; first and last stages {first} and {int(c['last_layers'])} layers"
    return (f"t {t}{sp} x p {p} ({schedule_name(int(c['chunks']))}{split}) x d {d}, {zero}, "
            f"{recompute} recomputation{zero_r}, micro-batch {int(c['micro_batch'])} x "
            f"{int(c['micro_batches'])}, {offload}")
