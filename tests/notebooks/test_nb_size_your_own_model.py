"""Notebook 09's prose (size your own model): every number its markdown states, recomputed with zerolib.

Each test reads one markdown cell (by id), normalises its whitespace and checks the phrases that
carry numbers against values computed here, so a change that moves a number makes the sentence
fail until the text (and the executed notebook) follow.
"""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from prose_support import markdown_cells

import zerolib as zl
from zerolib.core.planner import describe_configuration
from zerolib.crosscheck.conventions.megatron_theoretical_memory import (
    args_for,
    parameters_on_most_loaded_shard,
)

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "09-size-your-own-model.ipynb"
CONFIG = ROOT / "tests" / "data" / "mistral-7b-v0.3.json"
SETTINGS = zl.WorkingSetSettings(seq_len=4096, micro_batch=1, recompute="selective")
GPT3 = ("--num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048 "
        "--max-position-embeddings 2048 --vocab-size 50257 --tensor-model-parallel-size 8")


@pytest.fixture(scope="module")
def cells() -> dict[str, str]:
    return markdown_cells("09-size-your-own-model")


@pytest.fixture(scope="module")
def model():
    return zl.model_from_config(CONFIG)


def test_the_code_reads_the_committed_config():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert 'zl.model_from_config("../tests/data/mistral-7b-v0.3.json")' in nb.cells[1].source
    assert (NOTEBOOK.parent / "../tests/data/mistral-7b-v0.3.json").is_file()


def test_vocabulary_differs_from_the_preset(cells, model):
    assert model.vocab == 32768 and zl.get_model("mistral-7b-v0.1").vocab == 32000
    assert "its vocabulary is 32,768, not v0.1's 32,000" in cells["title"]


def test_counts_and_ignored_fields(cells, model):
    total = zl.parameter_count(model)
    assert zl.active_parameter_count(model) == total
    assert f"Mistral-7B-v0.3 has {total:,} parameters, all of them active" in cells["what-was-read"]
    assert "fields that change no parameter: rope_theta" in model.source


def test_largest_module(cells, model):
    largest = zl.largest_layer(model)
    assert largest == 32768 * 4096
    assert f"the 32,768 x 4,096 embedding, {largest:,} parameters" in cells["largest"]
    assert not model.tied_embeddings      # "the untied output projection is as large"


def test_peaks_on_8_h100(cells, model):
    h100 = zl.get_device("h100-80gb")
    peaks = {p.stage: p.total for p in zl.peaks(model, 8, [0, 1, 2, 3], SETTINGS)}
    text = cells["peaks-text"]
    assert f"Plain data parallelism needs {peaks[0] / 1e9:.2f} GB per GPU and does not fit" in text
    assert peaks[0] > h100.capacity and all(peaks[s] <= h100.capacity for s in (1, 2, 3))
    assert (f"stage 1 brings the peak to {peaks[1] / 1e9:.2f} GB, stage 2 to {peaks[2] / 1e9:.2f} GB "
            f"and stage 3 to {peaks[3] / 1e9:.2f} GB") in text
    assert f"H100's {h100.capacity / 1e9:.1f} GB" in text
    summary = cells["summary"]
    assert f"({peaks[0] / 1e9:.2f} GB per GPU)" in summary and f"({peaks[3] / 1e9:.2f} GB under stage 3)" in summary
    assert f"Mistral-7B-v0.3 has {zl.parameter_count(model):,} parameters" in summary


def test_fewest_gpus(cells, model):
    fewest = zl.fewest_gpus_for_peak(model, [0, 1, 2, 3], SETTINGS,
                                     device=zl.get_device("h100-80gb")).tolist()
    assert fewest == [0, 3, 3, 3]
    assert "Stages 1 to 3 fit from 3 GPUs; plain data parallelism never does" in cells["explorer-intro"]
    # The table shows "never", the chapter's one way, not 0.
    nb = nbformat.read(NOTEBOOK, as_version=4)
    (code,) = [c for c in nb.cells if c.id == "fewest"]
    assert "zl.show_never(" in code.source
    (output,) = code.outputs
    assert output["data"]["text/plain"] == "{0: 'never', 1: 3, 2: 3, 3: 3}"


def test_plan(cells, model):
    result = zl.plan(model, 64, 8, "h100-80gb", 4096, 512)
    counts = result.counts()
    best = result.fits.iloc[0]
    text = cells["plan-text"]
    assert f"{counts['fit']:,} of {counts['configurations']:,} configurations fit" in text
    # The time is the default engine's: say which one it is.
    assert result.settings.engine.name == "deepspeed"
    assert (f"under {result.settings.engine.label}'s schedule (the planner's default engine) is "
            f"{describe_configuration(best)}, at {best['step_seconds']:.2f} s per step") in text
    assert best["tensor_parallel"] == 1 and best["pipeline_parallel"] == 1
    assert "the planner's fastest layout for it uses no tensor or pipeline parallelism" in cells["summary"]


def test_megatron_gpt3(cells):
    gpt3 = zl.model_from_megatron_args(GPT3)
    total = zl.parameter_count(gpt3)
    formula = parameters_on_most_loaded_shard(args_for(gpt3, 2048, 1))
    text = cells["megatron-text"]
    assert f"comes to {total:,} parameters" in text
    assert f"padded to {gpt3.vocab:,} rows (a multiple of 128 x 8)" in text
    assert f"{total - int(formula):,} parameters fewer" in text


def test_the_opening_assumes_the_main_path_and_links_back(cells):
    text = cells["title"]
    assert text.startswith("# 9 · Size your own model")
    for target in ("01-bytes-per-parameter.ipynb", "04-will-it-fit.ipynb",
                   "08-zero-beside-model-parallelism.ipynb", "https://arxiv.org/abs/1910.02054"):
        assert f"]({target})" in text
    everything = " ".join(cells.values())
    assert "Rajbhandari, Rasley" not in everything and "Trillion Parameter Models" not in everything
    # The mixture-of-experts sections live in notebook 10 now; this one points there.
    assert "## Mixtures of experts" not in everything
    assert "](10-experts-and-other-architectures.ipynb)" in cells["your-own"]


def test_summary_and_its_links(cells, model):
    text = cells["summary"]
    assert text.startswith("## Summary")
    assert f"Mistral-7B-v0.3 has {zl.parameter_count(model):,} parameters" in text
    assert "Previous: [8 · ZeRO beside model parallelism](08-zero-beside-model-parallelism.ipynb)" in text
    assert "Next: [10 · Experts and other architectures](10-experts-and-other-architectures.ipynb)" in text
    assert "[Contents](00-index.ipynb)" in text


def test_the_explorer_starts_on_the_fewest_gpus(cells, model):
    """The explorer's saved picture differs from the peaks figure: 3 GPUs, where stages 1-3 first fit."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    (code,) = [c for c in nb.cells if c.id == "explorer-static"]
    assert "gpus=3" in code.source
    assert "It starts here on those 3 GPUs, pictured first" in cells["explorer-intro"]
    explorer = zl.WillItFitExplorer(model=model, gpus=3, seq_len=4096, device="h100-80gb")
    assert ("Fits under ZeRO stage 1 (optimizer), ZeRO stage 2 (+ gradients) and ZeRO stage 3 "
            "(+ parameters). Too big under Plain data parallelism.") in explorer.summary.value
    peaks = {p.stage: p.total for p in zl.peaks(model, 3, [0, 1, 2, 3], SETTINGS)}
    assert peaks[0] > zl.get_device("h100-80gb").capacity >= max(peaks[1], peaks[2], peaks[3])
