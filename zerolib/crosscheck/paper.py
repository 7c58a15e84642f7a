"""The ZeRO paper's published model-state numbers, side by side with zerolib's.

Source: Rajbhandari, Rasley, Ruwase, He, "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", SC20 (arXiv 1910.02054). The printed values are transcribed, with their
citation and the reading of each column's rounding, in ``data/zero_paper_*.csv`` and
``data/zero_paper.md``:

- Figure 1 (and Sec. V-A/B/C, which quote it): a 7.5B model, 64-way data parallelism, K = 12;
- Table I (SC20) / Table 1 (arXiv): per-device GB for 7.5B, 128B and 1T models, DP 1 to 1024;
- Table II (SC20) / Table 2 (arXiv): the largest model that fits a 32GB V100, per MP degree.

Each ``*_comparison`` function returns one tidy row per published value with zerolib's exact
result, the difference, the paper's printing rule applied to zerolib's result, and whether
that reproduces the printed text (``agrees``). The paper's GB are 10**9 bytes.
"""
from __future__ import annotations

from dataclasses import dataclass
from decimal import (
    ROUND_DOWN,
    ROUND_HALF_EVEN,
    ROUND_HALF_UP,
    Decimal,
    InvalidOperation,
)

import numpy as np
import pandas as pd

from zerolib.core.catalogue.devices import Device, get_device
from zerolib.core.memory.accounting import Layout, get_layout, model_state
from zerolib.core.memory.feasibility import largest_model, model_state_fits
from zerolib.core.units import GB
from zerolib.paths import data_file

# Transcriptions in the repository's data/ folder (zerolib.paths.DATA_DIR).
FIGURE1_CSV = "zero_paper_figure1.csv"
TABLE1_CSV = "zero_paper_table1.csv"
MAX_MODEL_CSV = "zero_paper_max_model.csv"

# The paper's "32GB V100" is 32 * 10**9 bytes: that reproduces Table 2 (7.6B with P_os, 14.4B
# with P_os+g at 64-way DP), while the catalogue's 32 GiB V100 would give 8.2B and 15.5B.
PAPER_V100 = Device(
    "v100-32gb-paper", "V100 32GB (ZeRO paper: 32 x 10^9 bytes)", 32 * GB,
    "ZeRO paper (SC20) Tables 1-2: '32GB V100 GPUs'; 32 x 10^9 bytes reproduces Table 2",
)
PAPER_LAYOUT = "mixed-adam"  # 2 + 2 + K bytes per parameter with K = 12 (Sec. III-A)


@dataclass(frozen=True)
class PrintRule:
    """How the paper turned an exact value into the digits it printed.

    ``method`` is "round" (half up: 41.25 -> 41.3) or "truncate" (513.5 -> 513); ``quantum``
    is the last printed place. Trailing zeros are not printed (30.00 -> "30", 7.50 -> "7.5").
    """

    method: str
    quantum: str

    def __post_init__(self):
        if self.method not in ("round", "truncate"):
            raise ValueError(f"method must be 'round' or 'truncate', got {self.method!r}")
        if not isinstance(self.quantum, str):
            raise TypeError(f"quantum must be a decimal as text, like '0.1', got {self.quantum!r}")
        try:
            quantum = Decimal(self.quantum)
        except InvalidOperation:
            quantum = Decimal("NaN")
        if not quantum.is_finite() or quantum <= 0:
            raise ValueError(f"quantum must be a positive decimal, like '0.1', got {self.quantum!r}")

    def apply(self, value: Decimal) -> Decimal:
        mode = ROUND_HALF_UP if self.method == "round" else ROUND_DOWN
        return Decimal(value).quantize(Decimal(self.quantum), rounding=mode)

    def text(self, value: Decimal) -> str:
        """The printed form: the rule applied, trailing zeros dropped."""
        return _plain(self.apply(value))

    def describe(self) -> str:
        what = "rounded half up" if self.method == "round" else "truncated"
        return f"{what} to {self.quantum}"


def _plain(value: Decimal) -> str:
    """Decimal without trailing zeros or exponent: 30.00 -> '30', 16000 -> '16000'."""
    return f"{value.normalize():f}"


