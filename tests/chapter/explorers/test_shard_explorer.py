"""The shard explorer, driven headlessly: each control's effect on the blocks it draws.

Worked out by hand for mixed-precision Adam (2 + 2 + 12 bytes per parameter). 7B on 4 GPUs,
stage 1: parameters 14 GB, gradients 14 GB, the optimizer's 84 GB in quarters, 21 GB: 49 GB per
GPU. 7B on 16 GPUs, stage 3: 14 / 16 = 0.875 GB of parameters, as much of gradients, 84 / 16 =
5.25 GB of optimizer state: 7 GB per GPU. 70B on 8 GPUs, stage 2, fp32 Adam (4 + 4 + 8): 280 GB
of parameters whole, 280 / 8 = 35 GB of gradients, 560 / 8 = 70 GB of optimizer state: 385 GB.
"""
import IPython.display
import pytest

import zerolib as zl
from zerolib.chapter import explorers, fast_png
from zerolib.chapter.explorers.shards import ShardExplorer, stages_html, summary_html
from zerolib.core.memory.tables import shard_table

GB = 10**9


@pytest.fixture(autouse=True)
def no_display(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("display() called from an explorer")
    monkeypatch.setattr(IPython.display, "display", refuse)


def held(explorer) -> dict[tuple[int, str], float]:
    """Bytes per (GPU, category) read from the solid blocks of the explorer's Axes."""
    out = {}
    for patch in explorer.artists.ax.patches:
        gpu, category, what = (patch.get_gid() or "//").split("/")[:3]
        if what in ("owned", "replica"):
            out[(int(gpu.split()[1]), category)] = patch.get_height() * GB
    return out


def per_gpu(explorer) -> set[float]:
    totals = {}
    for (gpu, _), value in held(explorer).items():
        totals[gpu] = totals.get(gpu, 0) + value
    return {round(v) for v in totals.values()}


def full_render(explorer) -> bytes:
    return fast_png.IncrementalPng(explorer.figure).render()


def test_it_starts_at_stage_1_of_7b_on_4_gpus():
    e = ShardExplorer()
    assert zl.ShardExplorer is ShardExplorer
    assert held(e)[(2, "optimizer")] == pytest.approx(21 * GB)
    assert held(e)[(2, "parameters")] == pytest.approx(14 * GB)
    assert per_gpu(e) == {49 * GB}
    assert [t.get_text() for t in e.artists.labels] == ["49.0"] * 4
    assert "ZeRO stage 1" in e.artists.ax.get_title(loc="left")
    assert bytes(e.image.value) == full_render(e)


def test_gpus_and_stage_move_the_blocks():
    e = ShardExplorer()
    figure = e.figure
    e.controls["gpus"].value = 16
    e.controls["stage"].value = 3
    assert e.figure is figure                                   # redrawn in place
    assert len(held(e)) == 16 * 3
    assert held(e)[(15, "parameters")] == pytest.approx(875_000_000)
    assert per_gpu(e) == {7 * GB}
    assert "Per GPU: parameters 0.88 GB + gradients 0.88 GB + optimizer state 5.25 GB" in e.summary.value
    assert bytes(e.image.value) == full_render(e)


def test_model_size_layout_and_unit():
    e = ShardExplorer(stage=2, gpus=8, params=70 * 10**9, layout="fp32-adam")
    assert held(e)[(0, "parameters")] == pytest.approx(280 * GB)
    assert held(e)[(0, "gradients")] == pytest.approx(35 * GB)
    assert per_gpu(e) == {385 * GB}
    e.controls["unit"].value = "GiB"
    # 385 GB = 385e9 / 2^30 GiB = 358.6 GiB; the heights are in GiB now.
    assert e.artists.labels[0].get_text() == "359"
    e.controls["layout"].value = "mixed-adam"                   # 70B x 2 + 2/8 + 12/8 = 262.5 GB
    e.controls["unit"].value = "GB"
    assert per_gpu(e) == {262_500_000_000}


def test_the_texts_are_pure_functions_of_the_table():
    table = shard_table(7 * 10**9, 4)
    assert "each GPU holds 1/4 of the gradients and optimizer state" in summary_html(table, 2, "GB")
    assert "every GPU holds everything" in summary_html(table, 0, "GB")
    text = stages_html(table, "GB")
    for total in ("112 GB", "49.0 GB", "38.5 GB", "28.0 GB"):
        assert f"<b>{total}</b>" in text


def test_a_stage_it_cannot_draw_is_reported_and_the_explorer_recovers():
    e = ShardExplorer()
    before = bytes(e.image.value)
    e.controls["stage"].value = None
    assert "Not redrawn" in e.status.value and bytes(e.image.value) == before
    e.controls["stage"].value = 0
    assert e.status.value == "" and per_gpu(e) == {112 * GB}


def test_bad_starting_values_are_rejected():
    with pytest.raises(ValueError, match="stage"):
        ShardExplorer(stage=4)
    with pytest.raises(ValueError, match="gpus"):
        ShardExplorer(gpus=17)
    with pytest.raises(ValueError, match="params"):
        ShardExplorer(params=6 * 10**9)
    with pytest.raises(ValueError, match="unit"):
        ShardExplorer(unit="MB")
    with pytest.raises(ValueError, match="layout"):
        ShardExplorer(layout="adam-4bit")


def test_it_is_one_of_the_explorers():
    assert "ShardExplorer" in explorers.__all__


def test_a_layout_of_zero_bytes_draws_an_empty_picture_without_a_warning(recwarn):
    # Once set the y limits to (0, 0), which matplotlib warns about and widens by itself.
    e = ShardExplorer()
    for name in ("parameters_bytes", "gradients_bytes", "optimizer_bytes"):
        e.controls[name].value = 0
    assert e.status.value == "" and per_gpu(e) == {0}
    assert not [w for w in recwarn if "identical low and high ylims" in str(w.message)]
    assert bytes(e.image.value) == full_render(e)
