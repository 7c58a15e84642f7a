"""The shard pictures, read back from the drawn Axes and held to numbers worked out by hand.

Mixed-precision Adam (ZeRO paper, Sec. III-A): 2 + 2 + 12 bytes per parameter. A 7B model
(7 x 10^9 parameters) holds 14 GB of parameters, 14 GB of gradients and 84 GB of optimizer
state. On N = 4 GPUs a partition is a quarter: 3.5, 3.5 and 21 GB. Per GPU:

- stage 0 holds everything:            14 + 14  + 84 = 112 GB;
- stage 1 partitions the optimizer:    14 + 14  + 21 = 49 GB;
- stage 2 the gradients as well:       14 + 3.5 + 21 = 38.5 GB;
- stage 3 the parameters as well:      3.5 + 3.5 + 21 = 28 GB.

One layer of Llama-2-7B (h = 4096, gated MLP f = 11008, two RMSNorm weights): attention
4 h^2 = 67,108,864, MLP 3 h f = 135,266,304, norms 2 h = 8,192: 202,383,360 parameters. On 4
GPUs a partition is 50,595,840 elements, 101,191,680 bytes of fp16 parameters. A ring all-gather
(or reduce-scatter) sends N - 1 = 3 partitions per GPU: 3 x 101,191,680 = 303,575,040 bytes.
Over the step's forward, every unit of the model (embedding 32,000 x 4,096 = 131,072,000; 32
layers; the final norm 4,096; the untied output projection 131,072,000) is gathered once:
3 x 2 x (32,768,000 + 32 x 50,595,840 + 1,024 + 32,768,000) = 10,107,623,424 bytes.
"""
from collections import defaultdict

import pytest

from zerolib.chapter import figures
from zerolib.chapter.charts.shards import (
    draw_shards,
    shards_by_stage_figure,
    update_shards,
)
from zerolib.chapter.fast_png import IncrementalPng
from zerolib.chapter.style import add_axes, new_figure, render_png
from zerolib.core.memory.tables import shard_table
from zerolib.core.step.tables import step_shard_table

GB = 10**9
PER_GPU = {0: 112 * GB, 1: 49 * GB, 2: 38_500_000_000, 3: 28 * GB}
HELD = {  # stage -> category -> bytes one GPU holds
    0: {"parameters": 14 * GB, "gradients": 14 * GB, "optimizer": 84 * GB},
    1: {"parameters": 14 * GB, "gradients": 14 * GB, "optimizer": 21 * GB},
    2: {"parameters": 14 * GB, "gradients": 3_500_000_000, "optimizer": 21 * GB},
    3: {"parameters": 3_500_000_000, "gradients": 3_500_000_000, "optimizer": 21 * GB},
}
LAYER = 202_383_360
LAYER_SHARD = 50_595_840
SENT = 303_575_040
STEP_FORWARD_GATHER = 10_107_623_424


def blocks(ax) -> dict[str, object]:
    return {patch.get_gid(): patch for patch in ax.patches if patch.get_gid()}


def held_by_gpu(ax) -> dict[int, dict[str, float]]:
    """Bytes per GPU and category, read from the solid blocks' heights (GB on the axis)."""
    held = defaultdict(dict)
    for gid, patch in blocks(ax).items():
        gpu, category, what = gid.split("/")[:3]
        if what in ("owned", "replica"):
            held[int(gpu.split()[1])][category] = patch.get_height() * GB
    return held


def empty(ax, kind="not held") -> list[str]:
    return [gid for gid in blocks(ax) if gid.endswith(f"/{kind}")]


@pytest.fixture(scope="module")
def by_stage():
    return figures.published_figure(figures.SHARDS_BY_STAGE, figures.FigureOptions(shard_params=7 * 10**9))


def test_the_published_picture_is_notebook_1s_worksheet():
    # 1B parameters on 4 workers: 16, 4 + 12/4 = 7, 2 + 14/4 = 5.5 and 16/4 = 4 GB per worker.
    published = figures.published_figure(figures.SHARDS_BY_STAGE)
    for stage, ax in enumerate(published.axes):
        totals = {gpu: sum(held.values()) for gpu, held in held_by_gpu(ax).items()}
        assert totals == pytest.approx({g: (16, 7, 5.5, 4)[stage] * GB for g in range(4)}, rel=1e-12)


@pytest.fixture(scope="module")
def through_a_step():
    return figures.published_figure(figures.SHARDS_THROUGH_A_STEP)


def test_every_gpu_holds_the_hand_worked_bytes_at_every_stage(by_stage):
    axes = by_stage.axes
    assert len(axes) == 4
    for stage, ax in enumerate(axes):
        held = held_by_gpu(ax)
        assert sorted(held) == [0, 1, 2, 3]
        for gpu in range(4):
            for category, expected in HELD[stage].items():
                assert held[gpu][category] == pytest.approx(expected, rel=1e-12), (stage, gpu)
            assert sum(held[gpu].values()) == pytest.approx(PER_GPU[stage], rel=1e-12)


def test_each_column_is_labelled_with_its_bytes_per_gpu_and_gb_is_named_at_the_edge(by_stage):
    labels = {0: "112", 1: "49.0", 2: "38.5", 3: "28.0"}
    for stage, ax in enumerate(by_stage.axes):
        column_labels = [t.get_text() for t in ax.texts]
        assert column_labels == [labels[stage]] * 4
    assert any("in GB" in t.get_text() for t in by_stage.texts)