# Worked out by comparing exact values with the printed ones (see data/zero_paper.md).
FIGURE1_RULE = PrintRule("round", "0.1")       # 1.875 -> 1.9 rules out truncation
TABLE1_RULES = {
    # (model as printed, stage) -> rule
    ("7.5B", 1): PrintRule("round", "0.1"),     # 30.3515625 -> 30.4, 30.08789 -> 30.1
    ("7.5B", 2): PrintRule("round", "0.1"),     # 41.25 -> 41.3 (half up, not half even)
    ("7.5B", 3): PrintRule("round", "0.01"),    # 1.875 -> 1.88, 0.1171875 -> 0.12
    ("128B", 1): PrintRule("truncate", "1"),    # 513.5 -> 513
    ("128B", 2): PrintRule("truncate", "1"),    # 257.75 -> 257
    ("128B", 3): PrintRule("truncate", "1"),    # all exact integers; rule not determined
    ("1T", 1): PrintRule("truncate", "1"),      # 4187.5 -> 4187, 4011.71875 -> 4011
    ("1T", 2): PrintRule("truncate", "1"),      # 2218.75 -> 2218, 2013.67 -> 2013
    ("1T", 3): PrintRule("truncate", "0.1"),    # 62.5 exact, 15.625 -> 15.6 (either rule)
}
# Table 2: the MP = 1 value in billions to one decimal (7.64 -> 7.6, 14.42 -> 14.4; rounding
# and truncation agree), multiplied by the MP degree; 500B and above printed in T to 0.1T.
MAX_MODEL_RULE = PrintRule("round", "0.1")
MAX_MODEL_T_RULE = PrintRule("round", "0.1")

_COLUMNS = {
    FIGURE1_CSV: ("paper_label", "stage", "params", "dp_degree", "optimizer_multiplier_k",
                  "published_gb"),
    TABLE1_CSV: ("model", "params", "dp_degree", "paper_label", "stage", "published_gb", "bold"),
    MAX_MODEL_CSV: ("mp_degree", "gpus", "dp_degree", "kind", "paper_label", "stage", "printed",
                    "published_params"),
}


def _read(data_dir, filename: str, text_columns: tuple[str, ...]) -> pd.DataFrame:
    """Read a transcription, keeping printed numbers as text so no digit is lost."""
    path = data_file(data_dir, filename, "the transcribed ZeRO paper values")
    frame = pd.read_csv(path, dtype={c: str for c in text_columns}, keep_default_na=False)
    missing = [c for c in _COLUMNS[filename] if c not in frame.columns]
    if missing:
        raise ValueError(f"{path} lacks the column(s) {', '.join(missing)}")
    if frame.empty:
        raise ValueError(f"{path} holds no rows")
    return frame


def load_figure1(data_dir=None) -> pd.DataFrame:
    """Figure 1's four per-device totals (GB) as printed, one row per strategy."""
    frame = _read(data_dir, FIGURE1_CSV, ("published_gb",))
    return frame.rename(columns={"published_gb": "printed"}).assign(
        published_gb=lambda f: f["printed"].astype(float))


def load_table1(data_dir=None) -> pd.DataFrame:
    """Table 1's 54 per-device values (GB) as printed, one row per model, DP degree, stage."""
    frame = _read(data_dir, TABLE1_CSV, ("published_gb", "bold", "model"))
    if not frame["bold"].isin(["true", "false"]).all():
        raise ValueError(f"{TABLE1_CSV}: bold must be true or false")
    return frame.rename(columns={"published_gb": "printed"}).assign(
        published_gb=lambda f: f["printed"].astype(float),
        bold=lambda f: f["bold"] == "true")


def load_max_model(data_dir=None) -> pd.DataFrame:
    """Table 2's largest models (theoretical and measured), one row per printed cell."""
    return _read(data_dir, MAX_MODEL_CSV, ("printed",))


def _exact_gb(n_bytes) -> list[Decimal]:
    return [Decimal(int(b)) / Decimal(GB) for b in np.ravel(n_bytes)]


def _agreement(frame: pd.DataFrame, exact: list[Decimal], rules: list[PrintRule]) -> pd.DataFrame:
    """Columns shared by the GB comparisons: difference, the rule, its text, agreement."""
    computed_as_printed = [rule.text(value) for rule, value in zip(rules, exact)]
    return frame.assign(
        computed_gb=[float(v) for v in exact],
        difference_gb=[float(v - Decimal(p)) for v, p in zip(exact, frame["printed"])],
        print_rule=[rule.describe() for rule in rules],
        computed_as_printed=computed_as_printed,
        agrees=[c == _plain(Decimal(p)) for c, p in zip(computed_as_printed, frame["printed"])],
    )


