"""Tables of the recorded communication runs (``data/communication_*.csv``) for the chapter.

Plain pandas: reading the records needs neither PyTorch nor DeepSpeed.
"""
from __future__ import annotations

import pandas as pd

from zerolib.crosscheck.validation.explain_communication import COMPARED_KINDS
from zerolib.crosscheck.validation.records import (
    COMMUNICATION_DEEPSPEED_FILE,
    COMMUNICATION_PYTORCH_FILE,
    read_csv,
)
from zerolib.paths import data_file

RECORDS = {"pytorch": COMMUNICATION_PYTORCH_FILE, "deepspeed": COMMUNICATION_DEEPSPEED_FILE}


def recorded(engine: str, data_dir=None) -> pd.DataFrame:
    """The recorded comparison of ``engine`` ("pytorch" or "deepspeed") in ``data_dir``
    (None: the repository's data/)."""
    if engine not in RECORDS:
        raise ValueError(f"engine must be one of {', '.join(RECORDS)}, got {engine!r}")
    return read_csv(data_file(data_dir, RECORDS[engine],
                              f"the recorded {engine} communication runs"))


def by_strategy(engine: str, model: str, workers: int, precision: str | None = None,
                rank: int = 0) -> pd.DataFrame:
    """One row per strategy: per kind "measured / predicted" bytes handed by ``rank`` (calls
    in brackets), and the mechanisms behind every difference."""
    frame = recorded(engine)
    frame = frame[(frame["model"] == model) & (frame["workers"] == workers)
                  & (frame["rank"] == rank)]
    if precision is not None:
        frame = frame[frame["precision"] == precision]
    if frame.empty:
        raise ValueError(f"no recorded {engine} run of {model!r} on {workers} workers"
                         + (f" in {precision}" if precision else ""))
    rows = []
    for strategy, group in frame.groupby("strategy", sort=False):
        by_kind = group.set_index("kind")
        row = {"strategy": strategy, "stage": int(group["stage"].iloc[0])}
        for kind in COMPARED_KINDS:
            measured, predicted = (int(by_kind.at[kind, "measured_bytes"]),
                                   int(by_kind.at[kind, "predicted_bytes"]))
            calls = (int(by_kind.at[kind, "measured_calls"]), int(by_kind.at[kind, "predicted_calls"]))
            row[kind] = ("-" if not (measured or predicted) else
                         f"{measured:,} / {predicted:,} ({calls[0]} / {calls[1]})")
        row["unexplained bytes"] = int(group["unexplained_bytes"].abs().sum())
        row["explained by"] = " ".join(dict.fromkeys(k for text in group["effects"]
                                                     for k in text.split())) or "-"
        rows.append(row)
    return pd.DataFrame(rows).set_index("strategy")


def unexplained(engine: str) -> tuple[int, int, int]:
    """(rows, rows with unexplained bytes or calls, unexplained bytes in all) of a record."""
    frame = recorded(engine)
    bad = (frame["unexplained_bytes"] != 0) | (frame["unexplained_calls"] != 0)
    return len(frame), int(bad.sum()), int(frame["unexplained_bytes"].abs().sum())
