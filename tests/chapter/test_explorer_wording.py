"""What the explorers say matches what they show: one GPU is "1 GPU", two are "2 GPUs"; a
change of the capacity reading reaches every caption, table and plan that judges a fit."""
import pytest

from zerolib.chapter import explorers
from zerolib.core.catalogue.devices import device_at
from zerolib.core.memory.accounting import STAGES
from zerolib.core.memory.working_set import fewest_gpus_for_peak, largest_micro_batch


@pytest.mark.parametrize("gpus, words", [((1, 1), "on 1 GPU"), ((2, 2), "on 2 GPUs")])
def test_gpu_count_explorer_counts_a_single_gpu_count_right(gpus, words):
    explorer = explorers.GpuCountExplorer()
    explorer.controls["gpus"].value = gpus
    assert explorer.artists.title.get_text().endswith(words)
    assert f"{words}, " in explorer.summary.value


def test_placement_explorer_says_gpu_for_one():
    explorer = explorers.PlacementExplorer(gpus=1, gpus_per_node=1)
    assert "on 1 GPU lives" in explorer.artists.title.get_text()
    assert explorer.artists.subtitle.get_text().endswith("per GPU, 1 GPU per node")
    assert "on <b>1 GPU</b>" in explorer.summary.value and "1 GPU per node with" in explorer.summary.value


def test_step_time_explorer_says_gpu_for_one_per_node():
    explorer = explorers.StepTimeExplorer(gpus=8, gpus_per_node=1)
    assert "dgx-h100, 1 GPU per node" in explorer.artists.subtitle.get_text()
    assert "nodes of 1 GPU with" in explorer.summary.value


def test_gpu_count_caption_follows_the_capacity_reading():
    # An A100 80GB as nvidia-smi reports it holds 81,920 MiB: the same bytes as the nominal
    # 80 GiB, so only the caption's words tell the readings apart.
    explorer = explorers.GpuCountExplorer()
    explorer.controls["capacity"].value = "reported"
    assert "A100 80GB as reported (81,920 MiB)" in explorer.table.value


def test_will_it_fit_table_follows_the_capacity_reading():
    explorer = explorers.WillItFitExplorer()
    explorer.controls["capacity"].value = "decimal"
    device = device_at("h100-80gb", "decimal")
    assert device.capacity == 80 * 10**9
    fewest = fewest_gpus_for_peak("llama-2-7b", STAGES, explorer.settings, explorer.layout, device)
    largest = [largest_micro_batch("llama-2-7b", 8, stage, explorer.settings, explorer.layout,
                                   device, max_micro_batch=64) for stage in STAGES]
    rows = explorer.table.value.split("<tr>")[2:]        # after the header row
    for row, most_gpus, most_batch in zip(rows, fewest, largest):
        cells = row.split("<td style='text-align:right'>")
        assert cells[3].startswith(f"{int(most_gpus) or 'never'}<")   # after both peaks
        assert cells[4].startswith(f"{most_batch or 'never'}<")


def test_planner_judges_fits_on_the_capacity_reading():
    explorer = explorers.PlannerExplorer()
    explorer.controls["capacity"].value = "decimal"
    assert explorer.plan.settings.device.capacity == 80 * 10**9    # 80 GB, not 80 GiB
    assert "read as 80 GB" in explorer.summary.value
