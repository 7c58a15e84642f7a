"""The price of ZeRO as tables and figures: zerolib.core.step.tables, the step-timeline and
memory-vs-step-time charts, and the step-time explorer.

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
"""
import re

import IPython.display
import numpy as np
import pytest

from zerolib.chapter import explorers, fast_png
from zerolib.chapter.charts.step_timeline import step_timeline_figure
from zerolib.chapter.charts.tradeoff import (
    memory_vs_step_time_figure,
    update_memory_vs_step_time,
)
from zerolib.chapter.figures import MEMORY_VS_STEP_TIME, STEP_TIMELINE, published_data
from zerolib.chapter.style import render_png
from zerolib.core.step.tables import timeline_frame, tradeoff_frame, traffic_frame
from zerolib.core.step.time import ComputeSettings

COMPUTE, FORWARD = 0.418401, 0.139467
PASS = 13_266_255_744
GATHER = PASS / 400e9 + 296.8e-6
STEPS = [COMPUTE, COMPUTE + GATHER, COMPUTE + GATHER, COMPUTE]
PEAKS_GB = [144.44, 52.37, 39.10, 27.84]


@pytest.fixture(autouse=True)
def no_display(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("display() called from an explorer")
    monkeypatch.setattr(IPython.display, "display", refuse)


@pytest.fixture(scope="module")
def timeline():
    return timeline_frame("llama-2-7b", 64, "dgx-h100", "h100-80gb")


@pytest.fixture(scope="module")
def tradeoff():
    return tradeoff_frame("llama-2-7b", 64, "dgx-h100", "h100-80gb")


def test_traffic_frame_by_hand():
    frame = traffic_frame(7 * 10**9, 64)
    sent = frame.pivot(index="stage", columns="kind", values="sent_bytes")
    # ceil(7e9 / 64) = 109,375,000: one pass 63 x 109,375,000 x 2 = 13,781,250,000 bytes.
    assert sent.loc[0].to_dict() == {"all_gather": 0, "all_reduce": 27_562_500_000,
                                     "reduce_scatter": 0}
    assert sent.loc[3].to_dict() == {"all_gather": 27_562_500_000, "all_reduce": 0,
                                     "reduce_scatter": 13_781_250_000}
    assert (frame["sent_bytes"] == frame["received_bytes"]).all()
    assert frame.attrs["model"] == 7 * 10**9 and frame.attrs["gpus"] == 64


def test_timeline_places_blocks_as_the_overlap_model_says(timeline):
    assert np.allclose([timeline.attrs["step_seconds"][s] for s in range(4)], STEPS, rtol=1e-5)
    for stage, group in timeline.groupby("stage"):
        compute = group[group["lane"] == "compute"]
        # The compute lane covers the step without gaps: forward, backward, waits.
        ends = compute.sort_values("start_seconds")[["start_seconds", "end_seconds"]].to_numpy()
        assert ends[0, 0] == 0 and np.allclose(ends[1:, 0], ends[:-1, 1])
        assert np.isclose(ends[-1, 1], STEPS[stage], rtol=1e-5)
        forward = compute[compute["block"] == "forward"].iloc[0]
        assert np.isclose(forward["end_seconds"], FORWARD, rtol=1e-5)
    stage1 = timeline[timeline["stage"] == 1].set_index("block")
    assert np.isclose(stage1.at["waiting_after_step", "end_seconds"]
                      - stage1.at["waiting_after_step", "start_seconds"], GATHER, rtol=1e-5)
    assert stage1.at["parameter_all_gather", "sent_bytes"] == PASS
    stage3 = timeline[timeline["stage"] == 3].set_index("block")
    assert stage3.at["forward_all_gather", "calls"] == 35
    assert np.isclose(stage3.at["forward_all_gather", "end_seconds"],
                      PASS / 400e9 + 35 * 296.8e-6, rtol=1e-6)
    assert not any(b.startswith("waiting") for b in stage3.index)


def test_tradeoff_frame(tradeoff):
    assert np.allclose(tradeoff["step_seconds"], STEPS, rtol=1e-5)
    assert [round(b / 1e9, 2) for b in tradeoff["memory_bytes"]] == PEAKS_GB
    assert np.allclose(tradeoff["network_wait_fraction"], [0, GATHER / STEPS[1],
                                                           GATHER / STEPS[1], 0], atol=1e-9)
    assert tradeoff["sent_bytes"].tolist() == [2 * PASS, 2 * PASS, 2 * PASS, 3 * PASS]
    assert tradeoff.attrs["compute"] == ComputeSettings(4096, 0.4, False)


def test_tradeoff_needs_data_parallel_only():
    from zerolib.core.memory.working_set import WorkingSetSettings
    with pytest.raises(ValueError, match="tensor_parallel"):
        tradeoff_frame("llama-2-7b", 64, "dgx-h100", "h100-80gb",
                       WorkingSetSettings(tensor_parallel=2))


def test_the_published_figures_draw_these_frames(timeline, tradeoff):
    assert published_data(STEP_TIMELINE).equals(timeline)
    assert published_data(MEMORY_VS_STEP_TIME).equals(tradeoff)


def test_timeline_figure_labels_what_it_shows(timeline):
    figure, ax = step_timeline_figure(timeline)
    texts = [t.get_text() for t in ax.texts]
    assert "452 ms" in texts and "7% waiting" in texts        # stages 1-2: 0.451864 s
    assert texts.count("418 ms") == 2                          # stages 0 and 3
    assert "39.8 GB sent" in texts                             # stage 3: 3 x 13.27 GB
    assert "all-reduce\n26.5 GB" in texts                      # stage 0's block label
    assert "llama-2-7b on 64 H100 80GB" in ax.get_title(loc="left")
    assert render_png(figure) == render_png(step_timeline_figure(timeline)[0])


def test_tradeoff_figure_and_update_in_place(tradeoff):
    figure, artists = memory_vs_step_time_figure(tradeoff)
    labels = [artists.labels[s].get_text() for s in range(4)]
    assert labels[3] == "27.8 GB · 0.42 s · 0% waiting"
    assert labels[1] == "52.4 GB · 0.45 s · 7% waiting"
    slow = tradeoff_frame("llama-2-7b", 64, "ib-ndr", "h100-80gb")
    update_memory_vs_step_time(artists, slow, unit="GiB")
    # 27.84e9 / 2^30 = 25.9 GiB; stage 3 over one NDR port per GPU takes 0.889 s, 53 % waiting.
    assert artists.labels[3].get_text() == "25.9 GiB · 0.89 s · 53% waiting"
    fresh, _ = memory_vs_step_time_figure(slow, unit="GiB")
    assert render_png(figure) == render_png(fresh)


# --- the explorer ------------------------------------------------------------------------------

def cells(table_html, strategy) -> list[str]:
    start = table_html.index(f"<td>{strategy}</td>")
    row = table_html[start:table_html.index("</tr>", start)]
    return re.findall(r"<td[^>]*>([^<]*)</td>", row)


@pytest.fixture
def explorer():
    return explorers.StepTimeExplorer()


def test_explorer_starts_at_the_chapter_setting(explorer, tradeoff):
    assert explorer.data.equals(tradeoff)
    table = explorer.table.value
    assert cells(table, "Plain data parallelism") == [
        "Plain data parallelism", "144 GB", "too big", "26.5 GB", "0.067 s", "0.42 s", "0%"]
    assert cells(table, "ZeRO stage 1 (optimizer)")[1:] == [
        "52.4 GB", "fits", "26.5 GB", "0.067 s", "0.45 s", "7%"]
    assert cells(table, "ZeRO stage 3 (+ parameters)")[1:] == [
        "27.8 GB", "fits", "39.8 GB", "0.13 s", "0.42 s", "0%"]
    summary = explorer.summary.value
    assert "bus bandwidth 400 GB/s" in summary and "0.42 s of compute" in summary
    assert "Fastest of them: ZeRO stage 3 (+ parameters), 0.42 s" in summary


def test_explorer_link_and_gpus_per_node(explorer):
    figure, image = explorer.figure, bytes(explorer.image.value)
    explorer.controls["link"].value = "ib-ndr"
    assert explorer.figure is figure and bytes(explorer.image.value) != image
    assert explorer.controls["gpus_per_node"].disabled
    # One NDR port per GPU: stage 0's all-reduce (0.532 s) outlasts the 0.279 s backward.
    assert cells(explorer.table.value, "Plain data parallelism")[-2:] == ["0.67 s", "38%"]
    explorer.controls["gpus_per_node"].value = 4       # ignored for a bare link
    assert explorer.gpus_per_node is None and explorer.status.value == ""
    explorer.controls["link"].value = "dgx-h100"
    assert not explorer.controls["gpus_per_node"].disabled
    # Nodes of 4 with 4 ports: 200 GB/s across; the gather after the step takes 0.0666 s.
    assert explorer.data.attrs["bus_bandwidth"] == 200e9
    assert cells(explorer.table.value, "ZeRO stage 2 (+ gradients)")[-2:] == ["0.49 s", "14%"]


def test_explorer_tokens_utilisation_device_model_unit(explorer):
    explorer.controls["tokens_per_gpu"].value = 16384
    # Four sequences per GPU: 4 x 20.99 GB of activations and logits; nothing fits an H100.
    assert "No strategy's peak fits" in explorer.summary.value.replace("&#x27;", "'")
    explorer.controls["tokens_per_gpu"].value = 4096
    explorer.controls["mfu"].value = 0.8
    # Compute halves to 0.209 s; the after-step gather is now 14 % of stage 1's step.
    assert cells(explorer.table.value, "ZeRO stage 1 (optimizer)")[-1] == "14%"
    explorer.controls["device"].value = "a100-80gb"
    assert "312 TFLOP/s" in explorer.summary.value
    explorer.controls["unit"].value = "GiB"
    assert cells(explorer.table.value, "ZeRO stage 3 (+ parameters)")[1] == "25.9 GiB"
    explorer.controls["model"].value = "gpt2"        # 1,024-token context: 4 sequences per GPU
    assert explorer.settings.seq_len == 1024 and explorer.settings.micro_batch == 4


def test_explorer_image_is_deterministic_and_a_full_render():
    first, second = explorers.StepTimeExplorer(), explorers.StepTimeExplorer()
    assert bytes(first.image.value) == bytes(second.image.value)
    for name, value in (("link", "pcie-8x-l40s"), ("gpus", 1024), ("unit", "GiB")):
        first.controls[name].value = value
        assert bytes(first.image.value) == fast_png.IncrementalPng(first.figure).render()


def test_explorer_bad_starting_values():
    for kwargs, name in (({"gpus": 3}, "gpus"), ({"link": "nvlink9"}, "link"),
                         ({"gpus_per_node": 3}, "gpus_per_node"),
                         ({"tokens_per_gpu": 1000}, "tokens_per_gpu"), ({"mfu": 0.9}, "mfu"),
                         ({"model": "gpt-5"}, "model"), ({"device": "tpu"}, "device")):
        with pytest.raises(ValueError, match=name):
            explorers.StepTimeExplorer(**kwargs)
