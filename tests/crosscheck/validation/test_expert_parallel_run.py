"""The expert-parallel MoE layer's all-to-alls (data/validation_expert_parallel.csv) against zerolib.

Without torch: the predictions by hand and the record (every byte explained, versions). With
torch (marker ``torch``): the run is made again and must match its record exactly.

By hand: tiny-moe, hidden 16, 8 experts, top-2, one MoE layer; 12 x 3 = 36 tokens per rank in
fp32. Capacity factor 1.25: ceil(1.25 x 2 x 36 / 8) = ceil(11.25) = 12 rows per expert, 8 x 12 =
96 rows x 16 x 4 B = 6,144 B per all-to-all, 4 of them: 24,576 B. Dropless: 36 x 2 = 72 rows, 4,608
B per all-to-all, 18,432 B.
"""
from __future__ import annotations

import pytest
from conftest import REPO, optional_import

from zerolib.crosscheck.validation.explain_expert_parallel import (
    COLUMNS,
    compare_expert_parallel,
    predicted,
)
from zerolib.crosscheck.validation.records import (
    EXPERT_PARALLEL_FILE,
    VERSION_COLUMNS,
    differences,
    read_csv,
    to_csv_text,
)

TORCH_HINT = "install PyTorch: pip install torch==2.13.0"


@pytest.fixture(scope="module")
def record():
    return read_csv(REPO / "data" / EXPERT_PARALLEL_FILE)


@pytest.mark.parametrize("workers", [2, 4])
def test_predictions_by_hand(workers):
    assert predicted("capacity", workers) == (4, 24_576, 96)
    assert predicted("dropless", workers) == (4, 18_432, 72)


def test_record_columns_and_versions(record):
    assert list(record.columns) == [*COLUMNS, *VERSION_COLUMNS]
    assert sorted(set(zip(record.routing, record.workers))) == [
        ("capacity", 2), ("capacity", 4), ("dropless", 2), ("dropless", 4)]
    assert len(record) == 2 * (2 + 4)
    assert record.torch_version.str.startswith("2.").all()


def test_capacity_routing_matches_to_the_byte(record):
    rows = record[record.routing == "capacity"]
    assert (rows.measured_bytes == 24_576).all() and (rows.measured_calls == 4).all()
    assert (rows.explanation == "matches").all()


def test_dropless_every_byte_explained(record):
    rows = record[record.routing == "dropless"]
    assert (rows.difference_bytes == rows.explained_bytes).all()
    assert not rows.explanation.str.contains("UNEXPLAINED").any()
    # 5 calls: the 4 of the prediction and one exchange of 8 int64 counts (64 B)
    assert (rows.measured_calls == 5).all()
    for workers, group in rows.groupby("workers"):
        # the imbalance is rows moving between ranks: over all ranks it cancels
        assert (group.measured_bytes - 64).sum() == 18_432 * workers


def test_unexplained_is_named():
    import pandas as pd
    frame = pd.DataFrame([{"routing": "capacity", "workers": 2, "rank": 0, "kind": "all_to_all",
                           "measured_calls": 4, "measured_bytes": 24_580, "received_rows": 96}])
    row = compare_expert_parallel(frame).iloc[0]
    assert row.explanation == "UNEXPLAINED (+4 B)"


@pytest.mark.torch
@pytest.mark.slow
def test_rerun_matches_record(record, tmp_path):
    optional_import("torch", TORCH_HINT)
    from zerolib.crosscheck.validation.expert_parallel_run import record as write
    from zerolib.crosscheck.validation.expert_parallel_run import validate_expert_parallel
    fresh = validate_expert_parallel()
    found = differences(record, fresh)
    hint = "re-record with python -m zerolib.crosscheck.validation.expert_parallel_run data"
    assert found == [], hint + ":\n" + "\n".join(found)
    assert write(fresh, tmp_path).read_text() == to_csv_text(fresh)
