"""Tidy DataFrames: where the arithmetic leaves the library for tables and figures.

Each table carries what a figure's title and labels need in ``DataFrame.attrs``, so a chart
draws from the table alone and never re-runs the arithmetic: ``attrs["layout"]`` (the
:class:`~zerolib.core.memory.accounting.Layout` the bytes were computed with) on every table, and on
:func:`peak_frame` also ``attrs["model"]`` (the TransformerConfig) and ``attrs["settings"]``
(the WorkingSetSettings).
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from zerolib.core.catalogue.devices import Device, get_device
from zerolib.core.catalogue.models import TransformerConfig, get_model
from zerolib.core.inputs import check_gpus, check_params, check_single, check_stage
from zerolib.core.memory.accounting import (
    CATEGORIES,
    PARTITIONED,
    STAGES,
    STRATEGY_NAMES,
    Layout,
    check_shard_group,
    get_layout,
    model_state,
)
from zerolib.core.memory.feasibility import fewest_gpus
from zerolib.core.memory.placement import OPTIONS, TIERS, Option, gpus_on_node, place
from zerolib.core.memory.trainer_peak import peak_keys
from zerolib.core.memory.working_set import DEFAULT_SETTINGS, TERMS, WorkingSetSettings, peaks

if TYPE_CHECKING:  # pandas is imported where a frame is built: commands that build none start without it
    import pandas as pd

COLUMNS = ("params", "gpus", "stage", "strategy", *CATEGORIES, "total", "cluster_total")
GROUP_COLUMNS = ("params", "gpus", "shard_group", "replicas", "stage", "strategy", *CATEGORIES,
                 "total", "cluster_total")
TIER_COLUMNS = ("option", "stage", "offered", "tier", "bytes", "per_node", "note")
SHARD_COLUMNS = ("params", "gpus", "stage", "strategy", "gpu", "category", "partitioned", "bytes",
                 "shard_bytes", "others")
MAX_SHARD_GPUS = 64                  # columns of one shard picture (one per GPU): readable ones
PEAK_COLUMNS = ("model", "gpus", "stage", "strategy", "layer", "component", "bytes")
COMPONENTS = (*CATEGORIES, *TERMS)   # a peak's parts, bottom to top of a stacked bar
MAX_ROWS = 2**21                     # rows of one table: enough for any figure, bounded in memory
_STRATEGY_NAMES = np.array([STRATEGY_NAMES[s] for s in STAGES])   # indexed by stage


def _distinct(values: np.ndarray) -> np.ndarray:
    return np.unique(values.ravel())


def _check_rows(*counts: int) -> None:
    rows = int(np.prod(counts, dtype=object))
    if rows > MAX_ROWS:
        raise ValueError(f"a table of {' x '.join(f'{c:,}' for c in counts)} = {rows:,} rows is too "
                         f"large: at most {MAX_ROWS:,} rows (fewer GPU counts or model sizes)")


def memory_table(params, gpus, stages=STAGES, layout: str | Layout = "mixed-adam") -> pd.DataFrame:
    """One row per model size x worker count x stage; bytes per worker per category.

    Rows are ordered by params, then gpus, then stage. ``cluster_total`` sums all workers.
    At most :data:`MAX_ROWS` rows.
    """
    import pandas as pd
    params, gpus = check_params(params), check_gpus(gpus)
    stages = check_stage(stages, "stages")
    _check_rows(params.size, gpus.size, stages.size)
    params, gpus, stages = _distinct(params), _distinct(gpus), _distinct(stages)
    layout = get_layout(layout)
    grid_params, grid_gpus, grid_stage = (a.ravel() for a in np.meshgrid(params, gpus, stages,
                                                                         indexing="ij"))
    state = model_state(grid_params, grid_gpus, grid_stage, layout)
    table = pd.DataFrame({"params": grid_params, "gpus": grid_gpus, "stage": grid_stage,
                          **state.as_dict()})
    table.insert(3, "strategy", _STRATEGY_NAMES[grid_stage])
    table.attrs["layout"] = layout
    return table


def shard_table(params, gpus, stages=STAGES, layout: str | Layout = "mixed-adam") -> pd.DataFrame:
    """Who holds what: one row per stage x GPU x category of one model on ``gpus`` GPUs (at most
    :data:`MAX_SHARD_GPUS`), ordered so. ``bytes`` is what that GPU holds of the category
    (:func:`~zerolib.core.memory.accounting.model_state`); ``shard_bytes`` one of the ``gpus``
    partitions of it, ceil(params / gpus) elements (padded, as FSDP's flat parameter and
    DeepSpeed's partitions are: every GPU's partition the same size); ``partitioned`` whether
    the stage partitions the category (:data:`~zerolib.core.memory.accounting.PARTITIONED`);
    ``others`` what the GPU holds of the partitions it does not own: ``"held"`` (a replica of
    the whole category) or ``"not held"``. GPU ``i`` owns partition ``i``.
    """
    import pandas as pd
    params = check_single(params, check_params, "params")
    gpus = check_single(gpus, check_gpus, "gpus")
    if gpus > MAX_SHARD_GPUS:
        raise ValueError(f"gpus must be at most {MAX_SHARD_GPUS} for a picture of one column "
                         f"per GPU, got {gpus:,}")
    stages = tuple(sorted(set(check_stage(stages, "stages").ravel().tolist())))
    layout = get_layout(layout)
    shard = model_state(params, gpus, 3, layout)     # every category partitioned
    rows = []
    for stage in stages:
        held = model_state(params, gpus, stage, layout)
        for gpu in range(gpus):
            for category in CATEGORIES:
                partitioned = category in PARTITIONED[stage]
                rows.append((params, gpus, stage, STRATEGY_NAMES[stage], gpu, category,
                             partitioned, int(getattr(held, category)),
                             int(getattr(shard, category)), "not held" if partitioned else "held"))
    table = pd.DataFrame(rows, columns=list(SHARD_COLUMNS))
    for column in ("params", "gpus", "stage", "gpu", "bytes", "shard_bytes"):
        table[column] = table[column].astype(np.int64)
    table.attrs["layout"] = layout
    return table


NEVER = "never"   # how every table and sentence of the chapter shows a count at which nothing fits


def show_never(values, *, zero_is_never: bool = False):
    """``values`` for display, with "never" where nothing fits: None or <NA> (a fewest-GPUs
    answer), and 0 too when ``zero_is_never`` (a largest-micro-batch answer). A scalar gives a
    scalar, a list, tuple or array a list, a Series or DataFrame one of object dtype."""
    import pandas as pd

    def one(value):
        if value is None or value is pd.NA or (zero_is_never and not isinstance(value, bool)
                                               and isinstance(value, (int, np.integer))
                                               and value == 0):
            return NEVER
        return value.item() if isinstance(value, np.generic) else value

    if isinstance(values, pd.DataFrame):
        return values.astype(object).apply(lambda column: column.map(one))
    if isinstance(values, pd.Series):
        return values.astype(object).map(one)
    if isinstance(values, (list, tuple, np.ndarray)):
        return [one(v) for v in values]
    return one(values)


def fewest_gpus_table(params, layout: str | Layout = "mixed-adam",
                      device: str | Device = "a100-80gb", stages=STAGES,
                      max_gpus: int = 1024) -> pd.DataFrame:
    """Per model and stage: the fewest workers whose model state fits ``device`` (<NA> if none
    up to max_gpus)."""
    import pandas as pd
    params, stages = check_params(params), check_stage(stages, "stages")
    _check_rows(params.size, stages.size)
    params, stages = _distinct(params), _distinct(stages)
    layout = get_layout(layout)
    grid_params, grid_stage = (a.ravel() for a in np.meshgrid(params, stages, indexing="ij"))
    fewest = fewest_gpus(grid_params, grid_stage, layout, device, max_gpus=max_gpus)
    table = pd.DataFrame({
        "params": grid_params, "stage": grid_stage, "strategy": _STRATEGY_NAMES[grid_stage],
        "device": get_device(device).name,
        "fewest_gpus": pd.array(fewest, dtype="Int64"),
    })
    table.loc[table["fewest_gpus"] == 0, "fewest_gpus"] = pd.NA  # 0 = never fits
    table.attrs["layout"] = layout
    return table


def stage_savings(params, gpus, layouts=("mixed-adam",)) -> pd.DataFrame:
    """Per layout and stage: bytes per worker and the bytes that stage saves over the one before.

    One row per (layout, stage); ``saved`` is 0 for stage 0. Shows where the savings move when
    one category's width changes (e.g. fp32 gradients make stage 2 save more).
    """
    import pandas as pd
    if isinstance(layouts, (str, Layout)):
        layouts = (layouts,)
    params = check_single(params, check_params, "params")
    gpus = check_single(gpus, check_gpus, "gpus")
    frames = []
    for layout in layouts:
        table = memory_table(params, gpus, STAGES, layout)
        table = table[["stage", "strategy", "total"]].assign(layout=get_layout(layout).name)
        table["saved"] = (-table["total"].diff()).fillna(0).astype(np.int64)
        frames.append(table)
    return pd.concat(frames, ignore_index=True)[["layout", "stage", "strategy", "total", "saved"]]


def peak_frame(model: str | TransformerConfig, gpus, stages=STAGES,
               settings: WorkingSetSettings = DEFAULT_SETTINGS,
               layout: str | Layout = "mixed-adam") -> pd.DataFrame:
    """Tidy rows for a stacked bar per stage: one row per (stage, component), in bytes.

    Columns: model, gpus, stage, strategy, layer ("persistent" or "working set"), component
    (parameters, gradients, optimizer, then the working-set terms), bytes. Under the chapter's
    count summing ``bytes`` over a stage gives its peak; an engine's convention that judges
    otherwise (torchtitan's: the optimizer step's moment, gradients freed by the step, the
    reserved peak) holds the same bytes, its peaks apart. ``attrs`` holds the model, settings,
    layout and ``peaks``: per stage the row's peaks as ``estimate`` gives them
    (:func:`zerolib.core.memory.trainer_peak.peak_keys`: ``peak``, ``peak_reserved``,
    ``fits_judges`` ...).
    """
    import pandas as pd
    config, layout = get_model(model), get_layout(layout)
    gpus = check_single(gpus, check_gpus, "gpus")
    records, by_stage = [], {}
    for result in peaks(config, gpus, stages, settings, layout):
        beyond = [t for t, value in result.working_set.items() if t not in TERMS and value]
        if beyond:   # FSDP2's unsharded gradients beside a pipeline: no bar of the chapter's
            raise ValueError(f"peak_frame draws the chapter's terms; {beyond[0]} (an engine's "
                             f"own, beside a pipeline) is not one of them: use estimate")
        by_stage[result.stage] = peak_keys(result)
        common = {"model": config.name, "gpus": gpus, "stage": result.stage,
                  "strategy": STRATEGY_NAMES[result.stage]}
        records += [{**common, "layer": "persistent", "component": c, "bytes": result.persistent[c]}
                    for c in CATEGORIES]
        records += [{**common, "layer": "working set", "component": t, "bytes": result.working_set[t]}
                    for t in TERMS]
    frame = pd.DataFrame.from_records(records)
    frame["bytes"] = frame["bytes"].astype("int64")
    frame.attrs.update(model=config, settings=settings, layout=layout, peaks=by_stage)
    return frame


def divisors(n: int) -> list[int]:
    """Every G that divides ``n``, ascending: the shard-group sizes of ``n`` GPUs."""
    return list(divisors_of(check_single(n, check_gpus, "gpus")))


@lru_cache(maxsize=1024)
def divisors_of(n: int) -> tuple[int, ...]:
    """:func:`divisors` of a checked count (remembered: a plan asks for each d many times)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(sorted({*small, *(n // d for d in small)}))


def group_size_table(params, gpus, stages=STAGES, layout: str | Layout = "mixed-adam",
                     shard_groups=None) -> pd.DataFrame:
    """Per shard-group size G (every divisor of ``gpus`` unless given) and stage: bytes per GPU
    with the state sharded over G and replicated over gpus / G (HSDP, MiCS). G = gpus is the
    ZeRO of :func:`memory_table`, G = 1 plain data parallelism. ``attrs``: layout."""
    import pandas as pd
    params = check_single(params, check_params, "params")
    gpus = check_single(gpus, check_gpus, "gpus")
    groups = np.asarray(divisors(gpus) if shard_groups is None
                        else _distinct(check_gpus(shard_groups, "shard_groups")))
    stages = _distinct(check_stage(stages, "stages"))
    _check_rows(groups.size, stages.size)
    layout = get_layout(layout)
    grid_group, grid_stage = (a.ravel() for a in np.meshgrid(groups, stages, indexing="ij"))
    state = model_state(params, gpus, grid_stage, layout, shard_group=grid_group)
    table = pd.DataFrame({"params": params, "gpus": gpus, "shard_group": grid_group,
                          "replicas": gpus // grid_group, "stage": grid_stage,
                          "strategy": _STRATEGY_NAMES[grid_stage], **state.as_dict()})
    table.attrs["layout"] = layout
    return table


def tier_table(params, gpus, layout: str | Layout = "mixed-adam", shard_group=None,
               gpus_per_node=None, options: tuple[Option, ...] = OPTIONS) -> pd.DataFrame:
    """Per option (:data:`zerolib.core.memory.placement.OPTIONS`) and tier (gpu, cpu, nvme): bytes per
    GPU on that tier and per node. An option the setting does not allow (hpZ inside a smaller
    shard group) has ``offered`` False, 0 bytes and the reason in ``note``. ``attrs``: params,
    gpus, gpus_on_node, shard_group, layout."""
    import pandas as pd
    params = check_single(params, check_params, "params")
    gpus = check_single(gpus, check_gpus, "gpus")
    layout = get_layout(layout)
    on_node = int(gpus_on_node(gpus, gpus_per_node))   # checks gpus fill whole nodes
    if shard_group is not None:
        shard_group = check_single(check_shard_group(shard_group, np.asarray(gpus)), check_gpus,
                                   "shard_group")
    records = []
    for option in options:
        try:
            tiers = place(params, gpus, option.stage, layout,
                          option.placement(gpus, shard_group, gpus_per_node))
            offered, note = True, ""
        except ValueError as error:
            tiers, offered, note = None, False, str(error)
        for tier in TIERS:
            per_gpu = int(tiers.total(tier)) if offered else 0
            per_node = int(tiers.per_node(tier)) if offered else 0
            records.append({"option": option.name, "stage": option.stage, "offered": offered,
                            "tier": tier, "bytes": per_gpu, "per_node": per_node, "note": note})
    table = pd.DataFrame.from_records(records, columns=list(TIER_COLUMNS))
    table[["bytes", "per_node"]] = table[["bytes", "per_node"]].astype("int64")
    table.attrs.update(params=params, gpus=gpus, gpus_on_node=on_node, shard_group=shard_group,
                       layout=layout)
    return table
