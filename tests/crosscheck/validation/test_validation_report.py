"""zerolib.crosscheck.validation.report: the tables notebook 05 reads from the recorded runs in data/.

No torch and no DeepSpeed: the recorded files are read as they are. Expected values are worked
out by hand from the models' shapes (comments), or summed here straight from the file's rows.
"""
from __future__ import annotations

import shutil

import pandas as pd
import pytest
from conftest import REPO

from zerolib.crosscheck.validation import report
from zerolib.crosscheck.validation.effects import MECHANISMS
from zerolib.paths import DATA_DIR

# The uneven model: Linear(33, 45) + Linear(45, 21) + Linear(21, 5) = 1,530 + 966 + 110 = 2,606
# parameters; on 4 ranks ceil(2606 / 4) = 652 per partitioned category. fp32 AdamW: 4 B of
# parameters, 4 B of gradients, 8 B of AdamW state per parameter.
UNEVEN = 2_606
SHARE = 652


@pytest.fixture(scope="module")
def sharded():
    return report.load_sharded()


@pytest.fixture(scope="module")
def deepspeed_runs():
    return report.load_deepspeed()


@pytest.fixture(scope="module")
def activations():
    return report.load_activations()


# --- reading --------------------------------------------------------------------------------------

def test_records_are_read_from_the_repository_data_folder(sharded, deepspeed_runs):
    assert DATA_DIR == REPO / "data"
    assert len(sharded) == len(pd.read_csv(DATA_DIR / "validation_sharded.csv"))
    # Stages 0 and 1 have no DeepSpeed estimator: nullable, not NaN floats or empty text.
    assert deepspeed_runs["deepspeed_estimate_per_gpu"].dtype == "Int64"
    assert deepspeed_runs.loc[deepspeed_runs["stage"] < 2, "deepspeed_estimate_per_gpu"].isna().all()
    assert report.DEEPSPEED_BUFFERS_FILE == "deepspeed_measured_buffers.csv"


def test_other_data_folders_and_bad_ones(tmp_path):
    shutil.copy(DATA_DIR / "validation_activations.csv", tmp_path)
    assert len(report.load_activations(tmp_path)) == len(report.load_activations())
    with pytest.raises(ValueError, match="data_dir .* has no validation_sharded.csv"):
        report.load_sharded(tmp_path)
    with pytest.raises(TypeError, match="data_dir"):
        report.load_deepspeed(42)


# --- the sharded run --------------------------------------------------------------------------------

def test_overview_of_the_whole_tensor_partition(sharded):
    overview = report.sharded_overview(sharded, workers=4)
    assert len(overview) == 6 * 2  # strategies x models (HSDP runs on 4 workers)
    row = overview[(overview["strategy"] == "ZeroRedundancyOptimizer")
                   & (overview["model"] == "uneven")].iloc[0]
    # Predicted on every rank: 4 B + 4 B x 2,606 replicated + 8 B x 652 = 26,064 B.
    assert row["predicted per rank [B]"] == 8 * UNEVEN + 8 * SHARE == 26_064
    # Rank 0 owns the 1,485-element weight alone: 8 B x 1,485 + one 4-byte step counter.
    assert row["at rest [B]"] == 8 * UNEVEN + 8 * 1_485 + 4 == 32_732
    assert row["at rest vs predicted"] == "+25.6%"           # 32,732 / 26,064 = 1.2558
    assert row["explained by"] == "step-counters whole-tensor-partition"


def test_overview_at_rest_and_peak_of_the_stage3_analogue(sharded):
    overview = report.sharded_overview(sharded, workers=4).set_index(["strategy", "model"])
    even = overview.loc[("FSDP2, reshard_after_forward=True", "even")]
    # Even model: 16,640 parameters, 4,160 per rank: 16 B x 4,160 + eight 4-byte counters.
    assert even["predicted per rank [B]"] == 16 * 4_160
    assert even["at rest [B]"] == 16 * 4_160 + 8 * 4
    # Peak: one gathered layer of 64 x 64 + 64 = 4,160 elements, 4 B each, beside the shards.
    assert even["peak during forward [B]"] == 16 * 4_160 + 8 * 4 + 4 * 4_160
    assert even["peak during forward vs predicted"] == "+25.0%"