def figure1_comparison(data_dir=None, layout: str | Layout = PAPER_LAYOUT) -> pd.DataFrame:
    """Figure 1 (7.5B, N_d = 64, K = 12): published GB beside zerolib's per-worker bytes."""
    frame = load_figure1(data_dir)
    state = model_state(frame["params"].to_numpy(), frame["dp_degree"].to_numpy(),
                        frame["stage"].to_numpy(), get_layout(layout))
    frame = frame.assign(computed_bytes=state.total)
    return _agreement(frame, _exact_gb(state.total), [FIGURE1_RULE] * len(frame))


def memory_table_comparison(data_dir=None, layout: str | Layout = PAPER_LAYOUT,
                            device: str | Device = PAPER_V100) -> pd.DataFrame:
    """Table 1: published per-device GB beside zerolib's, for every model, DP degree, stage.

    ``fits_device`` says whether zerolib's bytes fit ``device``; ``first_fit`` marks, per model
    and stage, the smallest printed DP degree that fits, which is what the paper set in bold.
    """
    frame = load_table1(data_dir)
    unknown = sorted(set(zip(frame["model"], frame["stage"])) - set(TABLE1_RULES))
    if unknown:
        raise ValueError(f"{TABLE1_CSV}: no printing rule for (model, stage) {unknown}")
    params = frame["params"].to_numpy()
    gpus = frame["dp_degree"].to_numpy()
    stage = frame["stage"].to_numpy()
    layout = get_layout(layout)
    state = model_state(params, gpus, stage, layout)
    rules = [TABLE1_RULES[key] for key in zip(frame["model"], frame["stage"])]
    frame = _agreement(frame.assign(computed_bytes=state.total), _exact_gb(state.total), rules)
    frame["fits_device"] = model_state_fits(params, gpus, stage, layout, get_device(device))
    smallest = (frame[frame["fits_device"]].groupby(["model", "stage"])["dp_degree"].min()
                .rename("smallest_fitting_dp"))
    frame = frame.join(smallest, on=["model", "stage"])
    frame["first_fit"] = frame["dp_degree"] == frame["smallest_fitting_dp"]
    return frame.drop(columns="smallest_fitting_dp")


def _max_model_text(per_replica_params: int, mp_degree: int) -> str:
    """Table 2's printing: the MP = 1 value to 0.1B, times MP; T from 500B up."""
    billions = MAX_MODEL_RULE.apply(Decimal(int(per_replica_params)) / Decimal(10**9))
    value = billions * int(mp_degree)
    if value >= 500:
        return MAX_MODEL_T_RULE.text(value / 1000) + "T"
    return _plain(value) + "B"


def max_model_comparison(data_dir=None, layout: str | Layout = PAPER_LAYOUT,
                         device: str | Device = PAPER_V100) -> pd.DataFrame:
    """Table 2: the largest model per MP degree and stage, published beside zerolib's.

    zerolib has no model parallelism; with MP degree m each GPU holds 1/m of the model, so
    the largest model is m times ``largest_model`` at the DP degree (GPUs / m = 64). The
    measured sizes (baseline and ZeRO-OS = P_os) sit beside the theoretical rows they bound.
    """
    table = load_max_model(data_dir)
    layout, device = get_layout(layout), get_device(device)
    theory = table[table["kind"] == "theoretical"].drop(columns="kind").reset_index(drop=True)
    measured = (table[table["kind"] == "measured"]
                .set_index(["mp_degree", "stage"])[["printed", "published_params"]]
                .rename(columns={"printed": "measured_printed",
                                 "published_params": "measured_params"}))
    per_replica = np.asarray(largest_model(theory["dp_degree"].to_numpy(),
                                           theory["stage"].to_numpy(), layout, device))
    computed = per_replica * theory["mp_degree"].to_numpy()
    computed_as_printed = [_max_model_text(p, m) for p, m in zip(per_replica, theory["mp_degree"])]
    frame = theory.assign(
        per_replica_params=per_replica,
        computed_params=computed,
        difference_params=computed - theory["published_params"].to_numpy(),
        relative_difference=computed / theory["published_params"].to_numpy() - 1,
        print_rule="MP x (MP=1 value " + MAX_MODEL_RULE.describe() + " B); T from 500B",
        computed_as_printed=computed_as_printed,
        agrees=[c == p for c, p in zip(computed_as_printed, theory["printed"])],
    )
    frame = frame.join(measured, on=["mp_degree", "stage"])
    # Only baseline and P_os were measured: the other rows hold <NA>.
    frame["measured_params"] = frame["measured_params"].astype("Int64")
    frame["measured_share"] = (frame["measured_params"] / frame["computed_params"]).astype("Float64")
    return frame


