"""Run the validations and return the comparison tables (needs PyTorch).

``validate(workers)`` is what ``zerolib validate`` and the tests call; ``record`` writes the
three files of ``data/`` that the notebook reads.
"""
from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from zerolib.crosscheck.validation.activation_run import measure_activations
from zerolib.crosscheck.validation.explain_activations import compare_activations
from zerolib.crosscheck.validation.explain_sharded import compare_sharded
from zerolib.crosscheck.validation.explain_tensor_parallel import compare_tensor_parallel
from zerolib.crosscheck.validation.records import (
    ACTIVATIONS_FILE,
    SHARDED_FILE,
    TENSOR_PARALLEL_FILE,
    with_versions,
    write_csv,
)
from zerolib.crosscheck.validation.setups import check_workers
from zerolib.crosscheck.validation.sharded_run import measure_sharded
from zerolib.crosscheck.validation.tensor_parallel_run import measure_tensor_parallel


def versions() -> dict:
    """What the measurement ran on (recorded beside the numbers)."""
    return {"torch_version": torch.__version__, "python_version": platform.python_version(),
            "platform": f"{platform.system()}-{platform.machine()}"}


@dataclass(frozen=True)
class Validation:
    sharded: pd.DataFrame       # explain_sharded.compare_sharded + version columns
    activations: pd.DataFrame   # explain_activations.compare_activations + version columns
    tensor_parallel: pd.DataFrame  # explain_tensor_parallel.compare_tensor_parallel + versions


def validate(workers=(2, 4)) -> Validation:
    """Measure the sharded runs and the tensor-parallel runs for each worker count, and the
    activations of one block."""
    counts = check_workers(workers)
    measured = pd.DataFrame([row for count in counts for row in measure_sharded(count)])
    parallel = pd.DataFrame([row for count in counts for row in measure_tensor_parallel(count)])
    stamp = versions()
    return Validation(
        sharded=with_versions(compare_sharded(measured), stamp),
        activations=with_versions(compare_activations(pd.DataFrame(measure_activations())), stamp),
        tensor_parallel=with_versions(compare_tensor_parallel(parallel), stamp))


def record(result: Validation, data_dir: str | Path) -> tuple[Path, Path, Path]:
    """Write the three tables into ``data_dir`` (atomically)."""
    return (write_csv(result.sharded, Path(data_dir, SHARDED_FILE)),
            write_csv(result.activations, Path(data_dir, ACTIVATIONS_FILE)),
            write_csv(result.tensor_parallel, Path(data_dir, TENSOR_PARALLEL_FILE)))
