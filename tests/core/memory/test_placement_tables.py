"""The placement tables (zerolib.core.memory.tables): the group-size and tier tables and the
divisors behind them. Expected values by hand (mixed-precision Adam, 16 bytes per parameter)."""
from __future__ import annotations

import pytest

from zerolib.core.memory.placement import OPTIONS
from zerolib.core.memory.tables import divisors, group_size_table, tier_table

P70 = 70 * 10**9


def test_divisors():
    assert divisors(64) == [1, 2, 4, 8, 16, 32, 64]
    assert divisors(12) == [1, 2, 3, 4, 6, 12] and divisors(1) == [1]
    with pytest.raises(ValueError, match="gpus"):
        divisors(0)


def test_group_size_table_by_hand():
    table = group_size_table(P70, 64, [1, 3])
    stage3 = table[table["stage"] == 3].set_index("shard_group")
    # 16 B x 70e9 / G for G = 1 ... 64.
    assert stage3["total"].tolist() == [16 * P70 // g for g in (1, 2, 4, 8, 16, 32, 64)]
    assert stage3["replicas"].tolist() == [64, 32, 16, 8, 4, 2, 1]
    stage1 = table[table["stage"] == 1].set_index("shard_group")
    assert stage1.loc[8, "total"] == 4 * P70 + 12 * P70 // 8
    assert (table["cluster_total"] == 64 * table["total"]).all()
    assert group_size_table(P70, 64, [3], shard_groups=[4, 16])["shard_group"].tolist() == [4, 16]
    with pytest.raises(ValueError, match="shard_group must divide gpus"):
        group_size_table(P70, 64, [3], shard_groups=[3])


def test_tier_table_by_hand():
    table = tier_table(P70, 8)
    assert list(dict.fromkeys(table["option"])) == [o.name for o in OPTIONS]
    got = table.set_index(["option", "tier"])
    # ZeRO-3 + optimizer on CPU, one node of 8: GPU 2 B x 70e9 / 8; host 16 B x 70e9 / 8 each.
    assert got.loc[("ZeRO-3 + optimizer on CPU", "gpu"), "bytes"] == 2 * P70 // 8
    assert got.loc[("ZeRO-3 + optimizer on CPU", "cpu"), "per_node"] == 16 * P70
    assert got.loc[("ZeRO-2", "gpu"), "bytes"] == 2 * P70 + 14 * P70 // 8
    assert table["offered"].all() and table.attrs["gpus_on_node"] == 8
    grouped = tier_table(P70, 64, shard_group=16).set_index(["option", "tier"])
    assert not grouped.loc[("ZeRO-3 + hpZ copy (ZeRO++)", "gpu"), "offered"]
    assert "shard group to be every GPU" in grouped.loc[("ZeRO-3 + hpZ copy (ZeRO++)", "gpu"), "note"]
    assert grouped.loc[("ZeRO-3", "gpu"), "bytes"] == 16 * P70 // 16
    with pytest.raises(ValueError, match="shard_group must divide gpus"):
        tier_table(P70, 64, shard_group=3)
    with pytest.raises(ValueError, match="fill whole nodes"):
        tier_table(P70, 12)
