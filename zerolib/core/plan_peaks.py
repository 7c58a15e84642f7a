"""The peaks of a plan's configurations, as ``estimate`` counts them (:mod:`zerolib.core.planner`'s
memory half): the activations per distinct setting, the model state per shard group and offload,
FSDP2's unsharded units under an FSDP2 engine's convention, each pipeline stage that can be the
most loaded, and the peak its engine judges (:func:`zerolib.core.memory.trainer_peak.judge`).
Vectorised over the configurations; tests hold every peak to ``estimate`` of the row's run."""
from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

import numpy as np

from zerolib.core.inputs import MAX_GPUS
from zerolib.core.memory import expert_parallel_rules as ep_rules
from zerolib.core.memory.accounting import ModelState
from zerolib.core.memory.activations import RECOMPUTE, ActivationOptions, checkpoint_terms_of
from zerolib.core.memory.conventions import reserved_bytes
from zerolib.core.memory.model_parallel import (
    MAX_CHUNKS,
    ParallelGrid,
    candidate_loads,
    candidate_stages,
    stage_layers,
    unsharded_units_on,
)
from zerolib.core.memory.pipeline_schedule import (
    UNIT_TERMS,
    activation_totals_of,
    stage_rules,
    unit_terms,
    with_split,
)
from zerolib.core.memory.placement import Placement, tiers_of
from zerolib.core.memory.trainer_peak import judge, memory_options, summed
from zerolib.core.memory.working_set import terms_of
from zerolib.core.plan_settings import MAX_PLAN_MICRO_BATCH, PlanSettings
from zerolib.core.step.parallel import OFFLOADS

PEAK_KEYS = ("peak_bytes", "peak_reserved_bytes", "judged_bytes", "pipeline_stage",
             "host_bytes_per_node")


