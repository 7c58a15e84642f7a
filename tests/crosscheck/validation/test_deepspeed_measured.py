"""The recorded DeepSpeed run (data/deepspeed_measured.csv): shape, versions, and that its
formula and estimator columns still match zerolib. Reads the file only: needs no DeepSpeed.

Regenerate with (see data/deepspeed_convention.md for the install):
    DS_ACCELERATOR=cpu python -m zerolib.crosscheck.validation.deepspeed_run --out data/deepspeed_measured.csv
"""
from __future__ import annotations

import math

import pandas as pd
import pytest

from zerolib.core.memory.accounting import model_state
from zerolib.crosscheck.deepspeed_estimator import (
    DEEPSPEED_VERSION,
    estimate_zero2,
    estimate_zero3,
)
from zerolib.crosscheck.validation.deepspeed_run import (
    BUFFER_COLUMNS,
    COLUMNS,
    DEEPSPEED_MODELS,
    DEEPSPEED_PHASES,
    MEASURED_CATEGORIES,
    PRECISIONS,
    buffers_path,
    formula_columns,
)
from zerolib.paths import DATA_DIR

DATA = DATA_DIR / "deepspeed_measured.csv"

# Hand-counted sizes of the two Linear stacks (weights + biases):
#   512 -> 1024: 524,288 + 1,024 = 525,312;  1024 -> 1024: 1,048,576 + 1,024 = 1,049,600
#   1024 -> 256: 262,144 + 256 = 262,400;     1024 -> 257: 263,168 + 257 = 263,425
EXPECTED_SIZES = {"even": (1_837_312, 1_049_600), "uneven": (1_838_337, 1_049_600)}
PARAM_TENSORS = 6  # three weights and three biases: AdamW keeps one 4-byte step per tensor
REDUCE_BUCKET_SIZE = 500_000_000  # DeepSpeed's default zero_optimization.reduce_bucket_size
ELEMENT_BYTES = {"fp32": 4, "bf16": 2}


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return pd.read_csv(DATA, keep_default_na=False, na_values={"deepspeed_estimate_per_gpu": [""],
                                                               "deepspeed_estimate_per_cpu": [""]})


@pytest.fixture(scope="module")
def buffers() -> pd.DataFrame:
    return pd.read_csv(buffers_path(DATA))


def model_states(frame: pd.DataFrame) -> pd.Series:
    return (frame.measured_parameters + frame.measured_gradients + frame.measured_optimizer
            + frame.measured_master_weights)


def test_columns_and_complete_grid(table):
    assert tuple(table.columns) == COLUMNS
    assert set(table.model) == {m.name for m in DEEPSPEED_MODELS}
    assert set(table.precision) == set(PRECISIONS)
    assert set(table.workers) == {2, 4}
    assert set(table.stage) == {0, 1, 2, 3}
    assert set(table.phase) == set(DEEPSPEED_PHASES)
    keys = ["model", "precision", "workers", "stage", "phase"]
    for key, group in table.groupby(keys):
        workers = key[2]
        assert sorted(group["rank"]) == list(range(workers)), key
    # every combination present: 2 models x 2 precisions x (2 + 4 ranks) x 4 stages x 5 phases
    assert len(table) == 2 * 2 * 6 * 4 * len(DEEPSPEED_PHASES)


def test_versions_recorded_and_match_the_convention_followed(table):
    assert set(table.deepspeed_version) == {DEEPSPEED_VERSION}
    (torch_version,) = set(table.torch_version)
    assert torch_version.startswith("2.")
    (python_version,) = set(table.python_version)
    assert python_version.count(".") == 2
    assert set(table.backend) <= {"gloo", "ccl"}


def test_model_sizes(table):
    for spec in DEEPSPEED_MODELS:
        assert (spec.numel, spec.largest_layer_params) == EXPECTED_SIZES[spec.name]
        rows = table[table.model == spec.name]
        assert set(rows.params) == {spec.numel}
        assert set(rows.largest_layer_params) == {spec.largest_layer_params}


def test_measured_bytes_add_up(table, buffers):
    measured = [f"measured_{c}" for c in MEASURED_CATEGORIES]
    assert (table[measured] >= 0).all().all()
    assert (table[measured].sum(axis=1) == table.measured_total).all()
    assert tuple(buffers.columns) == BUFFER_COLUMNS
    keys = ["model", "precision", "workers", "rank", "stage", "phase"]
    listed = buffers.pivot_table(index=keys, columns="category", values="bytes", aggfunc="sum",
                                 fill_value=0)
    merged = table.set_index(keys).join(listed, how="left").fillna(0)
    assert (merged["buckets"] == merged.measured_buckets).all()
    assert (merged["other"] == merged.measured_other).all()