# --- Reader-facing views (notebook 05) -------------------------------------------------------

def _exact_text(n_bytes) -> list[str]:
    """Exact GB as decimal text, no digit lost: 30351562500 -> '30.3515625'."""
    return [_plain(value) for value in _exact_gb(n_bytes)]


def table1_side_by_side(data_dir=None, layout: str | Layout = PAPER_LAYOUT) -> pd.DataFrame:
    """Table 1 laid out as printed: one row per model and DP degree; per stage, the paper's
    digits beside zerolib's exact GB (as text, so 30.3515625 is not shown as 30.351562)."""
    frame = memory_table_comparison(data_dir, layout)
    frame = frame.assign(exact=_exact_text(frame["computed_bytes"]))
    labels = list(pd.unique(frame["paper_label"]))
    models = list(pd.unique(frame["model"]))
    wide = frame.pivot(index=["model", "dp_degree"], columns="paper_label",
                       values=["printed", "exact"])
    wide = wide.rename(columns={"printed": "paper [GB]", "exact": "zerolib, exact [GB]"})
    wide = wide.swaplevel(0, 1, axis=1)
    wide = wide[[(label, what) for label in labels
                 for what in ("paper [GB]", "zerolib, exact [GB]")]]
    order = sorted(wide.index, key=lambda key: (models.index(key[0]), key[1]))
    return wide.reindex(order).rename_axis(index=["model", "N_d"], columns=["", ""])


def rounding_evidence(data_dir=None, layout: str | Layout = PAPER_LAYOUT) -> pd.DataFrame:
    """The printed cells that tell how the paper rounded: those whose exact value prints
    differently when rounded half up, rounded half to even, or truncated at the printed place.

    Columns: where (Figure 1 or Table 1), model, N_d, label, exact GB (text), the three
    candidate printings, what the paper printed, the rule zerolib applies, and ``agrees``.
    """
    figure = figure1_comparison(data_dir, layout).assign(where="Figure 1", model="7.5B")
    table = memory_table_comparison(data_dir, layout).assign(where="Table 1")
    frame = pd.concat([figure, table], ignore_index=True)
    rules = [FIGURE1_RULE] * len(figure) + [TABLE1_RULES[key] for key in
                                            zip(table["model"], table["stage"])]
    rows = []
    for record, exact, rule in zip(frame.to_dict("records"), _exact_gb(frame["computed_bytes"]),
                                   rules):
        quantum = Decimal(rule.quantum)
        candidates = {mode: _plain(exact.quantize(quantum, rounding=rounding))
                      for mode, rounding in (("rounded half up", ROUND_HALF_UP),
                                             ("rounded half to even", ROUND_HALF_EVEN),
                                             ("truncated", ROUND_DOWN))}
        if len(set(candidates.values())) == 1:
            continue  # every rule prints the same digits: this cell cannot tell them apart
        rows.append({"where": record["where"], "model": record["model"],
                     "N_d": record["dp_degree"], "label": record["paper_label"],
                     "exact [GB]": _plain(exact), **candidates, "printed": record["printed"],
                     "rule": rule.describe(), "agrees": bool(record["agrees"])})
    return pd.DataFrame(rows)


def capacity_readings(data_dir=None, layout: str | Layout = PAPER_LAYOUT) -> pd.DataFrame:
    """Table 2's first row (64-way data parallelism, no model parallelism) under both readings
    of "32GB": 32 x 10^9 bytes (:data:`PAPER_V100`) and 32 GiB (the real V100, ``v100-32gb``).

    Per stage: the printed size, the exact largest model under each reading (parameters) and
    how the paper would have printed it; only 32 x 10^9 bytes reproduces every printed cell.
    """
    table = load_max_model(data_dir)
    first = table[(table["kind"] == "theoretical") & (table["mp_degree"] == 1)]
    layout = get_layout(layout)
    frame = first[["stage", "paper_label", "dp_degree", "printed"]].reset_index(drop=True)
    for name, device in (("32 x 10^9 B", PAPER_V100), ("32 GiB", get_device("v100-32gb"))):
        largest = np.asarray(largest_model(frame["dp_degree"].to_numpy(), frame["stage"].to_numpy(),
                                           layout, device))
        frame[f"largest model, {name}"] = largest
        frame[f"as printed, {name}"] = [_max_model_text(p, 1) for p in largest]
    return frame.rename(columns={"dp_degree": "N_d"})
