"""Other systems' published memory numbers (zerolib.crosscheck.conventions): every printed value
reproduced within its printed precision, each difference named. Expected values by hand or
from the sources themselves (data/*.md cite them)."""
from __future__ import annotations

from fractions import Fraction

import pytest

from zerolib.core.catalogue.models import parameter_count
from zerolib.crosscheck.conventions import megatron_distributed_optimizer as megatron
from zerolib.crosscheck.conventions import playbook, side_by_side, zero_infinity
from zerolib.crosscheck.conventions.common import COMPARISON_COLUMNS

GiB = 2**30


def all_keys(frame, column):
    return {key for text in frame[column] for key in str(text).split()}


@pytest.mark.parametrize("module", [megatron, playbook, zero_infinity])
def test_comparisons_are_tidy_and_every_difference_is_named(module):
    table = module.comparison()
    assert list(table.columns[:len(COMPARISON_COLUMNS)]) == list(COMPARISON_COLUMNS)
    assert all_keys(table, "chapter_differs_by") <= set(module.DIFFERENCES)
    assert all_keys(table, "source_note") <= set(module.DIFFERENCES)
    # A value that does not agree names the source's own inconsistency.
    assert (table.loc[~table["agrees"], "source_note"] != "").all()
    # Where the chapter's number differs from the source's, a difference is named.
    differs = (table["chapter"] - table["reproduced"]).abs() > 1e-12
    assert (table.loc[differs, "chapter_differs_by"] != "").all()


# --- Megatron-LM ----------------------------------------------------------------------------

def test_megatron_cells_parse():
    assert megatron.parse_cell("20") == (20, 0)
    assert megatron.parse_cell("6 + 12/d") == (6, 12)
    with pytest.raises(ValueError, match="cannot read the cell"):
        megatron.parse_cell("6 + 12/N")


def test_megatron_every_cell_at_every_d_is_reproduced_exactly():
    table = megatron.comparison()
    assert len(table) == 6 * len(megatron.DATA_PARALLEL) and table["agrees"].all()


def test_megatron_by_hand_at_d_8():
    # 4 + 16/8 = 6, 6 + 12/8 = 7.5, 8 + 8/8 = 9 bytes per parameter; 18 without the distributed
    # optimizer for bf16 parameters with fp32 gradients.
    rows = megatron.comparison().set_index("setting")

    def printed_at(setting):
        replicated, sharded = megatron.parse_cell(rows.loc[setting, "printed"])
        return replicated + Fraction(sharded, 8)

    assert printed_at("fp16 parameters, fp16 gradients, Distributed optim, d = 8") == 6
    assert printed_at("bf16 parameters, fp32 gradients, Distributed optim, d = 8") == Fraction(15, 2)
    assert printed_at("fp32 parameters, fp32 gradients, Distributed optim, d = 8") == 9
    assert printed_at("bf16 parameters, fp32 gradients, Non-distributed optim, d = 8") == 18
    row = rows.loc["bf16 parameters, fp32 gradients, Distributed optim, d = 8"]
    assert row["reproduced"] == 7.5
    assert row["chapter"] == 2 + 2 + 12 / 8          # mixed-adam, stage 1


def test_megatron_table_as_printed():
    table = megatron.table()
    assert table.loc["fp16 parameters, fp16 gradients", ("Distributed optim", "Megatron-LM prints")] == "4 + 16/d"
    assert table.loc["fp16 parameters, fp16 gradients", ("Distributed optim", "zerolib")] == "4 + 16/d"


# --- Ultra-Scale Playbook ----------------------------------------------------------------------

def test_playbook_parameter_counts_leave_out_the_norms():
    # Llama-3-8B: 8,030,261,248 parameters; 32 layers x 2 RMSNorms + the final one, 4,096 each.
    assert playbook.plot_parameter_count("llama-3-8b") == 8_030_261_248 - 65 * 4096 == 8_029_995_008
    # Llama-3.2-1B (tied): 128,256 x 2,048 + 16 x (2 x 2048^2 + 2 x 2048 x 512 + 3 x 2048 x 8192).
    assert playbook.plot_parameter_count(playbook.LLAMA_3_2_1B) == (
        128_256 * 2048 + 16 * (2 * 2048**2 + 2 * 2048 * 512 + 3 * 2048 * 8192)) == 1_235_746_816


def test_playbook_plot_values_by_hand():
    n = 8_029_995_008
    assert 2 * n / GiB == 14.95703125 and 8 * n / GiB == 59.828125
    # Activations: 34 x 1,024 x 4,096 x 32 bytes = 4.25 GiB.
    assert playbook.plot_activation_bytes("llama-3-8b", 1024) == 34 * 1024 * 4096 * 32 == 4.25 * GiB
    # The ZeRO figure: 15 / 8 and 60 / 8, rounded before dividing.
    assert playbook.zero_figure_value(playbook.PLOT_MODELS["8B"], "parameters", 1024, 3, 8) == 1.875
    assert playbook.zero_figure_value(playbook.PLOT_MODELS["8B"], "optimizer", 1024, 1, 8) == 7.5
    assert playbook.zero_figure_value(playbook.PLOT_MODELS["8B"], "gradients", 1024, 1, 8) == 15


