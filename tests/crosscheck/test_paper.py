"""zerolib against the ZeRO paper (Rajbhandari et al., SC20, arXiv 1910.02054).

Expected values come from the paper (transcribed in data/zero_paper_*.csv) or from arithmetic
worked by hand in the comments, never from zerolib's output.
"""
from __future__ import annotations

import shutil
from decimal import Decimal

import pandas as pd
import pytest

from zerolib.crosscheck import paper
from zerolib.crosscheck.paper import PrintRule
from zerolib.paths import DATA_DIR


@pytest.fixture(scope="module")
def figure1():
    return paper.figure1_comparison()


@pytest.fixture(scope="module")
def table1():
    return paper.memory_table_comparison()


@pytest.fixture(scope="module")
def max_model():
    return paper.max_model_comparison()


def cell(frame, **where):
    mask = pd.Series(True, index=frame.index)
    for column, value in where.items():
        mask &= frame[column] == value
    rows = frame[mask]
    assert len(rows) == 1, where
    return rows.iloc[0]


# --- the transcription itself ---------------------------------------------------------------

def test_transcriptions_have_every_printed_cell():
    assert len(paper.load_figure1()) == 4
    table1 = paper.load_table1()
    assert len(table1) == 3 * 6 * 3
    assert sorted(table1["dp_degree"].unique()) == [1, 4, 16, 64, 256, 1024]
    assert not table1.duplicated(["model", "dp_degree", "stage"]).any()
    max_model = paper.load_max_model()
    assert len(max_model) == 5 * 6
    assert (max_model["gpus"] == 64 * max_model["mp_degree"]).all()


def test_first_row_of_table1_is_16_bytes_per_parameter():
    # Paper: "without ZeRO, the memory consumption is equal to the first row in the table".
    first = paper.load_table1().query("dp_degree == 1")
    expected = {"7.5B": "120", "128B": "2048", "1T": "16000"}  # 16 * 7.5, 16 * 128, 16 * 1000
    assert all(first["printed"] == first["model"].map(expected))


def test_printed_text_survives_loading():
    # "30" and "1.88" keep their printed digits; floats alone could not tell 30 from 30.00.
    table1 = paper.load_table1()
    row = cell(table1, model="7.5B", dp_degree=64, stage=3)
    assert row["printed"] == "1.88" and row["published_gb"] == pytest.approx(1.88)
    assert cell(table1, model="1T", dp_degree=256, stage=3)["printed"] == "62.5"
    assert cell(paper.load_max_model(), mp_degree=4, stage=3, kind="theoretical")["printed"] == "0.5T"


# --- hand-worked values ---------------------------------------------------------------------

def test_figure1_hand_worked_bytes(figure1):
    # Psi = 7.5e9, N_d = 64, K = 12 (Sec. V):
    #   baseline 16 * 7.5e9                      = 120e9 bytes   -> printed 120
    #   P_os     4 * 7.5e9 + 12 * 7.5e9 / 64     = 31.40625e9    -> printed 31.4
    #   P_os+g   2 * 7.5e9 + 14 * 7.5e9 / 64     = 16.640625e9   -> printed 16.6
    #   P_os+g+p 16 * 7.5e9 / 64                 = 1.875e9       -> printed 1.9
    expected = {0: 120_000_000_000, 1: 31_406_250_000, 2: 16_640_625_000, 3: 1_875_000_000}
    assert dict(zip(figure1["stage"], figure1["computed_bytes"])) == expected
    assert list(figure1["printed"]) == ["120", "31.4", "16.6", "1.9"]


def test_the_same_cell_is_printed_at_two_precisions(figure1, table1):
    # 1.875 GB: "1.9" in Figure 1, "1.88" in Table 1; 31.4 and 16.6 appear in both.
    assert cell(figure1, stage=3)["printed"] == "1.9"
    assert cell(table1, model="7.5B", dp_degree=64, stage=3)["printed"] == "1.88"
    for stage in (1, 2):
        assert (cell(figure1, stage=stage)["printed"]
                == cell(table1, model="7.5B", dp_degree=64, stage=stage)["printed"])