def test_formula_columns_match_zerolib(table):
    for row in table.itertuples():
        assert row.formula_layout == PRECISIONS[row.precision]
        state = model_state(row.params, row.workers, row.stage, row.formula_layout)
        assert (row.formula_parameters, row.formula_gradients, row.formula_optimizer,
                row.formula_total) == (int(state.parameters), int(state.gradients),
                                       int(state.optimizer), int(state.total))


def test_estimator_columns_match_zerolib_deepspeed(table):
    for row in table.itertuples():
        if row.stage == 2:
            estimate = estimate_zero2(row.params, row.workers, 1, cpu_offload=False)
            assert row.deepspeed_estimator == "zero2 v0.14.3"
        elif row.stage == 3:
            estimate = estimate_zero3(row.params, row.largest_layer_params, row.workers, 1,
                                      cpu_offload=False, cpu_offload_params=False, zero_init=False)
            assert row.deepspeed_estimator == "zero3"
        else:  # DeepSpeed has no estimator for stages 0 and 1
            assert row.deepspeed_estimator == ""
            assert math.isnan(row.deepspeed_estimate_per_gpu)
            continue
        assert row.deepspeed_estimate_per_gpu == estimate.per_gpu
        assert row.deepspeed_estimate_per_cpu == estimate.per_cpu


def test_formula_columns_reject_an_unknown_precision():
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16"):
        formula_columns(DEEPSPEED_MODELS[0], 4, 3, "fp16")


def test_hand_checked_estimator_value(table):
    # uneven model, 4 GPUs, ZeRO-3 without offload: 4 * 1,049,600 + 18 * 1,838,337 // 4
    # = 4,198,400 + 8,272,516 = 12,470,916 bytes.
    rows = table[(table.model == "uneven") & (table.workers == 4) & (table.stage == 3)]
    assert set(rows.deepspeed_estimate_per_gpu) == {12_470_916}


# --- The facts data/deepspeed_convention.md draws from the file ----------------------------

def test_stage0_matches_the_formula_plus_step_counters(table):
    rows = table[(table.stage == 0) & (table.phase == "after_backward")]
    extra = model_states(rows) - rows.formula_total
    assert set(extra) == {4 * PARAM_TENSORS}


def test_reduce_buckets_have_the_default_size(table):
    element = table.precision.map(ELEMENT_BYTES)
    full = REDUCE_BUCKET_SIZE * element
    stage3 = table.stage == 3
    assert (table.measured_buckets[stage3] == full[stage3]).all()  # kept for the whole run
    during = table.stage.isin([1, 2]) & (table.phase == "before_reduction")
    assert (table.measured_buckets[during] == full[during]).all()  # only while reducing
    assert (table.measured_buckets[~stage3 & ~during] == 0).all()


def test_bf16_stage3_at_rest_is_the_chapter_formula(table):
    rows = table[(table.precision == "bf16") & (table.stage == 3) & (table.phase == "after_step")]
    extra = model_states(rows) - rows.formula_total
    # Small biases stay whole on every rank (stage3_param_persistence_threshold), plus padding
    # and step counters: a few kB on ~7 MB.
    assert (extra > 0).all() and (extra / rows.formula_total < 1e-3).all()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_zero_keeps_an_fp32_master_shard_in_both_precisions(table, precision):
    # Stages 1-3 hold momentum + variance + an fp32 master copy of their shard: 12 bytes per
    # element of ceil(P / N), plus DeepSpeed's padding (at most one element per shard here)
    # and the 4-byte step counter. The fp32 formula counts only 8 of those 12.
    rows = table[(table.precision == precision) & (table.stage > 0)]
    shard = -(-rows.params // rows.workers)
    extra = rows.measured_optimizer + rows.measured_master_weights - 12 * shard
    assert extra.between(4, 4 + 12).all()
    assert (rows.measured_master_weights >= 4 * shard).all()
    formula_widths = {"fp32": 8, "bf16": 12}
    assert (rows.formula_optimizer == formula_widths[precision] * shard).all()
