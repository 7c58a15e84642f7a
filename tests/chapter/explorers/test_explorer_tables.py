"""The explorers' text and tables come from pure functions of the drawn table: tested here with
no widget in sight. Values worked by hand for mixed-precision Adam (2 + 2 + 12 bytes per
parameter) against an A100/H100 80GB, which holds 80 x 2^30 = 85,899,345,920 bytes (85.9 GB)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from zerolib.chapter.explorers import gpu_count, model_size, will_it_fit
from zerolib.core.catalogue.devices import get_device
from zerolib.core.memory.tables import memory_table, peak_frame
from zerolib.core.memory.working_set import WorkingSetSettings

A100 = get_device("a100-80gb")
H100 = get_device("h100-80gb")


def test_no_widget_library_is_needed_to_build_the_texts():
    code = ("import sys\nfrom zerolib.chapter.explorers import gpu_count\n"
            "from zerolib.core.memory.tables import memory_table\n"
            "from zerolib.core.catalogue.devices import get_device\n"
            "gpu_count.summary_html(memory_table(7e9, [1, 2]), get_device('a100-80gb'), 'GB')\n"
            "assert 'ipywidgets' not in sys.modules")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_gpu_count_summary():
    table = memory_table(7e9, range(1, 65))
    html = gpu_count.summary_html(table, A100, "GB")
    assert "<b>7B parameters</b> on 1 to 64 GPUs" in html
    # At 64 GPUs: 112 GB; (4 + 12/64) x 7 = 29.3; (2 + 14/64) x 7 = 15.5; 16/64 x 7 = 1.75 GB.
    assert ("Plain data parallelism: 112 GB; ZeRO stage 1 (optimizer): 29.3 GB; "
            "ZeRO stage 2 (+ gradients): 15.5 GB; ZeRO stage 3 (+ parameters): 1.75 GB") in html
    assert "A100 80GB capacity: 80 GiB = 85.9 GB" in html


def test_fewest_gpus_table_for_7b():
    # Model state of 7B: stage 0 is 112 GB on any count (never fits 85.9 GB); at 2 GPUs stage 1
    # holds (2 + 2 + 6) x 7 = 70 GB, stage 2 (2 + 7) x 7 = 63 GB, stage 3 8 x 7 = 56 GB; at 1 GPU
    # every stage is 112 GB, too big.
    html = gpu_count.fewest_gpus_html(7 * 10**9, memory_table(7e9, 1).attrs["layout"], A100, "GB")
    rows = html.split("<tr>")[2:]
    assert "never" in rows[0] and "at least 112 GB at any GPU count" in rows[0]
    assert [r.split("right'>")[1].split("<")[0] for r in rows[1:]] == ["2", "2", "2"]
    assert ["70.0 GB" in rows[1], "63.0 GB" in rows[2], "56.0 GB" in rows[3]] == [True] * 3


def test_first_fitting_stage_and_verdicts_for_the_chapter_sizes():
    table = memory_table([1e9, 7e9, 13e9, 30e9, 70e9], 64)
    # 1B: 16 GB fits unpartitioned. 7B: 112 GB no, 29.3 yes. 13B: 208 no, 13 x 4.1875 = 54.4 yes.
    # 30B: 30 x 4.1875 = 125.6 no, 30 x 2.21875 = 66.6 yes. 70B: 155 no, 70 x 0.25 = 17.5 yes.
    assert model_size.first_fitting_stage(table, A100) == {
        10**9: 0, 7 * 10**9: 1, 13 * 10**9: 1, 30 * 10**9: 2, 70 * 10**9: 3}
    html = model_size.summary_html(table, A100, "GB")
    assert ("1B: model state fits even without ZeRO; 7B: model state needs ZeRO stage 1 or "
            "higher; 13B: model state needs ZeRO stage 1 or higher; 30B: model state needs ZeRO stage 2 or higher; "
            "70B: model state needs ZeRO stage 3 or higher") in html
    assert "70B under ZeRO stage 3: 17.5 GB of model state per GPU" in html
    assert "<td>ZeRO stage 3 (+ parameters)</td></tr>" in model_size.fits_table_html(table, A100, "GB")


def test_peak_rows_and_tables_judge_the_peak():
    settings = WorkingSetSettings(seq_len=4096, micro_batch=1, recompute="selective")
    frame = peak_frame("llama-2-7b", 8, (0, 1, 2, 3), settings)
    rows = will_it_fit.peak_rows(frame, H100)
    # The worksheet of notebook 04 (tests/chapter/charts/test_memory_charts.py derives it by hand): 144.43, 61.20,
    # 49.40 and 39.61 GB; only plain data parallelism is above 85.9 GB.
    assert [round(r["peak"] / 1e9, 2) for r in rows] == [144.43, 61.2, 49.4, 39.61]
    assert [r["fits"] for r in rows] == [False, True, True, True]
    assert rows[0]["activations"] == 20_200_292_352 and rows[0]["logits_loss"] == 786_432_000
    summary = will_it_fit.summary_html(frame, H100, "GB")
    assert ("Fits under ZeRO stage 1 (optimizer), ZeRO stage 2 (+ gradients) and ZeRO stage 3 "
            "(+ parameters). Too big under Plain data parallelism.") in summary
    table = will_it_fit.peak_table_html(frame, H100, "GB", fewest={0: None, 1: 3, 2: 2, 3: 2},
                                        largest={0: 0, 1: 2, 2: 2, 3: 64})
    assert ("<td>Plain data parallelism</td><td style='text-align:right'>144 GB</td>"
            "<td style='text-align:right'>160 GB</td><td>too big</td>") in table   # 159.85 GB reserved
    # Nothing fits, shown one way (zl.show_never): "never" for no GPU count and for no
    # micro-batch alike.
    assert table.count(">never<") == 2 and ">none<" not in table and "64 or more" in table


@pytest.mark.parametrize("model, last", [("gpt2", 1024), ("llama-2-7b", 131072)])
def test_sequence_choices_follow_the_model(model, last):
    assert will_it_fit.seq_lengths_for(model)[-1] == last