def test_table1_hand_worked_cells(table1):
    # 7.5B, N_d = 4, P_os+g: 2 * 7.5 + 14 * 7.5 / 4 = 41.25 GB, printed 41.3 (half up).
    row = cell(table1, model="7.5B", dp_degree=4, stage=2)
    assert row["computed_bytes"] == 41_250_000_000 and row["printed"] == "41.3"
    # 128B, N_d = 1024, P_os: 4 * 128 + 12 * 128 / 1024 = 513.5 GB, printed 513 (truncated).
    row = cell(table1, model="128B", dp_degree=1024, stage=1)
    assert row["computed_bytes"] == 513_500_000_000 and row["printed"] == "513"
    # 1T, N_d = 64, P_os+g: 2 * 1000 + 14 * 1000 / 64 = 2218.75 GB, printed 2218.
    row = cell(table1, model="1T", dp_degree=64, stage=2)
    assert row["computed_bytes"] == 2_218_750_000_000 and row["printed"] == "2218"
    # 7.5B over 1024 workers: ceil(7.5e9 / 1024) = 7 324 219 elements on the most-loaded
    # worker, 16 bytes each = 117 187 504 bytes (the paper's Psi / N_d gives 117 187 500).
    row = cell(table1, model="7.5B", dp_degree=1024, stage=3)
    assert row["computed_bytes"] == 117_187_504 and row["printed"] == "0.12"


def test_largest_model_hand_worked(max_model):
    # Device 32e9 bytes, N_d = 64.
    # Baseline: 16 Psi <= 32e9 -> Psi = 2e9.  P_os+g+p: 16 ceil(Psi/64) <= 32e9 -> 128e9.
    # P_os: 4 Psi + 12 ceil(Psi/64) <= 32e9. Write Psi = 64k - j (0 <= j < 64): 268k - 4j <=
    # 32e9. k = 119 402 986 needs j >= 62, so Psi = 64k - 62 = 7 641 791 042 (the next k would
    # need j >= 129). Paper: 32 / (4 + 12/64) = 7.64 -> "7.6B".
    mp1 = max_model[max_model["mp_degree"] == 1].set_index("stage")["per_replica_params"]
    assert mp1[0] == 2_000_000_000
    assert mp1[1] == 7_641_791_042
    assert mp1[3] == 128_000_000_000
    # P_os+g: 14.42e9 (32 / 2.21875), printed 14.4B.
    assert 14_422_000_000 < mp1[2] < 14_423_000_000


# --- published against computed, within the printed precision -------------------------------

def test_figure1_agrees(figure1):
    assert figure1["agrees"].all(), figure1.loc[~figure1["agrees"]]
    # Rounded to 0.1 GB: within half a unit of the last place.
    assert (figure1["difference_gb"].abs() <= 0.05).all()


def test_table1_agrees_cell_by_cell(table1):
    assert table1["agrees"].all(), table1.loc[~table1["agrees"], ["model", "dp_degree", "stage"]]


@pytest.mark.parametrize("model, stage, low, high", [
    # (computed - published) in GB must lie in the printed unit's interval:
    ("7.5B", 1, -0.05, 0.05), ("7.5B", 2, -0.05, 0.05), ("7.5B", 3, -0.005, 0.005),
    ("128B", 1, 0.0, 1.0), ("128B", 2, 0.0, 1.0), ("128B", 3, 0.0, 1.0),
    ("1T", 1, 0.0, 1.0), ("1T", 2, 0.0, 1.0), ("1T", 3, 0.0, 0.1),
])
def test_table1_differences_within_printed_precision(table1, model, stage, low, high):
    diff = table1.query("model == @model and stage == @stage")["difference_gb"]
    assert ((diff >= low - 1e-9) & (diff < high)).all(), diff.tolist()


def test_bold_cells_are_the_first_fit_in_32gb(table1):
    # Bold: "the combinations for which the model can fit into a cluster of 32GB V100 GPUs".
    assert (table1["first_fit"] == table1["bold"]).all()
    # 128B at N_d = 64 with P_os+g+p is exactly 16 * 2e9 = 32e9 bytes: fits (<=).
    assert cell(table1, model="128B", dp_degree=64, stage=3)["fits_device"]


