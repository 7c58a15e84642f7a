"""Published measured peaks of real GPU training runs against zerolib's prediction
(``data/measured_peaks.csv``, ``data/measured_peaks.md``).

Each row holds a run's full configuration as its source states it, what was measured
(``torch.cuda`` max reserved, max allocated, or torchtune's peak active bytes) in bytes, and,
where zerolib can describe the run, the run's flat fields (:data:`zerolib.core.run.FIELDS`) as
JSON in ``run``: :func:`predict` answers it with :func:`zerolib.core.estimate.estimate`. A row
within 10 % states ``tolerance`` 0.1; a row outside states the tolerance it keeps and its
``finding``; a row zerolib cannot describe yet has no ``run`` and says why in ``finding``."""
from __future__ import annotations

import json
from dataclasses import dataclass

import pandas as pd

from zerolib.core.catalogue.models import TransformerConfig
from zerolib.core.estimate import estimate
from zerolib.core.megatron_launch import run_from_megatron_args
from zerolib.core.run import Run
from zerolib.paths import data_file

FILENAME = "measured_peaks.csv"
MAX_FILE_BYTES = 1_000_000


@dataclass(frozen=True)
class Prediction:
    """zerolib's peaks of one measured run (bytes) and the one compared with the measurement."""

    allocated: int      # torch.cuda.max_memory_allocated's prediction
    reserved: int       # max_memory_reserved's
    compared: int       # the one the row measured (active bytes are compared with allocated)
    ratio: float        # compared / measured


def run_of(fields: dict) -> Run:
    """The Run a row's ``run`` JSON describes: a preset's name or a TransformerConfig's fields
    as ``model``, or a Megatron-LM launch line as ``megatron_args`` (read by
    :func:`zerolib.core.megatron_launch.run_from_megatron_args`), ``gpus``, and flat fields
    (lists for tuples; beside a launch line, what the line does not say)."""
    f = dict(fields)
    gpus = f.pop("gpus")
    for name in ("stages", "layout"):
        if isinstance(f.get(name), list):
            f[name] = tuple(f[name])
    if "megatron_args" in f:
        run = run_from_megatron_args(f.pop("megatron_args"), gpus=gpus)
        return run.replace(**f) if f else run
    model = f.pop("model")
    if isinstance(model, dict):
        model = TransformerConfig(**model)
    return Run.of(model, gpus, **f)


def predict(row) -> Prediction | None:
    """zerolib's prediction of one row of the table (None: the row has no run)."""
    if not isinstance(row["run"], str) or not row["run"]:
        return None
    answer = estimate(run_of(json.loads(row["run"]))).as_dict()["stages"][0]
    allocated, reserved = answer["max_memory_allocated"], answer["max_memory_reserved"]
    compared = reserved if row["measured"] == "reserved" else allocated
    return Prediction(allocated, reserved, compared, compared / int(row["measured_bytes"]))


def measured_peaks(data_dir=None) -> pd.DataFrame:
    """The table of measured peaks (``data/measured_peaks.csv``), bounded in size."""
    path = data_file(data_dir, FILENAME, "the published measured peaks")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise ValueError(f"{path.name} is larger than {MAX_FILE_BYTES:,} bytes")
    return pd.read_csv(path, dtype={"run": str, "finding": str}, keep_default_na=False)


def predicted_frame(data_dir=None) -> pd.DataFrame:
    """The predicted rows of the table with zerolib's ``predicted_bytes`` (the peak compared
    with the measurement) and ``ratio``, computed now: what the chapter's figure draws."""
    rows = []
    for _, row in measured_peaks(data_dir).iterrows():
        found = predict(row)
        if found is not None:
            rows.append({"id": row["id"], "measured": row["measured"],
                         "measured_bytes": int(row["measured_bytes"]),
                         "predicted_bytes": found.compared, "ratio": found.ratio,
                         "tolerance": row["tolerance"], "finding": row["finding"]})
    return pd.DataFrame(rows)
