"""Tidy DataFrames leave the library with one row per (model, workers, stage)."""
import numpy as np
import pandas as pd
import pytest

from zerolib.core.memory.tables import fewest_gpus_table, memory_table, stage_savings


def test_memory_table_shape_and_order():
    table = memory_table([7_000_000_000, 1_000_000_000], range(1, 65))
    assert list(table.columns) == ["params", "gpus", "stage", "strategy", "parameters", "gradients",
                                   "optimizer", "total", "cluster_total"]
    assert len(table) == 2 * 64 * 4
    assert table["params"].is_monotonic_increasing
    first = table.iloc[:4]
    assert list(first["stage"]) == [0, 1, 2, 3] and set(first["gpus"]) == {1}


def test_memory_table_values():
    table = memory_table(7_000_000_000, range(1, 65)).set_index(["gpus", "stage"])
    assert (table.xs(0, level="stage")["total"] == 112 * 10**9).all()
    stage3 = table.xs(3, level="stage")["total"]
    expected = [-(-7_000_000_000 // g) * 16 for g in range(1, 65)]
    assert list(stage3) == expected
    assert table.loc[(8, 1), "cluster_total"] == 8 * (28 * 10**9 + 84 * 10**9 // 8)


def test_fewest_gpus_table():
    table = fewest_gpus_table([7_000_000_000, 70_000_000_000])
    by = table.set_index(["params", "stage"])["fewest_gpus"]
    assert by[(7_000_000_000, 3)] == 2 and by[(70_000_000_000, 3)] == 14
    assert pd.isna(by[(7_000_000_000, 0)]) and pd.isna(by[(70_000_000_000, 2)])
    assert set(table["device"]) == {"a100-80gb"}


def test_stage_savings_show_where_fp32_gradients_move_the_savings():
    table = stage_savings(10**9, 4, ["mixed-adam", "bf16-fp32-grads"]).set_index(["layout", "stage"])
    # Mixed Adam on 4 workers: 16 -> 7 -> 5.5 -> 4 GB, saving 9, 1.5, 1.5 GB.
    assert table.loc["mixed-adam", "saved"].tolist() == [0, 9 * 10**9, 1_500_000_000, 1_500_000_000]
    # fp32 gradients: 18 -> 9 -> 6 -> 4.5 GB; stage 2 now saves 4 * 3/4 = 3 GB.
    assert table.loc["bf16-fp32-grads", "total"].tolist() == [18 * 10**9, 9 * 10**9, 6 * 10**9, 4_500_000_000]
    assert table.loc["bf16-fp32-grads", "saved"].tolist() == [0, 9 * 10**9, 3 * 10**9, 1_500_000_000]
    with pytest.raises(TypeError, match="params must be a single number"):
        stage_savings([10**9, 2 * 10**9], 4)


def test_show_never_marks_where_nothing_fits():
    import pandas as pd

    from zerolib.core.memory.tables import show_never
    # 7B on A100 80GB, plain DP: 16 x 7e9 = 112 GB per GPU at any count -> never; stage 3 from 2.
    table = fewest_gpus_table([7e9], max_gpus=8)
    assert show_never(table["fewest_gpus"]).tolist() == ["never", 2, 2, 2]
    assert show_never(None) == "never" and show_never(pd.NA) == "never"
    assert show_never(0) == 0 and show_never(0, zero_is_never=True) == "never"
    assert show_never([np.int64(3), None]) == [3, "never"]
    frame = show_never(pd.DataFrame({"a": pd.array([1, None], dtype="Int64")}))
    assert frame["a"].tolist() == [1, "never"]