def test_max_model_agrees(max_model):
    assert max_model["agrees"].all(), max_model.loc[~max_model["agrees"]]


def test_max_model_printed_cells_are_mp_times_the_first_row():
    # The paper's MP > 1 cells are MP x the MP = 1 cell, not the exact bound rounded
    # (exact 4 x 7.64B = 30.57B, printed 30.4B).
    theory = paper.load_max_model().query("kind == 'theoretical' and stage < 3")
    first = theory[theory["mp_degree"] == 1].set_index("stage")["published_params"]
    assert (theory["published_params"]
            == theory["mp_degree"] * theory["stage"].map(first)).all()


def test_measured_sizes_stay_below_the_bound(max_model):
    measured = max_model.dropna(subset=["measured_params"])
    assert len(measured) == 10
    assert (measured["measured_params"] < measured["computed_params"]).all()
    # Baseline: 1.3B of 2B; P_os: 6.2B of 7.64B.
    first = measured[measured["mp_degree"] == 1].set_index("stage")["measured_share"]
    assert first[0] == pytest.approx(1.3 / 2.0)
    assert first[1] == pytest.approx(6.2 / 7.641791042)


def test_paper_gb_is_decimal_not_gib():
    # With 32 GiB the P_os bound would be 34.36 / 4.1875 = 8.2B, not the printed 7.6B.
    gib = paper.max_model_comparison(device="v100-32gb")
    row = cell(gib, mp_degree=1, stage=1)
    assert row["computed_as_printed"] == "8.2B" and not row["agrees"]
    assert paper.PAPER_V100.capacity == 32_000_000_000


# --- the printing rules -----------------------------------------------------------------------

def test_print_rules_by_hand():
    assert PrintRule("round", "0.1").text(Decimal("41.25")) == "41.3"     # half up, not even
    assert PrintRule("truncate", "1").text(Decimal("513.5")) == "513"
    assert PrintRule("round", "0.01").text(Decimal("30")) == "30"          # no trailing zeros
    assert PrintRule("round", "0.1").text(Decimal("1.875")) == "1.9"
    assert PrintRule("truncate", "0.1").text(Decimal("1.875")) == "1.8"


def test_print_rule_rejects_bad_arguments():
    with pytest.raises(ValueError, match="method"):
        PrintRule("ceil", "1")
    for bad in ("0", "-0.1", "tenth", "inf"):
        with pytest.raises(ValueError, match="quantum"):
            PrintRule("round", bad)
    with pytest.raises(TypeError, match="quantum"):
        PrintRule("round", 0.1)   # a float is not the decimal it looks like


# --- the comparison can fail, and bad input is refused ------------------------------------------

def copy_data(tmp_path):
    for name in (paper.FIGURE1_CSV, paper.TABLE1_CSV, paper.MAX_MODEL_CSV):
        shutil.copy(DATA_DIR / name, tmp_path / name)
    return tmp_path


def test_a_wrong_transcription_is_caught(tmp_path):
    data = copy_data(tmp_path)
    path = data / paper.TABLE1_CSV
    text = path.read_text()
    assert "7.5B,7500000000,256,P_os,1,30.4,false" in text
    # Truncating 30.3515625 would print 30.3; the comparison must notice.
    path.write_text(text.replace("7.5B,7500000000,256,P_os,1,30.4,", "7.5B,7500000000,256,P_os,1,30.3,"))
    frame = paper.memory_table_comparison(data_dir=data)
    assert not cell(frame, model="7.5B", dp_degree=256, stage=1)["agrees"]
    assert frame["agrees"].sum() == len(frame) - 1


def test_data_dir_errors(tmp_path):
    with pytest.raises(ValueError, match="data_dir"):
        paper.figure1_comparison(data_dir=tmp_path)
    with pytest.raises(TypeError, match="data_dir"):
        paper.memory_table_comparison(data_dir=42)
    data = copy_data(tmp_path)
    frame = pd.read_csv(data / paper.MAX_MODEL_CSV).drop(columns="printed")
    frame.to_csv(data / paper.MAX_MODEL_CSV, index=False)
    with pytest.raises(ValueError, match="printed"):
        paper.max_model_comparison(data_dir=data)