def test_per_rank_of_zero1_by_hand(sharded):
    table = report.per_rank(sharded, "zero1", model="uneven", workers=4)
    assert list(table.columns.get_level_values(0).unique()) == ["parameters", "gradients",
                                                                "optimizer"]
    assert len(table) == 2 * 4
    rest3 = table.loc[("at rest", 3)]
    # Rank 3 owns the three smallest tensors: 45 + 21 + 5 = 71 elements and 3 step counters.
    assert rest3[("optimizer", "measured [B]")] == 8 * 71 + 3 * 4 == 580
    assert rest3[("optimizer", "predicted [B]")] == 8 * SHARE
    assert rest3[("optimizer", "difference")] == "-88.9%"    # 580 / 5,216 = 0.1112
    assert rest3[("parameters", "difference")] == "0%"
    assert table[("parameters", "measured [B]")].dtype == "int64"


def test_explanations_merge_ranks_and_phases(sharded):
    lines = report.explanations(sharded, "zero1", model="uneven", workers=4)
    # Only the optimizer differs, each rank by its own tensors, at rest and at the peak alike.
    assert len(lines) == 4
    assert lines[0].startswith("optimizer, rank 0, at rest and peak during forward: ")
    assert "1,485 of 2,606 elements" in lines[0]
    fsdp = report.explanations(sharded, "fsdp2-reshard", model="uneven", workers=4)
    # Parameters: padding at rest; padding plus a gathered layer at the peak: two lines.
    assert [line.split(":")[0] for line in fsdp[:2]] == ["parameters, ranks 0-3, at rest",
                                                         "parameters, ranks 0-3, peak during forward"]


def test_rank_bars_feeds_the_figure(sharded):
    panels = [("zero1", "rest"), ("fsdp2-reshard", "peak")]
    bars = report.rank_bars(sharded, panels, model="uneven", workers=4)
    assert len(bars) == 2 * 3 * 4
    assert list(pd.unique(bars["panel"])) == [
        "ZeroRedundancyOptimizer (stage 1)\nat rest",
        "FSDP2, reshard_after_forward=True (stage 3)\npeak during forward"]
    first = bars[bars["panel"] == bars["panel"].iloc[0]]
    assert list(first["category"][:4]) == ["parameters"] * 4 and list(first["rank"][:4]) == [0, 1, 2, 3]
    # FSDP2 at its peak: 728 padded shard elements + layer 0 gathered, 4 x ceil(45/4) x 33
    # + 4 x 12 = 1,632 elements, 4 B each.
    peak = bars[(bars["strategy"] == "fsdp2-reshard") & (bars["category"] == "parameters")]
    assert set(peak["measured_bytes"]) == {4 * (728 + 1_632)}


@pytest.mark.parametrize("panels, error, word", [
    ([], ValueError, "panels"),
    (["zero1"], TypeError, "panels"),
    ([("zero2", "rest")], ValueError, "strategy"),
    ([("zero1", "after step")], ValueError, "phase"),
])
def test_rank_bars_rejects_bad_panels(sharded, panels, error, word):
    with pytest.raises(error, match=word):
        report.rank_bars(sharded, panels)


def test_bad_choices_name_the_argument(sharded):
    with pytest.raises(ValueError, match="workers must be one of 2, 4"):
        report.sharded_overview(sharded, workers=3)
    with pytest.raises(ValueError, match="model"):
        report.per_rank(sharded, "zero1", model="huge")


def test_mechanism_legend_names_what_the_rows_use(sharded):
    legend = report.mechanism_legend(sharded)
    used = {key for text in sharded["effects"] for key in text.split()}
    assert set(legend["mechanism"]) == used
    assert list(legend["mechanism"]) == [key for key in MECHANISMS if key in used]


def test_model_sizes_by_hand():
    sizes = report.model_sizes().set_index("model")
    assert sizes.at["uneven", "parameters"] == UNEVEN and sizes.at["uneven", "tensors"] == 6
    assert sizes.at["even", "parameters"] == 4 * (64 * 64 + 64)


