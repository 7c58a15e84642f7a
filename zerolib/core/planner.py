"""The planner: every way to run a model on a cluster, which of them fit, and which is fastest.

For a model, N GPUs in nodes of K, a device, a sequence length and a global batch of B
sequences, :func:`plan` enumerates every configuration

    tensor-parallel t x pipeline-parallel p x data-parallel d = N (t, p from the divisors),
    sequence parallelism (t > 1), pipeline schedule (1F1B, or v model chunks interleaved: by
    default every v >= 2 with p x v dividing the layers, :data:`ALL_CHUNKS`),
    micro-batch b (1 to ``max_micro_batch``), recomputation (none, selective, full),
    ZeRO stage, shard group G (a divisor of d; stages 1-3), offload (DeepSpeed's menu),
    and, where asked, each context-parallel degree C (under an engine that runs ring attention,
    Megatron-LM or FSDP2: ``Engine.context_parallel``) and, for a mixture of experts, each
    expert-parallel degree E (:mod:`zerolib.core.memory.expert_parallel_rules`: by default every
    divisor of the routed experts; the experts' state over d x C / E, their all-to-alls timed)
    and, under Megatron-LM, each expert-tensor-parallel degree ETP it accepts
    (:func:`zerolib.core.memory.expert_parallel_rules.expand_etp`),
    and ZeRO-R's options (``zero_r``, :data:`zerolib.core.plan_settings.ZERO_R`) where they
    change something: P_a under full recomputation with t > 1 and no sequence parallelism (its
    checkpoints at 1 / t, one all-gather of each per layer and micro-batch), P_a+cpu under full
    recomputation (no checkpoint on the GPU, its copies on the host link). By default the
    engines that offer it (DeepSpeed, the paper) search P_a beside none, the others neither;
    P_a+cpu only when asked, as its host memory is not judged,

rejects what cannot run, by the first rule of :data:`RULES` it breaks (t must divide the heads,
the key/value heads and the MLP width, stay within a node and divide the sequence under sequence
parallelism; p at most the layers; the interleaved schedule's divisibility; d x b must divide B,
so each pipeline runs m = B / (d b) micro-batches per step; only the stages the engine offers and
runs beside a pipeline (DeepSpeed: stages 2-3 without pipeline parallelism); offload only with
the node's CPU memory known), computes the peak per GPU of every
configuration that can run exactly as :func:`zerolib.core.memory.working_set.peaks` does (tests check
it configuration by configuration), and the step time of each with
:func:`zerolib.core.step.parallel.parallel_step_time`: each collective on the ring it uses (a
shard group's gathers and reduce-scatters inside the group, its replicas' all-reduce across
them), offload's PCIe copies on ``host_link`` and the CPU's optimizer step on ``host``.

A configuration **fits** when its peak is at most the device's capacity and, if it offloads, the
CPU memory its node's GPUs offload into is at most ``host_memory`` (the larger of the first and
last pipeline stage's, per node). It is never reported as fitting when a term of its peak is
unknown: offloaded state with no ``host_memory`` given is a rejection of its own
(``host_unknown``); NVMe, whose capacity zerolib does not judge, is not planned. Fitting
configurations are ranked by estimated step time, ties broken by headroom (capacity - peak,
larger first), then by the order of enumeration. Offloaded configurations are ranked with the
rest on their GPU compute, collectives, PCIe copies and the CPU's optimizer step, which they add
and the others do not (:mod:`zerolib.core.step.offload_traffic`: the host's memory-bandwidth
roofline, a lower bound, or a measured ``cpu_adam_rate`` where slower).

Every array is computed once per level of the space (the (t, p) grid, then schedules and
sequence parallelism, micro-batches, recomputation, and the ZeRO variants of each data-parallel
degree) and spread over the levels below by index, so the whole space is a few dozen numpy
operations: Llama-2-70B on 1,024 GPUs, some 324,000 configurations, in well under a second
(``benchmarks/bench_planner.py``). The space and the peaks do not depend on the device, the links
or the utilisation; the last few are remembered, so changing only those re-times, not re-counts.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

from zerolib.core.inputs import (
    MAX_ARRAY_SIZE,
)
from zerolib.core.memory import context_parallel as cp_rules
from zerolib.core.memory import expert_parallel_rules as ep_rules
from zerolib.core.memory.accounting import CATEGORIES
from zerolib.core.memory.activations import RECOMPUTE
from zerolib.core.memory.conventions import JUDGES
from zerolib.core.memory.model_parallel import (
    RULES as PARALLEL_RULES,
)
from zerolib.core.memory.model_parallel import (
    ParallelGrid,
    chunks_for,
    rules_of,
)
from zerolib.core.memory.pipeline_stages import given_split, uneven_splits
from zerolib.core.memory.placement import offered_stages
from zerolib.core.memory.tables import divisors_of
from zerolib.core.plan_peaks import PEAK_KEYS, offload_placement, peaks_of
from zerolib.core.plan_settings import (  # noqa: F401  (the planner's names, where callers find them)
    DEFAULT_LINKS,
    MAX_PLAN_MICRO_BATCH,
    SCHEDULE_NAMES,
    SHARD_GROUPS,
    ZERO_R,
    PlanSettings,
    Search,
    describe_configuration,
    links_for,
    plan_settings,
    schedule_name,
    zero_r_expand,
)
from zerolib.core.run import Run
from zerolib.core.step.parallel import (
    OFFLOADS,
    PARTS,
    ParallelSettings,
    parallel_step_time,
)

if TYPE_CHECKING:  # pandas is imported where a frame is built: commands that build none start without it
    import pandas as pd

# Why a configuration cannot be run or does not fit, in the order they are checked (the first
# broken rule is the one reported).
RULES: Mapping[str, str] = MappingProxyType({
    **{name: PARALLEL_RULES[name] for name in ("heads", "kv_heads", "ffn_hidden", "node",
                                               "sequence", "layers", "interleaved_layers",
                                               "schedule")},
    "context_parallel": "context_parallel must divide gpus / (tensor_parallel x pipeline_parallel), t its s/C tokens",
    "global_batch": "data_parallel x micro_batch must divide the global batch (each pipeline "
                    "runs a whole number of micro-batches per step)",
    "micro_batches": PARALLEL_RULES["micro_batches"],
    "pipeline_zero": PARALLEL_RULES["pipeline_zero"],
    "expert_parallel": ep_rules.RULE,
    "host_unknown": "offloaded state needs the node's CPU memory (host_memory): unknown, so "
                    "never reported as fitting",
    "capacity": "the peak per GPU is above the device's capacity",
    "host_memory": "the CPU memory a node's GPUs offload into is above host_memory",
})
REASONS = tuple(RULES)
PASSES = len(REASONS)     # the reason code of a configuration that fits

# What the ranking leaves out, said wherever it is shown (the CLI's header, the notebook).
PLAN_HEADER = ("Ranked by a model, not by measurement: peaks are zerolib's exact byte counts; "
               "step times come from 6 (8 with full recomputation) FLOPs per parameter a matrix "
               "multiplies and token (the input embedding is a lookup), plus the attention core "
               "in every pass (causal with flash attention; again when recomputed), "
               "at the device's peak x mfu, the ring model of the links (each collective on the "
               "GPUs it joins), offload's copies at the host link's rate, and the pipeline "
               "schedule's bubble.")
PLAN_LEFT_OUT = (
    "kernel efficiency per shape (one mfu for every matrix, every t and micro-batch)",
    "pipeline bubbles beyond the schedule formula (p - 1)/(v m): uneven stages, warm-up "
    "effects, the middle stages' messages",
    "memory fragmentation and allocator caching beyond the fixed reserve",
    "communication overlaps beyond the stated ones (tensor-parallel and pipeline traffic are "
    "fully exposed) and contention between them on one node's links",
    "the optimizer step's own time on the GPU (offloaded, the CPU's step is timed: at its "
    "memory-bandwidth roofline, a lower bound, unless a measured CPU-Adam rate is given), and "
    "NVMe offload (not planned)",
)

MAX_SPACE = MAX_ARRAY_SIZE  # configurations in one plan: each is a row of every array

# Which kinds of parallelism a configuration combines (the chapter's figure colours them).
FAMILIES = ("data parallel only", "tensor parallel", "pipeline parallel",
            "tensor + pipeline parallel")
FIT_COLUMNS = ("tensor_parallel", "pipeline_parallel", "data_parallel", "sequence_parallel",
               "chunks", "schedule", "stage", "shard_group", "recompute", "micro_batch",
               "micro_batches", "offload", "peak_bytes", "headroom_bytes", "pipeline_stage",
               "host_bytes_per_node", "step_seconds", "compute_seconds", "tensor_seconds",
               "pipeline_seconds", "data_parallel_seconds", "bubble_seconds",
               "network_wait_fraction", "bubble_fraction", "fits", "family",
               "peak_reserved_bytes", "fits_judges")
# Columns a plan's frames hold only when their dimension is searched, after FIT_COLUMNS.
SEARCHED_COLUMNS = ("context_parallel", "expert_parallel", "expert_seconds",
                    "partition_activations", "cpu_checkpointing", "expert_tensor_parallel",
                    "first_layers", "last_layers")


# --- the space, level by level ------------------------------------------------------------------

def _expand(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(parent index, position within the parent) of the rows below parents with ``counts``."""
    parent = np.repeat(np.arange(len(counts)), counts)
    starts = np.cumsum(counts) - counts
    return parent, np.arange(len(parent)) - starts[parent]