# --- the reader-facing views of notebook 05 ----------------------------------------------------

def test_table1_side_by_side_sets_printed_digits_beside_exact_text():
    wide = paper.table1_side_by_side()
    assert wide.shape == (3 * 6, 3 * 2)
    assert list(wide.index[:2]) == [("7.5B", 1), ("7.5B", 4)]
    assert wide.index[-1] == ("1T", 1024)
    # 7.5B, N_d = 4, P_os+g: 2 x 7.5 + 14 x 7.5 / 4 = 15 + 26.25 = 41.25 GB, printed 41.3.
    assert wide.loc[("7.5B", 4), ("P_os+g", "paper [GB]")] == "41.3"
    assert wide.loc[("7.5B", 4), ("P_os+g", "zerolib, exact [GB]")] == "41.25"
    # 1T, N_d = 1024, P_os: 4 x 1000 + 12 x 1000 / 1024 = 4011.71875 GB, printed 4011.
    assert wide.loc[("1T", 1024), ("P_os", "zerolib, exact [GB]")] == "4011.71875"
    assert wide.loc[("1T", 1024), ("P_os", "paper [GB]")] == "4011"
    # 7.5B over 1024 workers: the most-loaded one holds ceil(7.5e9 / 1024) = 7,324,219
    # parameters, 12 B of optimizer state each = 87,890,628 B beside 30 GB of fp16 state.
    assert wide.loc[("7.5B", 1024), ("P_os", "zerolib, exact [GB]")] == "30.087890628"


def test_rounding_evidence_lists_exactly_the_deciding_cells():
    evidence = paper.rounding_evidence()
    # Worked out by hand from the exact values: a cell decides between the rules only when
    # half-up, half-even and truncation print different digits at its printed place.
    # Figure 1: 1.875 (0.1). Table 1: 7.5B P_os 30.3515625, 30.0878...; P_os+g 41.25, 21.5625;
    # P_os+g+p (0.01) 1.875, 0.46875, 0.1171875; 128B 513.5, 257.75; 1T P_os 4187.5,
    # 4046.875, 4011.71875; P_os+g 2218.75, 2054.6875, 2013.671875. 1 + 15 cells.
    assert len(evidence) == 16
    assert (evidence["where"] == "Figure 1").sum() == 1
    keys = set(zip(evidence["model"], evidence["N_d"], evidence["label"]))
    assert ("128B", 1024, "P_os") in keys and ("7.5B", 4, "P_os+g") in keys
    assert not any(model == "128B" and label == "P_os+g+p" for model, _, label in keys)
    row = cell(evidence, model="7.5B", N_d=4, label="P_os+g")
    assert (row["rounded half up"], row["rounded half to even"], row["truncated"],
            row["printed"]) == ("41.3", "41.2", "41.2", "41.3")
    row = cell(evidence, model="128B", N_d=1024, label="P_os")
    assert (row["rounded half up"], row["truncated"], row["printed"]) == ("514", "513", "513")
    assert row["rule"] == "truncated to 1"
    assert evidence["agrees"].all()


def test_capacity_readings_only_decimal_gb_reproduces_table2():
    readings = paper.capacity_readings().set_index("stage")
    assert list(readings["printed"]) == ["2B", "7.6B", "14.4B", "128B"]
    assert (readings["as printed, 32 x 10^9 B"] == readings["printed"]).all()
    # 32 GiB = 34,359,738,368 B: / 16 = 2.147e9; / (4 + 12/64) = 8.205e9;
    # / (2 + 14/64) = 15.486e9; x 64 / 16 = 137,438,953,472 exactly.
    assert list(readings["as printed, 32 GiB"]) == ["2.1B", "8.2B", "15.5B", "137.4B"]
    assert readings.at[0, "largest model, 32 GiB"] == 2**35 // 16
    assert readings.at[3, "largest model, 32 GiB"] == 2**35 * 64 // 16
    assert readings.at[3, "largest model, 32 x 10^9 B"] == 128 * 10**9