# --- DeepSpeed measured --------------------------------------------------------------------------------

def test_three_numbers_per_stage(deepspeed_runs):
    table = report.deepspeed_three_numbers(deepspeed_runs, "uneven", "bf16", 4).set_index("stage")
    params = 1_838_337  # 512-1024-1024-257 with biases
    shard = -(-params // 4)  # 459,585
    # The chapter's mixed-adam: 16 B per parameter, stage 3 on the busiest rank 16 x ceil(P/4).
    assert table.at[0, "chapter [B]"] == 16 * params == 29_413_392
    assert table.at[3, "chapter [B]"] == 16 * shard == 7_353_360
    # DeepSpeed: ZeRO-2 2P + int(18P/4); ZeRO-3 4 x 1,049,600 + int(18P/4).
    assert table.at[2, "DeepSpeed estimator [B]"] == 2 * params + 18 * params // 4
    assert table.at[3, "DeepSpeed estimator [B]"] == 4 * 1_049_600 + 18 * params // 4
    assert pd.isna(table.at[0, "DeepSpeed estimator [B]"])
    # Measured: the four state columns of the most-loaded rank, summed here from the file.
    rows = deepspeed_runs[(deepspeed_runs["model"] == "uneven") & (deepspeed_runs["precision"] == "bf16")
                          & (deepspeed_runs["workers"] == 4)]
    states = rows[list(report.DEEPSPEED_STATES)].sum(axis=1)
    for stage in range(4):
        at_rest = states[(rows["stage"] == stage) & (rows["phase"] == "after_step")].max()
        assert table.at[stage, "measured at rest [B]"] == at_rest
        assert table.at[stage, "measured, highest [B]"] == states[rows["stage"] == stage].max()
    assert table.at[3, "measured at rest [B]"] - table.at[3, "chapter [B]"] == 4_620
    # The reduce bucket: reduce_bucket_size 5e8 elements x 2 B, kept by ZeRO-3 throughout.
    assert list(table["reduce bucket [B]"]) == [0, 10**9, 10**9, 10**9]
    assert list(table["bucket held"]) == ["never", "before_reduction", "before_reduction", "always"]


def test_deepspeed_buffers_name_their_size(deepspeed_runs):
    buffers = report.deepspeed_buffers(report.load_deepspeed_buffers(), "uneven", "fp32", 2)
    buckets = buffers[buffers["category"] == "buckets"]
    assert list(buckets["stage"]) == [1, 2, 3]
    assert set(buckets["bytes per rank"]) == {4 * 500_000_000}
    assert buckets["size set by"].str.contains("500,000,000 elements x 4 B").all()


# --- activations -----------------------------------------------------------------------------------------

def test_activation_summary_by_hand(activations):
    summary = report.activation_summary(activations).set_index("case")
    # Table 2 for s = 64, b = 2, h = 64, a = 4: sbh (34 + 5as/h) = 8,192 x 54 = 442,368 B; two
    # LayerNorms each save a mean and a 1/std per token: 4 x 128 tokens x 2 B = 1,024 B more.
    assert summary.at["table2", "formula [B]"] == 442_368
    assert summary.at["table2", "measured [B]"] == 442_368 + 1_024
    assert summary.at["table2", "difference"] == "+0.23%"
    assert summary.at["full", "difference"] == "0%" and summary.at["full", "explained by"] == "-"
    assert summary.at["flash", "explained by"] == "norm-statistics flash-output-copy"
    assert (summary["unexplained [B]"] == 0).all()


def test_activation_case_and_explanations(activations):
    case = report.activation_case(activations, "table2")
    assert case["measured_bytes"].sum() == 443_392
    assert case.loc[case["item"] == "attention dropout mask", "saved_dtype"].item() == "bool"
    lines = report.activation_explanations(activations)
    assert any(line.startswith("flash output (flash): ") for line in lines)
    with pytest.raises(ValueError, match="case"):
        report.activation_case(activations, "nope")