def _zero_variants(d: int, s: PlanSettings) -> tuple[tuple[int, int, str], ...]:
    """(stage, shard group, offload) for d data-parallel GPUs: the engine's stages, those it shards
    in groups over every divisor G of d (or G = d), DeepSpeed's offloads (deepspeed, paper only)."""
    e = s.engine
    offloads = s.offload if e.zeropp else tuple(o for o in s.offload if o == "none")
    return _variants(d, tuple(st for st in s.stages if st in e.stages), offloads, s.shard_groups,
                     e.group_stages)


@lru_cache(maxsize=1024)
def _variants(d: int, stages, offloads, shard_groups, group_stages) -> tuple[tuple[int, int, str], ...]:
    out = []
    for offload in offloads:
        offered = offered_stages(offload_placement(None, offload))
        for stage in stages:
            if stage not in offered:
                continue
            every = stage in group_stages and shard_groups == "all"
            for group in (divisors_of(d)[::-1] if every else [d]):
                out.append((stage, group, offload))
    return tuple(out)


@dataclass(frozen=True)
class Space:
    """Every configuration as int64 / bool columns (one row each) and its reason code."""

    columns: Mapping[str, np.ndarray] = field(repr=False)
    reason: np.ndarray = field(repr=False)
    size: int


def enumerate_space(s: PlanSettings) -> Space:
    """Every configuration of the plan and the first rule of :data:`RULES` it breaks (only the
    rules that need no peak: ``capacity`` and ``host_memory`` come from :func:`plan`)."""
    config, n = s.model, s.gpus
    pairs = [(t, p) for t in divisors_of(n) for p in divisors_of(n // t)]
    t_a = np.array([t for t, _ in pairs], dtype=np.int64)
    p_a = np.array([p for _, p in pairs], dtype=np.int64)
    d_a = n // (t_a * p_a)

    # Schedules and sequence parallelism (the latter only with t > 1), each schedule with the
    # even split (FIRST 0) and, for a model whose layers are alike, the uneven one searched.
    splits = {p: () if config.experts or s.pipeline_layers == "even" else
              uneven_splits(config.layers, p, s.chunks) if s.pipeline_layers is None else
              given_split(config.layers, p, s.chunks, s.pipeline_layers)
              for p in set(p_a.tolist())}
    rows_b = [(i, v, sp, first, last) for i, (t, p) in enumerate(pairs)
              for v, first, last in (*((v, 0, 0) for v in chunks_for(config, p, s.chunks)),
                                     *splits[p])
              for sp in s.sequence_parallel if (t > 1 or not sp)]
    a_of_b = np.array([r[0] for r in rows_b], dtype=np.int64)
    v_b = np.array([r[1] for r in rows_b], dtype=np.int64)
    sp_b = np.array([r[2] for r in rows_b], dtype=bool)
    first_b = np.array([r[3] for r in rows_b], dtype=np.int64)
    last_b = np.array([r[4] for r in rows_b], dtype=np.int64)
    t_b, p_b, d_b = t_a[a_of_b], p_a[a_of_b], d_a[a_of_b]
    reason_b = np.full(len(rows_b), PASSES, dtype=np.int64)
    uneven = bool(np.any(first_b))
    for v in np.unique(v_b).tolist():
        for sp in (False, True):
            sel = (v_b == v) & (sp_b == sp)
            if not np.any(sel):
                continue
            grid = ParallelGrid(config, t_b[sel], p_b[sel], None, "interleaved" if v > 1 else "1f1b",
                                v, None, 1, (first_b[sel], last_b[sel]) if uneven else None)
            rules = rules_of(grid, s.gpus_per_node, s.seq_len, sp)
            reason_b[sel] = _first_broken(rules, ("heads", "kv_heads", "ffn_hidden", "node",
                                                  "sequence", "layers", "interleaved_layers",
                                                  "schedule"), reason_b[sel])

    # Micro-batches: b = 1 .. max, m = B / (d b) when d b divides B.
    nb = s.max_micro_batch
    b_of_c = np.arange(len(rows_b) * nb) // nb
    b_c = np.arange(len(rows_b) * nb) % nb + 1
    d_c, p_c, v_c = d_b[b_of_c], p_b[b_of_c], v_b[b_of_c]
    whole = s.global_batch % (d_c * b_c) == 0
    m_c = np.where(whole, s.global_batch // (d_c * b_c), 1)
    reason_c = reason_b[b_of_c].copy()
    reason_c = np.where((reason_c == PASSES) & ~whole, REASONS.index("global_batch"), reason_c)
    interleaved_m = (v_c > 1) & (m_c % p_c != 0)
    reason_c = np.where((reason_c == PASSES) & interleaved_m, REASONS.index("micro_batches"),
                        reason_c)

    # Recomputation.
    nr = len(s.recompute)
    c_of_d = np.arange(len(b_c) * nr) // nr
    rec_d = np.array([RECOMPUTE.index(r) for r in s.recompute], dtype=np.int64)[
        np.arange(len(b_c) * nr) % nr]

    # ZeRO stage, shard group and offload: the variants of each row's data-parallel degree,
    # one table of them all, each degree's rows starting at its offset.
    offload_codes = {name: i for i, name in enumerate(OFFLOADS)}
    degrees = np.unique(d_a)
    tables = [np.array([(st, g, offload_codes[o]) for st, g, o in _zero_variants(int(d), s)],
                       dtype=np.int64).reshape(-1, 3) for d in degrees]
    lengths = np.array([len(table) for table in tables], dtype=np.int64)
    offsets = np.cumsum(lengths) - lengths
    degree_of_a = np.searchsorted(degrees, d_a)
    a_of_d = a_of_b[b_of_c[c_of_d]]
    counts = lengths[degree_of_a][a_of_d]
    size = int(counts.sum())
    if size > MAX_SPACE:
        raise ValueError(f"the plan would enumerate {size:,} configurations, more than "
                         f"{MAX_SPACE:,}: name fewer stages, recomputations, chunks or a smaller "
                         f"max_micro_batch")
    d_of_e, position = _expand(counts)
    zero = np.concatenate(tables)[offsets[degree_of_a][a_of_d][d_of_e] + position]
    c_of_e = c_of_d[d_of_e]
    b_of_e = b_of_c[c_of_e]
    a_of_e = a_of_b[b_of_e]
    stage_e = zero[:, 0]
    offload_e = zero[:, 2]
    reason = reason_c[c_of_e]
    p_e = p_a[a_of_e]
    piped = ~np.isin(stage_e, s.engine.pipeline_stages)   # the engine's rule (DeepSpeed: 2-3)
    reason = np.where((reason == PASSES) & (p_e > 1) & piped,
                      REASONS.index("pipeline_zero"), reason)
    if s.host_memory is None:
        reason = np.where((reason == PASSES) & (offload_e > 0), REASONS.index("host_unknown"),
                          reason)
    columns = {"tensor_parallel": t_a[a_of_e], "pipeline_parallel": p_e,
               "data_parallel": d_a[a_of_e], "sequence_parallel": sp_b[b_of_e],
               "chunks": v_b[b_of_e], "micro_batch": b_c[c_of_e], "micro_batches": m_c[c_of_e],
               "recompute": rec_d[d_of_e], "stage": stage_e, "shard_group": zero[:, 1],
               "offload": offload_e}
    if uneven:   # the searched splits (0 where even)
        columns["first_layers"], columns["last_layers"] = first_b[b_of_e], last_b[b_of_e]
    codes = dict(zip(REASONS, range(PASSES)))
    expanded = ep_rules.expand(s, *cp_rules.expand(s, MappingProxyType(columns), reason, size, codes),
                               codes)
    expanded = zero_r_expand(s, *expanded, PASSES)
    expanded = ep_rules.expand_etp(s, *expanded, PASSES)
    if expanded[2] > MAX_SPACE:
        raise ValueError(f"the plan would enumerate {expanded[2]:,} configurations, more than "
                         f"{MAX_SPACE:,}: name fewer expert- or context-parallel degrees (or "
                         f"expert-tensor-parallel ones), stages, "
                         f"recomputations, chunks or a smaller max_micro_batch")
    return Space(*expanded)


def _first_broken(rules: dict, names, reason: np.ndarray) -> np.ndarray:
    for name in names:
        reason = np.where((reason == PASSES) & ~rules[name], REASONS.index(name), reason)
    return reason


# --- peaks and times of the configurations that can run -----------------------------------------

def times_of(s: PlanSettings, c: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Step time and its parts of the configurations ``c``
    (:func:`zerolib.core.step.parallel.parallel_step_time`)."""
    # Enumerated from the checked PlanSettings, valid by construction: not checked again.
    settings = ParallelSettings.from_checked(
        seq_len=s.seq_len, micro_batch=c["micro_batch"], tensor_parallel=c["tensor_parallel"],
        pipeline_parallel=c["pipeline_parallel"], data_parallel=c["data_parallel"], stage=c["stage"],
        micro_batches=c["micro_batches"], chunks=c["chunks"],
        sequence_parallel=c["sequence_parallel"], recompute=c["recompute"],
        shard_group=c["shard_group"], offload=c["offload"], layout=s.layout, mfu=s.mfu,
        element_bytes=s.working_set.element_bytes, host_link=s.host_link, host=s.host,
        context_parallel=c.get("context_parallel", 1), engine=s.engine, overlap=s.overlap,
        expert_parallel=c.get("expert_parallel", 1), capacity_factor=s.working_set.capacity_factor,
        flash_attention=s.working_set.flash_attention,
        **{name: c[name] for name in ("partition_activations", "cpu_checkpointing",
                                      "expert_tensor_parallel", "first_layers", "last_layers")
           if name in c})
    times = parallel_step_time(s.model, s.interconnect, s.device, settings)
    out = {f"{part}_seconds": seconds for part, seconds in times.parts.items()}
    out["step_seconds"] = times.step_seconds
    out["network_wait_fraction"] = times.network_wait_fraction
    out["bubble_fraction"] = times.bubble_fraction
    return out


# The space and its peaks do not depend on the device, the links or the utilisation: remembered
# for the last few settings, so a reader who changes only those (an explorer) re-times, not
# re-counts. Read-only arrays: nothing downstream can change a remembered value.
_MEMORY: OrderedDict = OrderedDict()
_MEMORY_SIZE = 16


def _memory_key(s: PlanSettings) -> tuple:
    return (s.model, s.gpus, s.gpus_per_node, s.seq_len, s.global_batch,
            tuple(s.layout.bits_per_param(c) for c in CATEGORIES), s.max_micro_batch, s.stages,
            s.recompute, s.chunks, s.offload, s.sequence_parallel, s.shard_groups,
            s.working_set, s.host_memory is None, s.context_parallel, s.engine.name,
            s.engine.group_stages, s.expert_parallel, s.zero_r, s.expert_tensor_parallel,
            s.pipeline_layers)


def _space_and_peaks(s: PlanSettings):
    """(space, runnable indices, their columns, their peaks), remembered per :func:`_memory_key`."""
    key = _memory_key(s)
    if key in _MEMORY:
        _MEMORY.move_to_end(key)
        return _MEMORY[key]
    space = enumerate_space(s)
    runnable = np.flatnonzero(space.reason == PASSES)
    c = {name: values[runnable] for name, values in space.columns.items()}
    peaks = peaks_of(s, c) if len(runnable) else {
        name: np.zeros(0, dtype=np.int64) for name in PEAK_KEYS}
    for array in (*space.columns.values(), space.reason, runnable, *c.values(), *peaks.values()):
        array.setflags(write=False)
    _MEMORY[key] = found = (space, runnable, MappingProxyType(c), MappingProxyType(peaks))
    while len(_MEMORY) > _MEMORY_SIZE:
        _MEMORY.popitem(last=False)
    return found


# --- the plan -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """The planner's answer. ``valid`` holds every configuration that can run (peak, host bytes,
    times, ``fits``, ``rank``: 1 for the fastest that fits, 0 for those that do not); ``fits``
    the fitting ones, ranked; ``rejected`` the count per reason."""

    settings: PlanSettings
    space: Space = field(repr=False)
    results: Mapping[str, np.ndarray] = field(repr=False)   # over the runnable rows
    runnable: np.ndarray = field(repr=False)                 # their indices in the space
    reason: np.ndarray = field(repr=False)                   # final reason per configuration

    @property
    def size(self) -> int:
        return self.space.size

    @cached_property
    def valid(self) -> pd.DataFrame:
        """Every runnable configuration, in enumeration order, with ``fits`` and its numbers."""
        import pandas as pd
        s = self.settings
        c = {name: values[self.runnable] for name, values in self.space.columns.items()}
        judges = s.working_set.convention.judges
        schedules = np.unique(self.space.columns["chunks"]).tolist()   # sorted
        frame = pd.DataFrame({
            "tensor_parallel": c["tensor_parallel"], "pipeline_parallel": c["pipeline_parallel"],
            "data_parallel": c["data_parallel"], "sequence_parallel": c["sequence_parallel"],
            "chunks": c["chunks"],
            "schedule": pd.Categorical.from_codes(
                np.searchsorted(schedules, c["chunks"]), [schedule_name(v) for v in schedules]),
            "stage": c["stage"], "shard_group": c["shard_group"],
            "recompute": pd.Categorical.from_codes(c["recompute"], list(RECOMPUTE)),
            "micro_batch": c["micro_batch"], "micro_batches": c["micro_batches"],
            "offload": pd.Categorical.from_codes(c["offload"], list(OFFLOADS)),
            "peak_bytes": self.results["peak_bytes"],
            "headroom_bytes": s.device.capacity - self.results["judged_bytes"],
            "pipeline_stage": self.results["pipeline_stage"],
            "host_bytes_per_node": self.results["host_bytes_per_node"],
            **{name: self.results[name] for name in (
                "step_seconds", "compute_seconds", "tensor_seconds", "pipeline_seconds",
                "data_parallel_seconds", "bubble_seconds", "network_wait_fraction",
                "bubble_fraction")},
            "fits": self.reason[self.runnable] == PASSES,
            "family": pd.Categorical.from_codes(
                (c["tensor_parallel"] > 1) + 2 * (c["pipeline_parallel"] > 1), list(FAMILIES)),
            "peak_reserved_bytes": self.results["peak_reserved_bytes"],
            "fits_judges": pd.Categorical.from_codes(
                np.full(len(self.runnable), JUDGES.index(judges), dtype=np.int8), list(JUDGES)),
        }, columns=list(FIT_COLUMNS))
        frame = cp_rules.apart(frame, c)     # with C searched: d and C apart (ZeRO over d x C)
        if "partition_activations" in c:     # with ZeRO-R searched: which options each row runs
            frame = frame.assign(partition_activations=c["partition_activations"],
                                 cpu_checkpointing=c["cpu_checkpointing"])
        if "expert_parallel" in c:           # with E searched: E and its all-to-alls' seconds
            frame = frame.assign(expert_parallel=c["expert_parallel"],
                                 expert_seconds=self.results["expert_seconds"])
        if "expert_tensor_parallel" in c:    # with ETP searched: each row's ETP
            frame = frame.assign(expert_tensor_parallel=c["expert_tensor_parallel"])
            if "expert_seconds" not in frame:
                frame = frame.assign(expert_seconds=self.results["expert_seconds"])
        if "first_layers" in c:              # with uneven stages searched: each row's split
            frame = frame.assign(first_layers=c["first_layers"], last_layers=c["last_layers"])
        rank = np.zeros(len(frame), dtype=np.int64)
        fitting = np.flatnonzero(frame["fits"].to_numpy())
        step = frame["step_seconds"].to_numpy()[fitting]
        order = np.lexsort((fitting, -frame["headroom_bytes"].to_numpy()[fitting],
                            step))
        rank[fitting[order]] = np.arange(1, len(fitting) + 1)
        frame.insert(0, "rank", rank)
        frame.attrs.update(plan=s)
        return frame

    @cached_property
    def fits(self) -> pd.DataFrame:
        """The fitting configurations, fastest first (ties: more headroom first, then enumeration
        order). ``rank`` counts from 1."""
        valid = self.valid
        ranked = valid[valid["rank"].to_numpy() > 0].sort_values("rank", kind="stable")
        ranked = ranked.reset_index(drop=True)
        ranked.attrs.update(plan=self.settings)
        return ranked

    @cached_property
    def rejected(self) -> pd.DataFrame:
        """Per reason of :data:`RULES` that rejected anything: how many configurations, one of
        them (the first enumerated; for the memory rules, the one closest to fitting) and, for
        those, its peak or host bytes."""
        import pandas as pd
        rows = []
        codes = np.bincount(self.reason, minlength=PASSES + 1)
        position = np.full(self.size, -1, dtype=np.int64)
        position[self.runnable] = np.arange(len(self.runnable))
        for code, name in enumerate(REASONS):
            if not codes[code]:
                continue
            members = np.flatnonzero(self.reason == code)
            bytes_ = None
            if name in ("capacity", "host_memory"):
                key = "judged_bytes" if name == "capacity" else "host_bytes_per_node"
                values = self.results[key][position[members]]
                pick = int(np.argmin(values))
                example, bytes_ = int(members[pick]), int(values[pick])
            else:
                example = int(members[0])
            rows.append({"rule": name, "reason": RULES[name], "configurations": int(codes[code]),
                         "example": describe_configuration(self.configuration(example)),
                         "example_bytes": bytes_})
        frame = pd.DataFrame(rows, columns=["rule", "reason", "configurations", "example",
                                            "example_bytes"])
        frame.attrs.update(plan=self.settings)
        return frame

    def configuration(self, index: int) -> dict:
        """The settings of configuration ``index`` of the space, as plain values."""
        c = {name: values[index].item() for name, values in self.space.columns.items()}
        c["recompute"] = RECOMPUTE[c["recompute"]]
        c["offload"] = list(OFFLOADS)[c["offload"]]
        c["schedule"] = schedule_name(c["chunks"])
        return cp_rules.apart(c)     # d apart from C, as valid shows it

    def counts(self) -> dict[str, int]:
        runnable = len(self.runnable)
        return {"configurations": self.size, "runnable": runnable,
                "fit": int(np.sum(self.reason == PASSES)),
                "rejected": self.size - int(np.sum(self.reason == PASSES))}

    def run(self, row) -> Run:
        """The run of one configuration (a row of :attr:`valid` or :attr:`fits`, or a
        :meth:`configuration` dict): the plan's run with the configuration's layout, ZeRO
        stage, recomputation, micro-batches and offload. ``estimate`` of it gives the row's peak
        and, with the plan's links, its step time; ``run.to_toml()`` is its run file."""
        s = self.settings
        t, d, c = int(row["tensor_parallel"]), int(row["data_parallel"]), int(row.get("context_parallel", 1))
        chunks, group = int(row["chunks"]), int(row["shard_group"])
        etp = int(row.get("expert_tensor_parallel", t))
        first, last = int(row.get("first_layers", 0)), int(row.get("last_layers", 0))
        recompute = str(row["recompute"])
        trainer = s.run.trainer
        # Megatron-LM's method and layers belong to full recomputation: the other rows run without
        method = ({} if recompute == "full" else {"recompute_method": "uniform", "recompute_layers": 1})
        if (trainer.recompute_method, trainer.recompute_layers) == ("uniform", 1):
            method = {}
        return s.run.replace(
            **method, pipeline_layers=(first, last) if first else None,
            gpus_per_node=s.gpus_per_node, link=s.interconnect.name, seq_len=s.seq_len,
            tensor_parallel=t, sequence_parallel=bool(row["sequence_parallel"]),
            pipeline_parallel=int(row["pipeline_parallel"]),
            pipeline_schedule="interleaved" if chunks > 1 else "1f1b", pipeline_chunks=chunks,
            context_parallel=c, expert_parallel=int(row.get("expert_parallel", 1)),
            expert_tensor_parallel=None if etp == t else etp,
            shard_group=None if group == d * c else group, stages=(int(row["stage"]),),
            recompute=recompute, micro_batch=int(row["micro_batch"]),
            micro_batches=int(row["micro_batches"]),
            partition_activations=bool(row.get("partition_activations", False)),
            cpu_checkpointing=bool(row.get("cpu_checkpointing", False)),
            **{"offload_optimizer": "none", "offload_params": "none", **OFFLOADS[str(row["offload"])]})


def plan(run, gpus=None, gpus_per_node=None, device=None, seq_len=None, global_batch=None, *,
         search: Search | None = None, **options) -> Plan:
    """Every configuration of a run's model on its cluster, at its sequence and global batch:
    which can run, their peaks and step times, which fit, ranked (see the module doc).
    ``plan(run, search=Search(...))``: the run fixes the model, cluster, trainer and batch; the
    search (:class:`zerolib.core.plan_settings.Search`) names what is searched. The short form
    builds both: ``plan(model, gpus, gpus_per_node, device, seq_len, global_batch, **options)``,
    the options a run's fields (``links``, ``host_link``, ``host``, ``cpu_adam_rate``,
    ``layout``, ``mfu``, ``host_memory``, ``link_efficiency``, ``engine``, ``flash_attention``,
    ``reserve_bytes`` ...) or the search's (``max_micro_batch``, ``stages``, ``recompute``,
    ``chunks``, ``offload``, ``sequence_parallel``, ``shard_groups``, ``context_parallel``,
    ``expert_parallel``, ``expert_tensor_parallel``, ``zero_r``). Each fitting row is a run:
    :meth:`Plan.run`."""
    return plan_from(plan_settings(run, gpus, gpus_per_node, device, seq_len, global_batch,
                                   search=search, **options))


def plan_from(s: PlanSettings) -> Plan:
    """:func:`plan` for validated :class:`PlanSettings`."""
    space, runnable, c, peaks = _space_and_peaks(s)
    times = times_of(s, c) if len(runnable) else {
        name: np.zeros(0) for name in ("step_seconds", "network_wait_fraction", "bubble_fraction",
                                       *(f"{part}_seconds" for part in PARTS))}
    results = {**peaks, **times}
    too_big = results["judged_bytes"] > s.device.capacity   # the peak the engine judges
    host_over = (np.zeros(len(runnable), dtype=bool) if s.host_memory is None
                 else results["host_bytes_per_node"] > s.host_memory)
    reason = space.reason.copy()
    reason[runnable] = np.where(too_big, REASONS.index("capacity"),
                                np.where(host_over, REASONS.index("host_memory"), PASSES))
    return Plan(s, space, MappingProxyType(results), runnable, reason)