def activation_totals(s: PlanSettings, c: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Activation bytes (logits and loss included) on one GPU of the first and last stage."""
    ws = s.working_set
    t, b, sp, rec = c["tensor_parallel"], c["micro_batch"], c["sequence_parallel"], c["recompute"]
    cp = c.get("context_parallel", np.ones_like(t))
    pa = c.get("partition_activations", np.zeros_like(sp))
    cpu = c.get("cpu_checkpointing", np.zeros_like(sp))
    code = (((((t * (MAX_PLAN_MICRO_BATCH + 1) + b) * 2 + sp) * len(RECOMPUTE) + rec) * 1025 + cp)
            * 4 + 2 * pa + cpu)
    etp = c.get("expert_tensor_parallel")
    if etp is not None:    # ETP changes the experts' gathered rows (a searched ETP only)
        code = code * (MAX_GPUS + 1) + etp
    keys, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    units = {name: np.zeros(len(keys), dtype=np.int64) for name in UNIT_TERMS}
    rules = []    # per key: the recompute method's rules, as estimate's working set reads them
    memory = memory_options(ws)     # the trainer's code: its loss, norms, fp8 (estimate's)
    every_layer = {"recompute_method": "uniform", "recompute_layers": 1}
    for index, row in enumerate(first.tolist()):
        recompute = RECOMPUTE[int(rec[row])]
        options = ActivationOptions.from_checked(   # each value checked at the planner's door
            sequence_parallel=bool(sp[row]), recompute=recompute,
            flash_attention=ws.flash_attention, element_bytes=ws.element_bytes,
            mask_bytes=ws.mask_bytes, dropout=ws.resolved_dropout, logits_bytes=ws.logits_bytes,
            capacity_factor=ws.capacity_factor,
            expert_tensor_parallel=None if etp is None or etp[row] == t[row] else int(etp[row]),
            partition_activations=bool(pa[row]), cpu_checkpointing=bool(cpu[row]),
            **(memory if recompute == "full" else {**memory, **every_layer}))
        terms = unit_terms(s.model, s.seq_len // int(cp[row]), int(b[row]), int(t[row]), options)
        rules.append((*stage_rules(options)[:2], False))   # the working set's: method, layers
        if pa[row] or cpu[row]:    # the working set's rule: ZeRO-R's checkpoint, split or on the host
            kept = checkpoint_terms_of(s.seq_len // int(cp[row]), int(b[row]), s.model.hidden,
                                       int(t[row]), ws.element_bytes, bool(sp[row]),
                                       bool(pa[row]), bool(cpu[row]))["gpu"]
            terms = {**terms, "transformer_layers": kept}
            if s.model.dense_layers:
                terms["dense_transformer_layer"] = kept
        for name in UNIT_TERMS:
            units[name][index] = terms[name]
    per_row = {name: values[inverse] for name, values in units.items()}
    distinct = sorted(set(rules))
    rule_of_row = np.array([distinct.index(rule) for rule in rules], dtype=np.int64)[inverse]
    p, m, v = c["pipeline_parallel"], c["micro_batches"], c["chunks"]
    split = plan_split(c)
    stages = candidate_stages(s.model, p, split)
    out = [np.zeros(len(code), dtype=np.int64) for _ in stages]
    for chunk in np.unique(v):
        for k, rule in enumerate(distinct):
            sel = (v == chunk) & (rule_of_row == k)
            if not np.any(sel):
                continue
            schedule = "interleaved" if chunk > 1 else "1f1b"
            sub = {name: values[sel] for name, values in per_row.items()}
            part = None if split is None else (split[0][sel], split[1][sel])
            for index, r in enumerate(stages):
                out[index][sel] = activation_totals_of(s.model, sub, p[sel], r[sel], schedule,
                                                       int(chunk), m[sel], with_split(rule, part))
    return out


def plan_split(c: Mapping[str, np.ndarray]):
    """The configurations' uneven stages (FIRST, LAST arrays, 0 where even), or None."""
    return (c["first_layers"], c["last_layers"]) if "first_layers" in c else None


@lru_cache(maxsize=64)
def offload_placement(gpus_per_node: int | None, offload: str) -> Placement:
    """The placement of one offload of the plan (made, and so checked, once)."""
    return Placement(gpus_per_node=gpus_per_node, **OFFLOADS[offload])


def _persistent(s: PlanSettings, c, params: np.ndarray):
    """(bytes on the GPU, CPU bytes per node, gradient and optimizer bytes on the GPU) of the
    model state of GPUs holding ``params``."""
    gpu = np.zeros(len(params), dtype=np.int64)
    cpu_node = np.zeros(len(params), dtype=np.int64)
    gradients, optimizer = np.zeros_like(gpu), np.zeros_like(gpu)
    d, stage, group, offload = c["data_parallel"], c["stage"], c["shard_group"], c["offload"]
    names = list(OFFLOADS)
    pair = group * len(names) + offload
    for key in np.unique(pair):
        sel = pair == key
        g, o = divmod(int(key), len(names))
        placement = offload_placement(s.gpus_per_node, names[o]).with_shard_group(g)
        # From _variants, valid by construction: place()'s checks are not repeated per group.
        n = int(sel.sum())
        tiers = tiers_of(ModelState(params[sel], d[sel], stage[sel], s.layout, np.full(n, g)),
                         placement, np.full(n, s.gpus))
        gpu[sel] = tiers.gpu
        cpu_node[sel] = tiers.per_node("cpu")
        categories = tiers.gpu_categories()
        gradients[sel], optimizer[sel] = categories["gradients"], categories["optimizer"]
    return gpu, cpu_node, gradients, optimizer


def _fsdp_units(s: PlanSettings, t: np.ndarray, p: np.ndarray, v: np.ndarray,
                split) -> list[dict[str, np.ndarray]] | None:
    """FSDP2's unsharded units on a GPU of each of :func:`candidate_stages` (the working set's
    :func:`zerolib.core.memory.trainer_peak.unsharded_units`, over arrays of t, p and chunks);
    None where the engine's convention is not FSDP2's."""
    if not s.working_set.convention.fsdp:
        return None
    out = []
    for r in candidate_stages(s.model, p, split):
        units = {}
        for chunk in np.unique(v).tolist():
            sel = v == chunk
            grid = ParallelGrid(s.model, t[sel], p[sel], r[sel], "interleaved" if chunk > 1 else "1f1b",
                                int(chunk), None, 1,
                                None if split is None else (split[0][sel], split[1][sel]))
            for name, value in unsharded_units_on(grid, grid.pipeline_stage).items():
                units.setdefault(name, np.zeros(len(p), dtype=np.int64))[sel] = value
        units["layers"] = stage_layers(s.model.layers, p, r, split).astype(np.int64)
        units["stages"] = p
        out.append(units)
    return out


def peaks_of(s: PlanSettings, c: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Peaks per GPU (and which pipeline stage decides them) and CPU bytes per node of the
    configurations ``c`` (columns as :class:`Space` holds them; all must be runnable), as
    ``estimate`` counts them: ``peak_bytes`` (allocated, plus the reserve outside the
    allocator), ``peak_reserved_bytes`` (the allocator's reserve added) and ``judged_bytes``,
    the one the engine's convention judges, whose largest pipeline stage decides."""
    t, p = c["tensor_parallel"], c["pipeline_parallel"]
    # Chunks place dense first layers (interleaved: in chunks of L / (p v)); alike layers, not.
    v = c["chunks"] if s.model.dense_layers else np.ones_like(p)
    split = plan_split(c)
    key = (t * (MAX_GPUS + 1) + p) * (MAX_CHUNKS + 1) + v
    if split is not None:   # the split, where searched
        key = (key * (s.model.layers + 1) + split[0]) * (s.model.layers + 1) + split[1]
    keys, first_row, inverse = np.unique(key, return_index=True, return_inverse=True)
    per_stage = candidate_loads(s.model, t[first_row], p[first_row], v[first_row],
                                None if split is None else tuple(x[first_row] for x in split))
    # FSDP2's units follow the schedule's chunks (estimate's grid has them)
    chunks = c["chunks"]
    fsdp_key = (t * (MAX_GPUS + 1) + p) * (MAX_CHUNKS + 1) + chunks
    if split is not None:
        fsdp_key = (fsdp_key * (s.model.layers + 1) + split[0]) * (s.model.layers + 1) + split[1]
    fsdp_keys, fsdp_first, fsdp_inverse = np.unique(fsdp_key, return_index=True, return_inverse=True)
    fsdp = _fsdp_units(s, t[fsdp_first], p[fsdp_first], chunks[fsdp_first],
                       None if split is None else tuple(x[fsdp_first] for x in split))
    activations = activation_totals(s, c)
    ws = s.working_set
    whole = summed(ws.convention)   # the chapter's count: the peak is state + every term
    judged = peak = reserved = stage_of_peak = host = np.full(len(p), -1, dtype=np.int64)
    spread = ep_rules.spread_rows(c)
    for index, ((params, module), acts, r) in enumerate(zip(per_stage, activations,
                                                            candidate_stages(s.model, p, split))):
        gpu, cpu_node, gradients, optimizer = _persistent(s, c, params[inverse])
        if len(spread):    # the experts over their own group (whole groups, no offload)
            gpu[spread] = ep_rules.persistent(s, c, params[inverse], r, spread, v)
        units = None if fsdp is None else {name: values[fsdp_inverse]
                                           for name, values in fsdp[index].items()}
        terms = terms_of(c["stage"], params[inverse], module[inverse], acts, 0, ws, s.layout, units)
        if whole:
            found = gpu + sum(terms.values())
            allocated = found - terms["reserve"]
            held = reserved_bytes(allocated, ws.reserved_ppm) + terms["reserve"]
            this_peak = found
        else:
            allocated, held, found, _ = judge(gpu, gradients, optimizer, terms, ws, s.layout)
            this_peak, held = allocated + terms["reserve"], held + terms["reserve"]
        later = found > judged      # the earlier stage on ties, as peaks() does
        judged, stage_of_peak = np.where(later, found, judged), np.where(later, r, stage_of_peak)
        peak, reserved = np.where(later, this_peak, peak), np.where(later, held, reserved)
        host = np.maximum(host, cpu_node)
    return {"peak_bytes": peak, "peak_reserved_bytes": reserved, "judged_bytes": judged,
            "pipeline_stage": stage_of_peak, "host_bytes_per_node": host}
