"""Run the validations and return the comparison tables (needs PyTorch; the shipped blocks
also need transformers).

``validate(workers)`` is what ``zerolib validate`` and the tests call; ``validate_shipped()``
measures only the shipped transformer blocks; ``record`` writes the files of ``data/`` that the
notebooks read.
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
from zerolib.crosscheck.validation.explain_shipped import compare_shipped
from zerolib.crosscheck.validation.explain_tensor_parallel import compare_tensor_parallel
from zerolib.crosscheck.validation.records import (
    ACTIVATIONS_FILE,
    SHARDED_FILE,
    SHIPPED_FILE,
    SHIPPED_VERSION_COLUMNS,
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
    """Each comparison table (with version columns), or None where it was not measured."""

    sharded: pd.DataFrame | None = None          # explain_sharded.compare_sharded
    activations: pd.DataFrame | None = None      # explain_activations.compare_activations
    shipped: pd.DataFrame | None = None          # explain_shipped.compare_shipped
    tensor_parallel: pd.DataFrame | None = None  # explain_tensor_parallel.compare_tensor_parallel

    def files(self) -> tuple[tuple[pd.DataFrame, str], ...]:
        """(table, file name in data/) of every table measured."""
        named = ((self.sharded, SHARDED_FILE), (self.activations, ACTIVATIONS_FILE),
                 (self.shipped, SHIPPED_FILE), (self.tensor_parallel, TENSOR_PARALLEL_FILE))
        return tuple((frame, name) for frame, name in named if frame is not None)


def validate_shipped() -> pd.DataFrame:
    """Measure the shipped GPT-2 and Llama blocks (seconds; no extra processes)."""
    import transformers

    from zerolib.crosscheck.validation.shipped_run import measure_shipped

    stamp = {**versions(), "transformers_version": transformers.__version__}
    return with_versions(compare_shipped(pd.DataFrame(measure_shipped())), stamp,
                         SHIPPED_VERSION_COLUMNS)


def validate(workers=(2, 4)) -> Validation:
    """Measure the sharded and tensor-parallel runs for each worker count, the activations of
    the chapter's own GPT block and those of the shipped blocks."""
    counts = check_workers(workers)
    measured = pd.DataFrame([row for count in counts for row in measure_sharded(count)])
    parallel = pd.DataFrame([row for count in counts for row in measure_tensor_parallel(count)])
    stamp = versions()
    return Validation(
        sharded=with_versions(compare_sharded(measured), stamp),
        activations=with_versions(compare_activations(pd.DataFrame(measure_activations())), stamp),
        shipped=validate_shipped(),
        tensor_parallel=with_versions(compare_tensor_parallel(parallel), stamp))


def record(result: Validation, data_dir: str | Path) -> tuple[Path, ...]:
    """Write the tables the run has into ``data_dir`` (atomically)."""
    return tuple(write_csv(frame, Path(data_dir, name)) for frame, name in result.files())
