"""The step-time explorer, driven headlessly: its starting table, controls and image.

Worked out by hand for the chapter's setting: Llama-2-7B (P = 6,738,415,616 parameters, layers
that all divide by 64) on 64 H100 80GB in DGX H100 nodes, the links at the bus bandwidth NCCL
reaches (the default): NVLink 4 at 370 GB/s inside (nccl-tests issue #212), 8 NDR ports of
48 GB/s per node (issue #267) = 384 GB/s across, so min(370, 384) = 370 GB/s; 4,096 tokens per
GPU, 40 % of 989.5 TFLOP/s, mixed-precision Adam (16-bit parameters and gradients).
- Compute: 6 x P x 4096 / (0.4 x 989.5e12) = 0.418401 s; forward a third (0.139467 s).
- One ring pass: 63 x P/64 x 2 bytes = 13,266,255,744 bytes per GPU: 0.0358547 s at 370 GB/s.
- Ring latency over 8 nodes (Intel hosts: NVLink's 3.4 us per step): all-gather or
  reduce-scatter 8.4 + 56 x 3.4 + 7 x 14.0 = 296.8 us, all-reduce 8.4 + 112 x 3.4 + 14 x 14.0 =
  585.2 us.
- Stage 0: an all-reduce of two passes, 0.0722947 s, hidden in the 0.278934 s backward.
- Stages 1-2: reduce-scatter hidden; the all-gather after the step (0.0361515 s) is not:
  step 0.454553 s, 8.0 % waiting.
- Stage 3: 35 layers (embedding, 32 blocks, final norm, output projection) gathered per pass:
  three passes 3 x 0.0358547 + 105 x 296.8e-6 = 0.138728 s, hidden; step 0.418401 s.
- Peaks (zerolib estimate --model llama-2-7b --gpus 64, flash attention, no recomputation):
  144.44, 52.37, 39.10 and 27.84 GB.
Those are the ZeRO paper's schedule. The explorer starts at DeepSpeed 0.19.8's defaults (the
engine `zerolib estimate` defaults to): stages 0-2 all-reduce the gradients in buckets of
5 x 10^8 elements, ceil(P / 5e8) = 14 calls, after the backward pass (nothing hides them).
- Stage 0: 2 x 13,266,255,744 B / 370e9 + 14 x 585.2 us = 0.0717095 + 0.0081928 = 0.0799023 s,
  exposed: step 0.498304 s, 16.0 % waiting.
- Stages 1-2: that all-reduce plus the after-step all-gather in floor(64 ceil(P/64) / 5e8) =
  13 shards: 0.0358547 + 13 x 296.8e-6 = 0.0397131 s; 0.119615 s, all exposed: step 0.538017 s,
  22.2 %; 2 + 1 passes = 39,798,767,232 B sent.
- Stage 3: the same 0.138728 s, hidden but the first layer's gather: 0.0462427 s / 35 =
  0.0013212 s; step 0.419722 s, 0.3 %.
"""
import re

import IPython.display
import pytest

from zerolib.chapter import explorers, fast_png
from zerolib.core.step.tables import tradeoff_frame


