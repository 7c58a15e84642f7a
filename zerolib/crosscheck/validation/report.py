"""Reader-facing tables from the recorded runs in ``data/``: what notebook 05 shows.

Plain pandas, no torch and no DeepSpeed: the notebook reads what ``zerolib validate --record``
(``validation_sharded.csv``, ``validation_activations.csv``) and ``zerolib.crosscheck.validation.deepspeed_run``
(``deepspeed_measured.csv`` and its ``_buffers`` list) recorded, from ``zerolib.paths.DATA_DIR``
unless told another folder. Every number stays bytes; relative differences are the only values
formatted here (as "+11.7%", with the figures' ``plotting.format_relative``), because these
tables are for reading.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import pandas as pd

from zerolib.core.catalogue.models import get_model
from zerolib.core.memory.accounting import CATEGORIES
from zerolib.core.memory.working_set import REDUCE_BUCKET_SIZE
from zerolib.core.units import format_relative
from zerolib.crosscheck.validation.deepspeed_run import (
    DEEPSPEED_PHASES,  # its moments, in order
    buffers_path,
)
from zerolib.crosscheck.validation.deepspeed_run import RECORD_FILE as DEEPSPEED_FILE
from zerolib.crosscheck.validation.effects import MECHANISMS
from zerolib.crosscheck.validation.explain_activations import (
    totals as activation_totals,
)
from zerolib.crosscheck.validation.explain_sharded import SHARDED_PHASES
from zerolib.crosscheck.validation.explain_shipped import (
    BLOCKS as SHIPPED_BLOCKS,
)
from zerolib.crosscheck.validation.explain_shipped import (
    SHARED_BY_LAYERS,
    at_shape,
    extra_bytes,
)
from zerolib.crosscheck.validation.explain_shipped import (
    mechanism_totals as shipped_mechanism_totals,
)
from zerolib.crosscheck.validation.explain_shipped import (
    totals as shipped_totals,
)
from zerolib.crosscheck.validation.records import (
    ACTIVATIONS_FILE,
    SHARDED_FILE,
    SHIPPED_FILE,
    read_csv,
)
from zerolib.crosscheck.validation.setups import STRATEGIES, TINY_MODELS
from zerolib.paths import data_file

DEEPSPEED_BUFFERS_FILE = buffers_path(Path(DEEPSPEED_FILE)).name  # deepspeed_measured_buffers.csv

# Short names of the sharded strategies for table rows and figure panels.
STRATEGY_LABELS: Mapping[str, str] = MappingProxyType({
    "ddp": "DDP",
    "zero1": "ZeroRedundancyOptimizer",
    "fsdp2-keep": "FSDP2, reshard_after_forward=False",
    "fsdp2-reshard": "FSDP2, reshard_after_forward=True",
    "fsdp2-bf16": "FSDP2, bf16 compute",
    "hsdp": "HSDP (FSDP2, 2-D mesh)",
})
PHASE_LABELS: Mapping[str, str] = MappingProxyType({
    "rest": "at rest", "peak": "peak during forward"})

DEEPSPEED_STATES = ("measured_parameters", "measured_gradients", "measured_optimizer",
                    "measured_master_weights")
ELEMENT_BYTES = MappingProxyType({"fp32": 4, "bf16": 2})


# --- reading the records ------------------------------------------------------------------------

def _path(data_dir, filename: str) -> Path:
    return data_file(data_dir, filename, "a recorded run")


def load_sharded(data_dir=None) -> pd.DataFrame:
    """``validation_sharded.csv``: measured and predicted bytes per strategy, rank, category."""
    return read_csv(_path(data_dir, SHARDED_FILE))


def load_activations(data_dir=None) -> pd.DataFrame:
    """``validation_activations.csv``: each tensor one GPT block saved, beside the formula."""
    return read_csv(_path(data_dir, ACTIVATIONS_FILE))


def load_shipped(data_dir=None) -> pd.DataFrame:
    """``shipped_activations.csv``: each tensor a shipped transformers block saved, beside the formula."""
    return read_csv(_path(data_dir, SHIPPED_FILE))


def load_deepspeed(data_dir=None) -> pd.DataFrame:
    """``deepspeed_measured.csv``; the estimator columns are nullable (none for stages 0-1)."""
    frame = read_csv(_path(data_dir, DEEPSPEED_FILE))
    for column in ("deepspeed_estimate_per_gpu", "deepspeed_estimate_per_cpu"):
        frame[column] = pd.to_numeric(frame[column].replace("", pd.NA)).astype("Int64")
    return frame


def load_deepspeed_buffers(data_dir=None) -> pd.DataFrame:
    """``deepspeed_measured_buffers.csv``: every storage counted as a bucket or "other"."""
    return read_csv(_path(data_dir, DEEPSPEED_BUFFERS_FILE))


# --- small helpers --------------------------------------------------------------------------------

def _mechanisms(texts) -> str:
    """The distinct mechanism keys of some rows, in the legend's order."""
    used = {key for text in texts for key in str(text).split()}
    return " ".join(key for key in MECHANISMS if key in used) or "-"