def test_playbook_every_value_is_reproduced():
    table = playbook.comparison()
    assert len(table) == 8 + 60 + 48 and table["agrees"].all()


def test_playbook_table_is_16_and_20_bytes_per_parameter_in_gb():
    table = playbook.table_comparison()
    assert table["printed"].tolist() == ["16", "20", "112", "140", "1120", "1400", "6480", "8100"]
    assert table["chapter"].tolist() == [16, 16, 112, 112, 1120, 1120, 6480, 6480]


def test_playbook_zero_figure_against_the_chapter():
    panels = playbook.zero_figure_panels()
    zero1 = panels[(panels["panel"] == "DP=8 Zero-1") & (panels["component"] == "optimizer")]
    # The chapter: 12 B x 8,030,261,248 / 8 = 11.22 GiB; the plot 8 B (no master copy), rounded.
    assert zero1["plotted [GiB]"].item() == "7.5"
    assert zero1["chapter [GiB]"].item() == round(12 * 8_030_261_248 / 8 / GiB, 3)
    exact = panels[(panels["panel"] == "DP=8 Zero-3") & (panels["component"] == "parameters")]
    assert exact["plots' convention, exact [GiB]"].item() == 14.95703125 / 8


# --- ZeRO-Infinity ------------------------------------------------------------------------------

def test_zero_infinity_by_hand():
    # 0.10T row: 12 x 80 x 10,240^2 = 100,663,296,000 parameters; 20 B each = 1.8310546875 TiB.
    assert zero_infinity.paper_params(80, 10_240) == 100_663_296_000
    values = zero_infinity.values(80, 10_240, 128)
    assert values["model states"][0] == 20 * 100_663_296_000
    # Checkpoints: 2 B x 32 x 1,024 x 10,240 x 80 per node.
    assert values["activation checkpoints"][0] == 2 * 32 * 1024 * 10_240 * 80
    # Activation working memory: 4 x 1,024 x (16 x 10,240 + 2 x 128 x 1,024) = 1.625 GiB.
    assert values["activation working memory"][0] == 4 * 1024 * (16 * 10_240 + 2 * 128 * 1024)
    assert values["activation working memory"][0] / GiB == 1.625


def test_zero_infinity_29_of_30_and_the_one_inconsistent_cell():
    table = zero_infinity.comparison()
    assert len(table) == 30 and table["agrees"].sum() == 29
    (bad,) = table[~table["agrees"]].to_dict("records")
    assert bad["item"] == "model-state working memory" and bad["setting"].startswith("0.10T")
    assert bad["printed"] == "1.95" and bad["reproduced_as_printed"] == "1.56"
    assert bad["source_note"] == "printed-at-5-bytes"
    assert float(bad["printed"]) == round(1.25 * bad["reproduced"], 2)   # 1.953125 -> 1.95


def test_zero_infinity_chapter_differences():
    table = zero_infinity.comparison().set_index(["setting", "item"])
    first = table.xs("model states", level="item").iloc[0]
    # The chapter's 16 B against the paper's 20 B.
    assert first["chapter"] == pytest.approx(first["reproduced"] * 16 / 20, rel=1e-12)
    awm = table.xs("activation working memory", level="item").iloc[0]
    # Korthikanti: 4,096 tokens x (34 x 10,240 + 5 x 128 x 1,024) bytes.
    assert awm["chapter"] == 4096 * (34 * 10_240 + 5 * 128 * 1024) / GiB


# --- side by side ------------------------------------------------------------------------------

def test_side_by_side_by_hand():
    table = side_by_side.model_state_by_convention("llama-3-8b", 8)
    p = parameter_count("llama-3-8b")
    got = {(r["convention"], r["stage"]): r["bytes"] for r in table.to_dict("records")}
    assert got[("ZeRO paper (the chapter)", 0)] == 16 * p
    assert got[("ZeRO paper (the chapter)", 3)] == 2 * p                    # 16 / 8
    assert got[("Megatron-LM", 1)] == 6 * p + 12 * p // 8
    assert got[("ZeRO-Infinity paper", 3)] == 20 * p // 8
    # The plot at stage 3: 1.875 + 1.875 + 7.5 GiB.
    assert got[("Ultra-Scale Playbook plots", 3)] == int(11.25 * GiB)
    # DeepSpeed's estimator at stage 2: 2 P + 18 P / 8.
    assert got[("DeepSpeed estimator", 2)] == 2 * p + 18 * p // 8
    assert table.attrs["gpus"] == 8 and set(table["convention"]) == set(side_by_side.CONVENTIONS)