@pytest.fixture(autouse=True)
def no_display(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("display() called from an explorer")
    monkeypatch.setattr(IPython.display, "display", refuse)


@pytest.fixture(scope="module")
def tradeoff():
    return tradeoff_frame("llama-2-7b", 64, "dgx-h100", "h100-80gb", engine="deepspeed")


def cells(table_html, strategy) -> list[str]:
    start = table_html.index(f"<td>{strategy}</td>")
    row = table_html[start:table_html.index("</tr>", start)]
    return re.findall(r"<td[^>]*>([^<]*)</td>", row)


@pytest.fixture
def explorer():
    """Under the paper's schedule, the values the module doc works out first."""
    return explorers.StepTimeExplorer(engine="paper")


def test_explorer_starts_at_the_chapter_setting_under_deepspeed(tradeoff):
    explorer = explorers.StepTimeExplorer()
    assert explorer.engine == "deepspeed" and explorer.data.equals(tradeoff)
    table = explorer.table.value
    assert cells(table, "Plain data parallelism") == [
        "Plain data parallelism", "144 GB", "too big", "26.5 GB", "0.08 s", "0.52 s", "15%"]
    assert cells(table, "ZeRO stage 1 (optimizer)")[1:] == [
        "52.4 GB", "fits", "39.8 GB", "0.12 s", "0.56 s", "21%"]
    assert cells(table, "ZeRO stage 3 (+ parameters)")[1:] == [
        "27.8 GB", "fits", "39.8 GB", "0.14 s", "0.44 s", "0%"]
    summary = explorer.summary.value.replace("&#x27;", "'")
    assert "Timed for DeepSpeed 0.19.8's schedule (stages 0, 1, 2, 3," in summary
    assert "Fastest of them: ZeRO stage 3 (+ parameters), 0.44 s" in summary
    labels = dict((v, k) for k, v in explorer.controls["engine"].options)
    assert labels["deepspeed"] == "DeepSpeed 0.19.8" and labels["paper"] == "the ZeRO paper's schedule"


def test_explorer_starts_at_the_chapter_setting(explorer):
    assert explorer.data.equals(tradeoff_frame("llama-2-7b", 64, "dgx-h100", "h100-80gb"))
    table = explorer.table.value
    assert cells(table, "Plain data parallelism") == [
        "Plain data parallelism", "144 GB", "too big", "26.5 GB", "0.072 s", "0.44 s", "0%"]
    assert cells(table, "ZeRO stage 1 (optimizer)")[1:] == [
        "52.4 GB", "fits", "26.5 GB", "0.072 s", "0.48 s", "8%"]
    assert cells(table, "ZeRO stage 3 (+ parameters)")[1:] == [
        "27.8 GB", "fits", "39.8 GB", "0.14 s", "0.44 s", "0%"]
    summary = explorer.summary.value
    # Compute (docs/flops.md): (6 x 6,607,343,616 multiplied parameters + 3 x 1,073,741,824
    # causal attention core) x 4,096 / (0.4 x 989.5e12) = 0.443598 s.
    assert "bus bandwidth 370 GB/s" in summary and "0.44 s of compute" in summary
    assert "Fastest of them: ZeRO stage 3 (+ parameters), 0.44 s" in summary


def test_explorer_engine_shows_its_own_stages(explorer):
    image = bytes(explorer.image.value)
    explorer.controls["engine"].value = "fsdp2"
    # FSDP2 has no stage 1: three rows, the stage-1 point left out of the figure.
    assert list(explorer.data["stage"]) == [0, 2, 3] and explorer.status.value == ""
    assert "ZeRO stage 1" not in explorer.table.value and bytes(explorer.image.value) != image
    assert len(explorer.artists.points[1].get_xdata()) == 0
    # FSDP2's stage 2 gathers before each forward (prefetched) and reduce-scatters per layer:
    # hidden but the first layer's gather, as its stage 3.
    assert "Timed for PyTorch FSDP2" in explorer.summary.value
    explorer.controls["engine"].value = "paper"
    assert list(explorer.data["stage"]) == [0, 1, 2, 3]
    assert len(explorer.artists.points[1].get_xdata()) == 1


def test_explorer_link_and_gpus_per_node(explorer):
    figure, image = explorer.figure, bytes(explorer.image.value)
    explorer.controls["link"].value = "ib-ndr"
    assert explorer.figure is figure and bytes(explorer.image.value) != image
    assert explorer.controls["gpus_per_node"].disabled
    # One NDR port per GPU at 48 GB/s: stage 0's all-reduce, 26,532,511,488 B / 48e9 + 8.4 +
    # 126 x 14.0 us = 0.554533 s, outlasts the 0.295732 s backward: step 0.147866 + 0.554533
    # = 0.702399 s, 0.258801 s of it (36.8 %) waiting.
    assert cells(explorer.table.value, "Plain data parallelism")[-2:] == ["0.7 s", "37%"]
    explorer.controls["gpus_per_node"].value = 4       # ignored for a bare link
    assert explorer.gpus_per_node is None and explorer.status.value == ""
    explorer.controls["link"].value = "dgx-h100"
    assert not explorer.controls["gpus_per_node"].disabled
    # Nodes of 4 with 4 ports: 4 x 48 = 192 GB/s across; the gather after the step takes
    # 13,266,255,744 / 192e9 + (8.4 + 48 x 3.4 + 15 x 14.0) us = 0.0694768 s: step 0.513075 s,
    # 13.5 % waiting.
    assert explorer.data.attrs["bus_bandwidth"] == 192e9
    assert cells(explorer.table.value, "ZeRO stage 2 (+ gradients)")[-2:] == ["0.51 s", "14%"]


def test_explorer_tokens_utilisation_device_model_unit(explorer):
    explorer.controls["tokens_per_gpu"].value = 16384
    # Four sequences per GPU: 4 x 20.99 GB of activations and logits; nothing fits an H100.
    assert "No strategy's peak fits" in explorer.summary.value.replace("&#x27;", "'")
    explorer.controls["tokens_per_gpu"].value = 4096
    explorer.controls["mfu"].value = 0.8
    # Compute halves to 0.221799 s; the after-step gather (0.0361515 s) is now 14.0 % of stage
    # 1's step.
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
                         ({"model": "gpt-5"}, "model"), ({"device": "tpu"}, "device"),
                         ({"engine": "horovod"}, "engine")):
        with pytest.raises(ValueError, match=name):
            explorers.StepTimeExplorer(**kwargs)