def _choose(frame: pd.DataFrame, **where) -> pd.DataFrame:
    for column, value in where.items():
        if value not in set(frame[column]):
            known = ", ".join(str(v) for v in pd.unique(frame[column]))
            raise ValueError(f"{column} must be one of {known}, got {value!r}")
        frame = frame[frame[column] == value]
    return frame


def _ranks(ranks) -> str:
    """'rank 3', 'ranks 0-2', 'ranks 0, 2'."""
    ranks = sorted(int(r) for r in ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


# --- the sharded run ------------------------------------------------------------------------------

def rank_totals(sharded: pd.DataFrame) -> pd.DataFrame:
    """Per strategy, model, worker count, rank and phase: measured and predicted bytes summed
    over the three categories, with the mechanisms at work (tidy, bytes)."""
    keys = ["strategy", "stage", "model", "workers", "rank", "phase"]
    totals = (sharded.groupby(keys, sort=False)
              .agg(measured_bytes=("measured_bytes", "sum"),
                   predicted_bytes=("predicted_bytes", "sum"),
                   effects=("effects", _mechanisms))
              .reset_index())
    totals["relative_difference"] = (totals["measured_bytes"] / totals["predicted_bytes"] - 1)
    return totals


def sharded_overview(sharded: pd.DataFrame, workers: int = 4) -> pd.DataFrame:
    """One row per strategy and model: zerolib's bytes per rank beside the most-loaded rank's
    measured total at rest and at the forward peak, and the mechanisms that explain the gap."""
    totals = rank_totals(_choose(sharded, workers=workers))
    rows = []
    for (strategy, model), group in totals.groupby(["strategy", "model"], sort=False):
        predicted = int(group["predicted_bytes"].max())  # the same on every rank
        compared = f"stage {STRATEGIES[strategy].stage}"
        if STRATEGIES[strategy].shard_group is not None:
            compared += f", shard group {STRATEGIES[strategy].shard_group}"
        row = {"strategy": STRATEGY_LABELS[strategy], "compared with": compared,
               "model": model, "predicted per rank [B]": predicted}
        for phase in SHARDED_PHASES:
            measured = int(group.loc[group["phase"] == phase, "measured_bytes"].max())
            row[f"{PHASE_LABELS[phase]} [B]"] = measured
            row[f"{PHASE_LABELS[phase]} vs predicted"] = format_relative(measured / predicted - 1)
        row["explained by"] = _mechanisms(group["effects"].replace("-", ""))
        rows.append(row)
    return pd.DataFrame(rows)


def per_rank(sharded: pd.DataFrame, strategy: str, model: str = "uneven",
             workers: int = 4) -> pd.DataFrame:
    """One strategy, every rank at rest and at the peak: per category the measured bytes, the
    prediction and the relative difference (columns: category, then what)."""
    chosen = _choose(sharded, strategy=strategy, model=model, workers=workers)
    table = chosen.assign(phase=chosen["phase"].map(PHASE_LABELS),
                          difference=chosen["relative_difference"].map(format_relative))
    wide = table.pivot(index=["phase", "rank"], columns="category",
                       values=["measured_bytes", "predicted_bytes", "difference"])
    wide = wide.rename(columns={"measured_bytes": "measured [B]",
                                "predicted_bytes": "predicted [B]"})
    wide = wide.swaplevel(0, 1, axis=1)
    order = [(c, what) for c in CATEGORIES for what in ("measured [B]", "predicted [B]", "difference")]
    wide = wide[order].reindex([(PHASE_LABELS[p], r) for p in SHARDED_PHASES for r in range(workers)])
    for column in order:
        if column[1] != "difference":
            wide[column] = wide[column].astype("int64")
    return wide.rename_axis(index=["phase", "rank"], columns=["category", ""])


def explanations(sharded: pd.DataFrame, strategy: str, model: str = "uneven",
                 workers: int = 4) -> list[str]:
    """Each distinct explanation of one strategy's differences, with the ranks it applies to."""
    chosen = _choose(sharded, strategy=strategy, model=model, workers=workers)
    chosen = chosen[chosen["explanation"] != "matches"]
    found = []  # (category, phase, first rank) orders the lines
    for (category, text), group in chosen.groupby(["category", "explanation"], sort=False):
        ranks = {phase: tuple(sorted(g["rank"])) for phase, g in group.groupby("phase")}
        if len(ranks) == len(SHARDED_PHASES) and len(set(ranks.values())) == 1:
            when = {SHARDED_PHASES[0]: " and ".join(PHASE_LABELS[p] for p in SHARDED_PHASES)}
        else:
            when = {phase: PHASE_LABELS[phase] for phase in ranks}
        for phase, label in when.items():
            key = (CATEGORIES.index(category), SHARDED_PHASES.index(phase), ranks[phase][0])
            found.append((key, f"{category}, {_ranks(ranks[phase])}, {label}: {text}"))
    return [line for _, line in sorted(found)]


def mechanism_legend(*frames: pd.DataFrame) -> pd.DataFrame:
    """What each mechanism named in the frames' ``effects`` columns is."""
    used = _mechanisms(text for frame in frames for text in frame["effects"]).split()
    return pd.DataFrame({"mechanism": [k for k in used if k in MECHANISMS],
                         "what it is": [MECHANISMS[k] for k in used if k in MECHANISMS]})


def rank_bars(sharded: pd.DataFrame, panels, model: str = "uneven",
              workers: int = 4) -> pd.DataFrame:
    """The tidy table :func:`zerolib.chapter.plotting.measured_vs_predicted_figure` draws.

    ``panels`` is a sequence of (strategy, phase) pairs, one figure panel each. Columns: panel
    (its title), strategy, stage, phase, rank, category, measured_bytes, predicted_bytes,
    relative_difference; rows in panel, category, rank order.
    """
    panels = list(panels)
    if not panels:
        raise ValueError("panels must name at least one (strategy, phase) pair")
    frames = []
    for pair in panels:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise TypeError(f"panels must hold (strategy, phase) pairs, got {pair!r}")
        strategy, phase = pair
        chosen = _choose(sharded, strategy=strategy, model=model, workers=workers, phase=phase)
        title = (f"{STRATEGY_LABELS[strategy]} (stage {STRATEGIES[strategy].stage})\n"
                 f"{PHASE_LABELS[phase]}")
        frames.append(chosen.assign(panel=title, _category=chosen["category"].map(CATEGORIES.index))
                      .sort_values(["_category", "rank"], kind="stable"))
    columns = ["panel", "strategy", "stage", "phase", "rank", "category", "measured_bytes",
               "predicted_bytes", "relative_difference"]
    return pd.concat(frames, ignore_index=True)[columns]


def model_sizes() -> pd.DataFrame:
    """The two tiny models of the sharded run: layers, parameters, tensors."""
    return pd.DataFrame([{"model": spec.name, "layers": spec.description,
                          "parameters": spec.numel, "tensors": spec.tensor_count}
                         for spec in TINY_MODELS.values()])


# --- DeepSpeed measured ----------------------------------------------------------------------------

def _states(frame: pd.DataFrame) -> pd.Series:
    """Model states of a DeepSpeed row: parameters + gradients + optimizer + fp32 master."""
    return frame[list(DEEPSPEED_STATES)].sum(axis=1)


def _held(phases) -> str:
    phases = [p for p in DEEPSPEED_PHASES if p in set(phases)]
    if not phases:
        return "never"
    if len(phases) == len(DEEPSPEED_PHASES):
        return "always"
    return ", ".join(phases)


def deepspeed_three_numbers(measured: pd.DataFrame, model: str = "uneven",
                            precision: str = "bf16", workers: int = 4) -> pd.DataFrame:
    """Per ZeRO stage: the chapter's formula, DeepSpeed's estimator and what the most-loaded
    rank measured (model states at rest after the step, and at the highest moment of the step),
    plus the reduce bucket beside them, which neither formula counts. Bytes."""
    chosen = _choose(measured, model=model, precision=precision, workers=workers)
    rows = []
    for stage, group in chosen.groupby("stage", sort=True):
        states = group.assign(states=_states(group))
        per_phase = states.groupby("phase")["states"].max()
        highest = max(DEEPSPEED_PHASES, key=lambda p: (per_phase.get(p, -1), -DEEPSPEED_PHASES.index(p)))
        estimate = group["deepspeed_estimate_per_gpu"].iloc[0]
        buckets = group[group["measured_buckets"] > 0]
        rows.append({
            "stage": int(stage),
            "chapter [B]": int(group["formula_total"].iloc[0]),
            "DeepSpeed estimator [B]": estimate,
            "measured at rest [B]": int(per_phase["after_step"]),
            "measured, highest [B]": int(per_phase[highest]),
            "highest at": highest,
            "reduce bucket [B]": int(group["measured_buckets"].max()),
            "bucket held": _held(buckets["phase"]),
        })
    frame = pd.DataFrame(rows)
    frame["DeepSpeed estimator [B]"] = frame["DeepSpeed estimator [B]"].astype("Int64")
    return frame


def deepspeed_buffers(buffers: pd.DataFrame, model: str = "uneven", precision: str = "bf16",
                      workers: int = 4) -> pd.DataFrame:
    """The storages DeepSpeed held beyond model states, one row per stage and attribute: bytes
    per rank, when it was held, and what sets its size (bytes)."""
    chosen = _choose(buffers, model=model, precision=precision, workers=workers)
    element = ELEMENT_BYTES[precision]
    rows = []
    for (stage, category, where), group in chosen.groupby(["stage", "category", "where"],
                                                          sort=True):
        size = int(group["bytes"].max())
        if category == "buckets":
            origin = (f"reduce_bucket_size = {REDUCE_BUCKET_SIZE:,} elements x {element} B "
                      f"({precision})")
        else:
            origin = "scalar bookkeeping (gradient norm, overflow flag)"
        rows.append({"stage": int(stage), "category": category, "where": where,
                     "bytes per rank": size, "held": _held(group["phase"]), "size set by": origin})
    return pd.DataFrame(rows)


# --- activations ------------------------------------------------------------------------------------

def activation_case(activations: pd.DataFrame, case: str = "table2") -> pd.DataFrame:
    """One case's saved tensors: each beside the formula terms it stands for (bytes)."""
    chosen = _choose(activations, case=case)
    return (chosen[["item", "terms", "saved_dtype", "saved_shape", "measured_bytes",
                    "formula_bytes", "difference_bytes", "effects"]]
            .replace({"terms": {"": "-"}, "effects": {"": "-"}})
            .reset_index(drop=True))


def activation_explanations(activations: pd.DataFrame) -> list[str]:
    """Each distinct explanation of a saved tensor's difference, with the cases it applies to."""
    differing = activations[activations["explanation"] != "matches"]
    lines = []
    for text, group in differing.groupby("explanation", sort=False):
        cases = ", ".join(pd.unique(group["case"]))
        items = ", ".join(pd.unique(group["item"]))
        lines.append(f"{items} ({cases}): {text}")
    return lines


def activation_summary(activations: pd.DataFrame) -> pd.DataFrame:
    """Per case: measured and formula totals (bytes), the difference, and what explains it."""
    frame = activation_totals(activations)
    mechanisms = activations.groupby("case", sort=False)["effects"].agg(_mechanisms)
    return pd.DataFrame({
        "case": frame["case"], "dtype": frame["dtype"], "dropout": frame["dropout_kernel"],
        "attention": frame["attention"], "recompute": frame["recompute"],
        "measured [B]": frame["measured_bytes"], "formula [B]": frame["formula_bytes"],
        "difference": frame["relative_difference"].map(format_relative),
        "unexplained [B]": frame["unexplained_bytes"],
        "explained by": frame["case"].map(mechanisms),
    })


# --- shipped transformers blocks -----------------------------------------------------------------

def shipped_summary(shipped: pd.DataFrame) -> pd.DataFrame:
    """Per case (block and micro-batch): measured and formula totals (bytes), the difference and
    the mechanisms that explain it."""
    frame = shipped_totals(shipped)
    mechanisms = shipped.groupby("case", sort=False)["effects"].agg(_mechanisms)
    return pd.DataFrame({
        "case": frame["case"], "attention": frame["attention"],
        "KV cache": frame["use_cache"].map({True: "on", False: "off"}),
        "micro-batch": frame["micro_batch"],
        "measured [B]": frame["measured_bytes"], "formula [B]": frame["formula_bytes"],
        "difference": frame["relative_difference"].map(format_relative),
        "unexplained [B]": frame["unexplained_bytes"],
        "explained by": frame["case"].map(mechanisms),
    })


def shipped_mechanisms(shipped: pd.DataFrame) -> pd.DataFrame:
    """Bytes each mechanism adds, one row per mechanism, one column per case (0 where absent)."""
    tidy = shipped_mechanism_totals(shipped)
    wide = tidy.pivot(index="mechanism", columns="case", values="bytes").fillna(0).astype("int64")
    order = [key for key in MECHANISMS if key in wide.index]
    cases = list(pd.unique(shipped["case"]))
    return wide.loc[order, cases].rename_axis(index="mechanism", columns="bytes added")


def shipped_extras(block: str, model, seq_len: int, micro_batch: int = 1) -> pd.DataFrame:
    """What a shipped block's mechanisms would add beyond the formula at a real model's shape:
    per mechanism the bytes one layer adds, how many times the model holds them (every layer,
    or once for what all layers share) and the model's total (bytes).

    It assumes the block saves at that shape what it saved at the measured one: its mechanisms
    are properties of the code (an fp32 upcast, a saved normalised copy), sized by the shapes.
    """
    if block not in SHIPPED_BLOCKS:
        raise ValueError(f"block must be one of {', '.join(SHIPPED_BLOCKS)}, got {block!r}")
    config = get_model(model)
    shaped = at_shape(SHIPPED_BLOCKS[block], config, seq_len)
    rows = []
    for key, size in extra_bytes(shaped, micro_batch).items():
        copies = 1 if key in SHARED_BY_LAYERS else config.layers
        rows.append({"mechanism": key, "per layer [B]": size, "held": copies, "model [B]": copies * size})
    frame = pd.DataFrame(rows)
    frame.attrs.update(block=block, model=config.name, seq_len=seq_len, micro_batch=micro_batch)
    return frame


def sizing_lessons(sharded: pd.DataFrame, buffers: pd.DataFrame, workers: int = 4) -> pd.DataFrame:
    """The three findings of the real runs a reader sizing a job needs, from the records: one row
    each with what was measured, what the chapter's formula says, and the lesson.

    - DeepSpeed's reduce bucket: its bytes per rank in bf16 (``reduce_bucket_size`` elements x 2,
      whatever the model's size);
    - whole-tensor optimizer partitioning (ZeroRedundancyOptimizer): the most-loaded rank's
      optimizer state against an even 1/N share, on the uneven model;
    - FSDP2 with ``reshard_after_forward=False`` (the stage-2 analogue): the most-loaded rank at
      rest and at the forward peak against stage 2's prediction, on the even model.
    """
    bucket = buffers[(buffers["category"] == "buckets") & (buffers["precision"] == "bf16")
                     & (buffers["workers"] == workers)]
    bucket_bytes = int(bucket["bytes"].max())
    zero1 = _choose(sharded, strategy="zero1", model="uneven", workers=workers, phase="rest")
    optimizer = zero1[zero1["category"] == "optimizer"]
    busiest, share = int(optimizer["measured_bytes"].max()), int(optimizer["predicted_bytes"].max())
    keep = rank_totals(_choose(sharded, strategy="fsdp2-keep", model="even", workers=workers))
    predicted = int(keep["predicted_bytes"].max())
    rest = int(keep.loc[keep["phase"] == "rest", "measured_bytes"].max())
    peak = int(keep.loc[keep["phase"] == "peak", "measured_bytes"].max())
    rows = [
        {"finding": "DeepSpeed's reduce bucket (stages 1-3, default settings)",
         "measured": f"{bucket_bytes:,} B on every rank",
         "the formula": "not model state: 0 B",
         "lesson": f"budget {bucket_bytes / 10**9:g} GB per GPU (twice with overlap_comm in stages 1-2), "
                   "or lower reduce_bucket_size"},
        {"finding": f"whole-tensor optimizer partitioning (ZeroRedundancyOptimizer, {workers} ranks)",
         "measured": f"{busiest:,} B of optimizer state on the busiest rank",
         "the formula": f"{share:,} B, an even 1/{workers}",
         "lesson": f"the busiest rank holds {busiest / share:.1f}x its share: with one dominant tensor "
                   "stage 1 saves less than 1/N on the GPU that decides"},
        {"finding": f"FSDP2 reshard_after_forward=False, the stage-2 analogue ({workers} ranks)",
         "measured": f"{rest:,} B at rest, {peak:,} B at the forward peak",
         "the formula": f"{predicted:,} B (stage 2)",
         "lesson": f"at rest only shards ({format_relative(rest / predicted - 1)}), at the forward peak "
                   f"every layer gathered ({format_relative(peak / predicted - 1)}): size it by its peak"},
    ]
    return pd.DataFrame(rows)
