"""The recorded BF16_Optimizer run (data/deepspeed_bf16_optimizer.csv: DeepSpeed 0.19.8, bf16
with fp32 gradient accumulation at ZeRO stage 1, on the CPU) against the layout a ds_config
saying so is read as, 2 + 6 + 12 bytes per parameter. Reads the file only: needs no DeepSpeed.

By hand: the ``even`` stack has 1,837,312 parameters (a multiple of 2 x 4: no padding), so at
the backward and the step the rank holds 2P (bf16 parameters) + 2P (bf16 gradients) + 4P (the
fp32 buffer) + 12P/N (fp32 master and moments of its shard) + 4 bytes (AdamW's step of the one
flat fp32 tensor): 25,722,372 bytes on 2 ranks, 20,210,436 on 4. The ``uneven`` stack (1,838,337)
is padded to a multiple of 2N elements (3 more on 2 ranks, 7 on 4; 6 bytes each in the
parameters and the buffer) and its shard is one element over ceil(P/N) (12 bytes): +34 and +58."""
from __future__ import annotations

import pandas as pd
import pytest

from zerolib.crosscheck.validation.deepspeed_run import (
    BF16_OPTIMIZER_FILE,
    COLUMNS,
    DEEPSPEED_MODELS,
    formula_columns,
)
from zerolib.paths import DATA_DIR

P = {"even": 1_837_312, "uneven": 1_838_337}
OVER_LAYOUT = {("even", 2): 4, ("even", 4): 4, ("uneven", 2): 34, ("uneven", 4): 58}


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return pd.read_csv(DATA_DIR / BF16_OPTIMIZER_FILE, keep_default_na=False)


def _states(frame):
    return (frame.measured_parameters + frame.measured_gradients + frame.measured_optimizer
            + frame.measured_master_weights)


def test_shape_versions_and_formula_columns(table):
    assert tuple(table.columns) == COLUMNS
    assert set(table.stage) == {1} and set(table.precision) == {"bf16-fp32-accum"}
    assert set(table.deepspeed_version) == {"0.19.8"} and set(table.formula_layout) == {
        "deepspeed-bf16-optimizer"}
    specs = {m.name: m for m in DEEPSPEED_MODELS}
    for _, row in table.iterrows():
        expected = formula_columns(specs[row.model], row.workers, 1, row.precision)
        assert {k: row[k] for k in expected} == expected


@pytest.mark.parametrize("model,workers", list(OVER_LAYOUT))
def test_the_layout_holds_at_the_backward_and_the_step(table, model, workers):
    rows = table[(table.model == model) & (table.workers == workers)]
    busy = rows[rows.phase.isin(["after_backward", "before_optimizer_step"])]
    assert set(_states(busy) - busy.formula_total) == {OVER_LAYOUT[model, workers]}
    assert set(busy.measured_buckets) == {0}                     # no ZeRO reduce bucket
    padded = (rows.measured_parameters // 2).iloc[0]             # the flat bf16 buffer's elements
    assert padded - P[model] in (0, 3, 7)
    rest = rows[rows.phase.isin(["after_forward", "after_step"])]
    assert set(rest.measured_gradients) == {4 * padded}           # the fp32 buffer, kept
    assert set(busy.measured_gradients) == {4 * padded + 2 * P[model]}   # + the bf16 .grad
