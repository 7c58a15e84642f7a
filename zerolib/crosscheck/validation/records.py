"""The recorded validation runs in ``data/``: writing them deterministically and atomically,
finding and reading them back, and telling whether a fresh run still matches.

Plain Python (pandas): the notebook and the tests read these files without PyTorch.
"""
from __future__ import annotations

import io
import os
from pathlib import Path
from typing import TYPE_CHECKING

from zerolib._io import atomic_write
from zerolib.core.inputs import read_small_file

if TYPE_CHECKING:  # pandas is imported where a frame is built: commands that build none start without it
    import pandas as pd

SHARDED_FILE = "validation_sharded.csv"
ACTIVATIONS_FILE = "validation_activations.csv"
SHIPPED_FILE = "shipped_activations.csv"
TENSOR_PARALLEL_FILE = "validation_tensor_parallel.csv"
COMMUNICATION_PYTORCH_FILE = "communication_pytorch.csv"
COMMUNICATION_DEEPSPEED_FILE = "communication_deepspeed.csv"
EXPERT_PARALLEL_FILE = "validation_expert_parallel.csv"
MECHANISMS_FILE = "mechanisms_measured.csv"
VERSION_COLUMNS = ("torch_version", "python_version", "platform")
# The shipped blocks also depend on the transformers release that implements them.
SHIPPED_VERSION_COLUMNS = ("torch_version", "transformers_version", "python_version", "platform")
# The mechanisms also run megatron-core's vocabulary-parallel loss and torchao's Float8.
MECHANISMS_VERSION_COLUMNS = ("torch_version", "transformers_version", "megatron_core_version",
                              "torchao_version", "python_version", "platform")
FLOAT_FORMAT = "%.6f"  # relative differences; every byte count is an integer


def with_versions(frame: pd.DataFrame, versions: dict, columns=VERSION_COLUMNS) -> pd.DataFrame:
    """``frame`` with the version ``columns`` (same value on every row) appended."""
    missing = [c for c in columns if c not in versions]
    if missing:
        raise ValueError(f"versions must name {', '.join(columns)}; missing {missing}")
    return frame.assign(**{column: str(versions[column]) for column in columns})


def to_csv_text(frame: pd.DataFrame) -> str:
    """The exact text a record holds: fixed float format, "\\n" line ends, no index."""
    buffer = io.StringIO()
    frame.to_csv(buffer, index=False, float_format=FLOAT_FORMAT, lineterminator="\n")
    return buffer.getvalue()


def write_csv(frame: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write :func:`to_csv_text` of ``frame`` atomically."""
    atomic_write(path, to_csv_text(frame))
    return Path(path)


# A record is a few kilobytes; a data folder given on the command line is read up to this size
# per file (a regular file, checked before it is read).
MAX_RECORD_BYTES = 10_000_000


def read_csv(path: str | os.PathLike | io.StringIO) -> pd.DataFrame:
    """A recorded file as written (empty text stays empty, not NaN); a path is read bounded
    (:data:`MAX_RECORD_BYTES`, a regular file), a ValueError naming it otherwise."""
    import pandas as pd
    if isinstance(path, (str, os.PathLike)):
        path = io.StringIO(read_small_file(path, "a recorded run's CSV", MAX_RECORD_BYTES))
    return pd.read_csv(path, keep_default_na=False)


def differences(recorded: pd.DataFrame, fresh: pd.DataFrame, limit: int = 5) -> list[str]:
    """Lines where a fresh run no longer matches a record (version columns aside).

    Both frames are compared as the CSV text they would be written as, so a fresh run matches
    exactly when re-recording it would rewrite the same measurements.
    """
    def lines(frame):
        kept = frame.drop(columns=[c for c in MECHANISMS_VERSION_COLUMNS if c in frame.columns])
        return to_csv_text(read_csv(io.StringIO(to_csv_text(kept)))).splitlines()

    old, new = lines(recorded), lines(fresh)
    if old[:1] != new[:1]:
        return [f"columns differ: recorded {old[:1]}, fresh {new[:1]}"]
    found = []
    if len(old) != len(new):
        found.append(f"recorded {len(old) - 1} rows, fresh run {len(new) - 1}")
    found += [f"recorded: {a}\n   fresh: {b}" for a, b in zip(old[1:], new[1:]) if a != b]
    return found[:limit]