def test_what_a_gpu_does_not_hold_is_drawn_empty_one_partition_each(by_stage):
    # Stage s leaves N - 1 = 3 partitions empty per partitioned category and GPU.
    for stage, ax in enumerate(by_stage.axes):
        assert len(empty(ax)) == 4 * 3 * stage
        assert [g for g in blocks(ax) if g.endswith("/replica")].__len__() == 4 * (3 - stage)


def test_gpu_i_owns_partition_i_stacked_in_its_band(by_stage):
    ax = by_stage.axes[1]                       # stage 1: the optimizer state in quarters
    owned = blocks(ax)
    bottoms = [owned[f"gpu {g}/optimizer/owned"].get_y() for g in range(4)]
    steps = [b - a for a, b in zip(bottoms, bottoms[1:])]
    assert steps == pytest.approx([21.0] * 3)   # a 21 GB partition above the one before
    assert bottoms[0] > 28.0                    # above the 14 + 14 GB of the other two bands


def test_the_step_panels_hold_the_layers_partitions_and_move_the_hand_worked_bytes(through_a_step):
    axes = through_a_step.axes
    assert len(axes) == 3
    for ax in axes:
        for held in held_by_gpu(ax).values():
            assert held["parameters"] == pytest.approx(2 * LAYER_SHARD, rel=1e-12)
            assert held["optimizer"] == pytest.approx(12 * LAYER_SHARD, rel=1e-12)
    gather, reduce, step = axes
    assert len(empty(gather, "gathered")) == 4 * 3          # the other parameters, for a moment
    assert all("/parameters/" in gid for gid in empty(gather, "gathered"))
    assert len(empty(reduce, "reduced away")) == 4 * 3
    assert all("/gradients/" in gid for gid in empty(reduce, "reduced away"))
    assert empty(step, "gathered") == empty(step, "reduced away") == []
    # The notes: 0.30 GB per layer, 10.1 GB over the step; nothing at the optimizer step.
    for ax in (gather, reduce):
        note = ax.texts[-1].get_text()
        assert "sends 0.3 GB" in note and "10.1 GB" in note
    assert "moves nothing" in step.texts[-1].get_text()


def test_the_step_table_holds_the_hand_worked_bytes():
    frame = step_shard_table("llama-2-7b", 4)
    assert set(frame["layer_params"]) == {LAYER}
    sent = frame.groupby("phase")["sent_bytes"].first()
    step = frame.groupby("phase")["step_sent_bytes"].first()
    assert sent["forward_all_gather"] == sent["gradient_reduce_scatter"] == SENT
    assert step["forward_all_gather"] == step["gradient_reduce_scatter"] == STEP_FORWARD_GATHER
    assert sent["optimizer_step"] == step["optimizer_step"] == 0


def test_the_tables_say_what_each_stage_partitions():
    table = shard_table(7 * 10**9, 4)
    per_gpu = table.groupby(["stage", "gpu"])["bytes"].sum()
    for stage, expected in PER_GPU.items():
        assert set(per_gpu[stage]) == {expected}
    partitioned = table[table["gpu"] == 0].set_index(["stage", "category"])["partitioned"]
    assert [c for c in ("parameters", "gradients", "optimizer") if partitioned[(2, c)]] == [
        "gradients", "optimizer"]


def test_an_uneven_split_pads_every_partition_to_the_same_size():
    # 10 parameters on 4 GPUs: ceil(10 / 4) = 3 elements per partition, 12 bytes of optimizer.
    table = shard_table(10, 4, stages=3)
    assert set(table[table["category"] == "optimizer"]["bytes"]) == {36}
    assert set(table[table["category"] == "parameters"]["shard_bytes"]) == {6}


def test_regenerating_gives_identical_bytes():
    for name in (figures.SHARDS_BY_STAGE, figures.SHARDS_THROUGH_A_STEP):
        assert render_png(figures.published_figure(name)) == render_png(figures.published_figure(name))


def test_a_panel_redrawn_in_place_gives_the_pixels_of_a_fresh_draw():
    def panel(rows, unit):
        figure = new_figure((5.0, 4.0), 80)
        return figure, draw_shards(add_axes(figure, (1.0, 0.2, 0.6, 0.5)), rows, unit)

    first = shard_table(7 * 10**9, 4)
    later = shard_table(70 * 10**9, 16, layout="fp32-adam")
    figure, artists = panel(first[first["stage"] == 1], "GB")
    update_shards(artists, later[later["stage"] == 3], "GiB")
    fresh, _ = panel(later[later["stage"] == 3], "GiB")
    assert IncrementalPng(figure).render() == IncrementalPng(fresh).render()


def test_bad_rows_and_settings_name_the_argument():
    table = shard_table(7 * 10**9, 4)
    with pytest.raises(ValueError, match="one panel"):
        draw_shards(new_figure((4, 4)).add_subplot(), table)          # four stages at once
    with pytest.raises(TypeError, match="table must be a DataFrame"):
        shards_by_stage_figure([1, 2, 3])
    with pytest.raises(ValueError, match="gpus must be at most 64"):
        shard_table(7 * 10**9, 128)
    with pytest.raises(ValueError, match="layer must be"):
        step_shard_table("llama-2-7b", 4, layer=35)
    with pytest.raises(ValueError, match="shard_gpus"):
        figures.FigureOptions(shard_gpus=65)
