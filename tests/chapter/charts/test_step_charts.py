"""The price of ZeRO as figures: the step-timeline and memory-vs-step-time charts draw the
step tables and update in place.

Worked out by hand for the chapter's setting: Llama-2-7B (P = 6,738,415,616 parameters, layers
that all divide by 64) on 64 H100 80GB in DGX H100 nodes (NVLink 4 inside at 450 GB/s, 8 NDR
ports of 50 GB/s per node: 400 GB/s across), 4,096 tokens per GPU, 40 % of 989.5 TFLOP/s,
mixed-precision Adam (16-bit parameters and gradients).
- Compute: 6 x P x 4096 / (0.4 x 989.5e12) = 0.418401 s; forward a third (0.139467 s).
- One ring pass: 63 x P/64 x 2 bytes = 13,266,255,744 bytes per GPU: 0.0331656 s at 400 GB/s.
- Ring latency over 8 nodes: all-gather or reduce-scatter 8.4 + 56 x 3.4 + 7 x 14.0 = 296.8 us,
  all-reduce 8.4 + 112 x 3.4 + 14 x 14.0 = 585.2 us.
- Stage 0: an all-reduce of two passes, 0.0669165 s, hidden in the 0.278934 s backward.
- Stages 1-2: reduce-scatter hidden; the all-gather after the step (0.0334624 s) is not:
  step 0.451864 s, 7.4 % waiting.
- Stage 3: 35 layers (embedding, 32 blocks, final norm, output projection) gathered per pass:
  forward 0.0331656 + 35 x 296.8e-6 = 0.0435536 s, hidden in 0.139467 s; backward twice that,
  hidden in 0.278934 s: step 0.418401 s.
- Peaks (zerolib estimate --model llama-2-7b --gpus 64, flash attention, no recomputation):
  144.44, 52.37, 39.10 and 27.84 GB.
These are the links at line rate (the labels' arithmetic); the published figures use the bus
bandwidth NCCL reaches, the default.
"""

import pytest

from zerolib.chapter.charts.step_timeline import step_timeline_figure
from zerolib.chapter.charts.tradeoff import (
    memory_vs_step_time_figure,
    update_memory_vs_step_time,
)
from zerolib.chapter.figures import MEMORY_VS_STEP_TIME, STEP_TIMELINE, published_data
from zerolib.chapter.style import render_png
from zerolib.core.catalogue.nodes import interconnect
from zerolib.core.step.tables import timeline_frame, tradeoff_frame

LINE_RATE = "line-rate"


def line_rate(name):
    return interconnect(name, efficiency=LINE_RATE)


@pytest.fixture(scope="module")
def timeline():
    return timeline_frame("llama-2-7b", 64, line_rate("dgx-h100"), "h100-80gb")


@pytest.fixture(scope="module")
def tradeoff():
    return tradeoff_frame("llama-2-7b", 64, line_rate("dgx-h100"), "h100-80gb")


def test_the_published_figures_draw_these_frames():
    # At the default efficiency (achieved), as the chapter shows them.
    assert published_data(STEP_TIMELINE).equals(
        timeline_frame("llama-2-7b", 64, "dgx-h100", "h100-80gb"))
    assert published_data(MEMORY_VS_STEP_TIME).equals(
        tradeoff_frame("llama-2-7b", 64, "dgx-h100", "h100-80gb"))


def test_timeline_figure_labels_what_it_shows(timeline):
    figure, ax = step_timeline_figure(timeline)
    texts = [t.get_text() for t in ax.texts]
    # Compute by hand (docs/flops.md): M = 6,738,415,616 - 32,000 x 4,096 looked up
    # = 6,607,343,616 multiplied; causal core A = 4,096 x 32 heads x 256 x 32 layers
    # = 1,073,741,824 per token; (6 M + 3 A) x 4,096 / (0.4 x 989.5e12) = 0.443598 s.
    # Stages 1-2 wait 0.033463 s more for the all-gather at line rate: 0.477061 s, 7.0 %
    # waiting.
    assert "477 ms" in texts and "7% waiting" in texts
    assert texts.count("444 ms") == 2                          # stages 0 and 3
    assert "39.8 GB sent" in texts                             # stage 3: 3 x 13.27 GB
    assert "all-reduce\n26.5 GB" in texts                      # stage 0's block label
    assert "llama-2-7b on 64 H100 80GB" in ax.get_title(loc="left")
    assert render_png(figure) == render_png(step_timeline_figure(timeline)[0])


def test_tradeoff_figure_and_update_in_place(tradeoff):
    figure, artists = memory_vs_step_time_figure(tradeoff)
    labels = [artists.labels[s].get_text() for s in range(4)]
    assert labels[3] == "27.8 GB · 0.44 s · 0% waiting"     # 0.443598 s, as above
    assert labels[1] == "52.4 GB · 0.48 s · 7% waiting"
    slow = tradeoff_frame("llama-2-7b", 64, line_rate("ib-ndr"), "h100-80gb")
    update_memory_vs_step_time(artists, slow, unit="GiB")
    # 27.84e9 / 2^30 = 25.9 GiB; stage 3 over one NDR port per GPU takes 0.889 s, of which
    # 0.889 - 0.4436 s of compute (50 %) waiting.
    assert artists.labels[3].get_text() == "25.9 GiB · 0.89 s · 50% waiting"
    fresh, _ = memory_vs_step_time_figure(slow, unit="GiB")
    assert render_png(figure) == render_png(fresh)


def test_the_figures_name_the_engine_they_time(timeline, tradeoff):
    # The published figures follow the ZeRO paper's schedule (the step tables' default); a
    # frame of another engine says so in the subtitle.
    _, ax = step_timeline_figure(timeline)
    assert ax.get_title(loc="left").endswith("64 H100 80GB under the ZeRO paper's schedule")
    _, artists = memory_vs_step_time_figure(tradeoff)
    assert artists.subtitle.get_text().endswith("· the ZeRO paper's schedule")
    deepspeed = tradeoff_frame("llama-2-7b", 64, "dgx-h100", "h100-80gb", engine="deepspeed")
    update_memory_vs_step_time(artists, deepspeed)
    assert artists.subtitle.get_text().endswith("· DeepSpeed 0.19.8's schedule")
    # FSDP2 offers stages 0, 2 and 3: the stage-1 point is left out, its legend entry faded.
    fsdp2 = tradeoff_frame("llama-2-7b", 64, "dgx-h100", "h100-80gb", engine="fsdp2")
    update_memory_vs_step_time(artists, fsdp2)
    assert len(artists.points[1].get_xdata()) == 0 and artists.labels[1].get_text() == ""
    assert artists.legend.get_texts()[1].get_alpha() == 0.35


def test_the_data_readme_names_the_schedule_of_the_step_figures():
    from zerolib.chapter.figures import data_readme
    assert published_data(STEP_TIMELINE).attrs["engine"].name == "paper"
    assert "follow the ZeRO paper's schedule and rule (`zerolib.core.step.engines`, engine `paper`" in " ".join(
        data_readme().split())
