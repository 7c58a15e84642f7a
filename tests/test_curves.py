"""Tidy DataFrames leave the library with one row per (model, workers, stage)."""
import pandas as pd

from zerolib.curves import fewest_gpus_table, memory_table


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
