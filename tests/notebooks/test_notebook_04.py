"""Notebook 04, the peak working set: every number and claim in its prose, checked against
zerolib and the recorded measurements, and its shape (terms defined before use, links out to the
notebooks that hold what moved away, "never" where nothing fits).

Each expected value is derived here from zerolib's functions or the recorded file, or by hand
where noted; the test then finds the sentence in the notebook's markdown.
"""
from __future__ import annotations

import dataclasses
import math
import re

import nbformat
import pytest
from conftest import REPO

import zerolib as zl
from zerolib.chapter.explorers import WillItFitExplorer
from zerolib.core.catalogue.devices import get_device
from zerolib.core.units import GB
from zerolib.crosscheck.validation import report

NOTEBOOK = REPO / "notebooks" / "04-will-it-fit.ipynb"
H100 = get_device("h100-80gb").capacity
A100 = get_device("a100-80gb").capacity
SETTINGS = zl.WorkingSetSettings(seq_len=4096, micro_batch=1, recompute="selective", flash_attention=True)
GPUS = 8
MODEL = "llama-2-7b"


@pytest.fixture(scope="module")
def notebook():
    return nbformat.read(NOTEBOOK, as_version=4)


@pytest.fixture(scope="module")
def cells(notebook) -> dict[str, str]:
    return {cell.get("id"): " ".join(cell.source.split()) for cell in notebook.cells}   # one line each


def gb(n_bytes, digits=1) -> str:
    return f"{n_bytes / GB:.{digits}f}"


def prose(notebook) -> str:
    return " ".join(" ".join(c.source.split()) for c in notebook.cells if c.cell_type == "markdown")


def test_prose_is_within_its_budget(notebook):
    words = sum(len(c.source.split()) for c in notebook.cells if c.cell_type == "markdown")
    assert words <= 2000, words


def test_terms_are_defined_in_bold_before_their_first_use(notebook):
    text = prose(notebook)
    for term, use in (("working set", r"working set"), ("peak", r"\bpeak\b"),
                      ("Flash attention", r"flash attention"),
                      ("Selective recomputation", r"selective recomputation"),
                      ("full recomputation", r"full recomputation")):
        defined = text.find(f"**{term}**")
        assert defined >= 0, f"{term} is not defined in bold"
        first = re.search(use, text.replace(f"**{term}**", "\0" * (len(term) + 4)), re.I)
        assert first is None or first.start() > defined, f"{term} is used before it is defined"


def test_what_moved_out_is_one_sentence_and_a_link(cells, notebook):
    text = prose(notebook)
    for gone in ("## The formula against a model as shipped", "## Other shapes", "### How ZeRO treats experts",
                 "more than a hundred times", "Trillion Parameter Models"):
        assert gone not in text
    assert "[the shipped blocks measured against the formula](12-appendix-real-runs.ipynb)" in cells["left-out"]
    assert "experts ([notebook 10](10-experts-and-other-architectures.ipynb))" in cells["left-out"]
    assert "[notebook 10](10-experts-and-other-architectures.ipynb)'s subject" in cells["explorer-read"]
    assert "[notebook 9](09-size-your-own-model.ipynb)" in cells["explorer-read"]
    assert "its busiest rank ([appendix B](12-appendix-real-runs.ipynb))" in cells["summary"]
    assert "[notebook 5's \"The words\"](05-the-price-of-zero.ipynb#The-words)" in cells["working-intro"]
    assert "[the ZeRO paper](https://arxiv.org/abs/1910.02054)" in cells["title"]


def test_the_summary_and_its_way_on(cells, notebook):
    last = [c for c in notebook.cells if c.cell_type == "markdown"][-1]
    assert last.id == "summary" and last.source.startswith("## Summary\n")
    body, line = last.source.removeprefix("## Summary\n").strip().rsplit("\n\n", 1)
    sentences = re.split(r"(?<=\.)\s+(?=[A-Z])", " ".join(body.split()))
    assert 3 <= len(sentences) <= 5, sentences
    assert line == ("Previous: [3 · Memory versus model size](03-memory-vs-model-size.ipynb) · "
                    "Next: [5 · The price of ZeRO](05-the-price-of-zero.ipynb) · [Contents](00-index.ipynb)")
    peaks = zl.peaks(MODEL, GPUS, zl.STAGES, SETTINGS)
    text = cells["summary"]
    assert (f"it is {gb(peaks[0].total)} GB without ZeRO and {gb(peaks[1].total)}, {gb(peaks[2].total)} "
            f"and {gb(peaks[3].total)} GB at stages 1, 2 and 3") in text
    activations = {p.working_set["activations"] for p in peaks}
    assert len(activations) == 1 and f"the same {gb(activations.pop())} GB of activations" in text
    fewest = [zl.fewest_gpus_for_peak(MODEL, s, SETTINGS, device="h100-80gb") for s in zl.STAGES]
    assert fewest == [None, 3, 2, 2]
    assert "Plain data parallelism never fits, stage 1 fits from 3 GPUs and stages 2 and 3 from 2" in text
    assert "None of the three settings notebooks 2 and 3 judged on model state fits" in text


def test_the_working_set_terms(cells):
    text = cells["working-intro"]
    model = zl.get_model(MODEL)
    s, b, h, f = 4096, 1, model.hidden, model.ffn_hidden
    per_layer = 2 * (8 * s * b * h + 4 * s * b * f)             # 8 s x h and 4 s x f tensors, 2 bytes
    assert per_layer == 16 * s * b * h + 8 * s * b * f
    assert f == 11_008 and f"*f* = {f:,}" in text
    assert f"16*sbh* + 8*sbf* = {gb(per_layer, 2)} GB, and 32 layers make {gb(32 * per_layer)} GB" in text
    terms = zl.model_activation_terms(model, s, b, options=SETTINGS.activation_options)
    assert terms["transformer_layers"] == model.layers * per_layer
    assert terms["logits_loss"] == 6 * 4096 * 32_000
    assert f"6 × 4,096 × 32,000 bytes = {gb(6 * 4096 * 32_000, 2)} GB" in text
    working = {stage: zl.working_set(MODEL, stage, SETTINGS) for stage in zl.STAGES}
    assert working[0]["ddp_buckets"] == 2 * zl.parameter_count(MODEL)
    assert f"2Ψ bytes = {gb(working[0]['ddp_buckets'])} GB" in text
    assert all(working[stage]["reduce_bucket"] == 5 * 10**8 * 2 for stage in (1, 2, 3))
    overlapped = zl.working_set(MODEL, 1, dataclasses.replace(SETTINGS, overlap_comm=True))
    assert overlapped["reduce_bucket"] == 2 * 10**9
    assert "allocated whole: 1 GB (2 GB with `overlap_comm`" in text
    # max(10^9, largest module + prefetch bucket) elements in 16 bits.
    assert zl.largest_layer(MODEL) == 32_000 * 4096 == 131_072_000
    assert working[3]["gathered_parameters"] == 2 * max(10**9, 131_072_000 + 5 * 10**7) == 2 * 10**9
    assert "max(10⁹, 131,072,000 + 5 × 10⁷) = 10⁹ elements, 2 GB" in text
    assert working[1]["reserve"] == 2 * 2**30 and "2 GiB" in cells["working-intro"]


def test_the_peak_against_the_device(cells):
    text = cells["peak-read"]
    peaks = zl.peaks(MODEL, GPUS, zl.STAGES, SETTINGS)
    plain, stage3 = peaks[0], peaks[3]
    assert (f"the working set adds {gb(plain.working_set_total)} GB to the {gb(plain.persistent['total'])} "
            f"GB of model state, {gb(plain.working_set['ddp_buckets'])} GB of it DDP's copy of the "
            f"gradients: {gb(plain.total)} GB per GPU, too big") in text
    assert plain.total > H100 and all(p.total <= H100 for p in peaks[1:])
    assert (f"With ZeRO all three stages fit: {gb(peaks[1].total)}, {gb(peaks[2].total)} and "
            f"{gb(stage3.total)} GB") in text
    assert stage3.working_set_total > 1.9 * stage3.persistent["total"]                       # "nearly twice"
    assert (f"the working set, {gb(stage3.working_set_total)} GB, is nearly twice the persistent state, "
            f"{gb(stage3.persistent['total'])} GB") in text
    activations = stage3.working_set["activations"]
    assert activations > stage3.persistent["total"]
    assert f"the activations alone, {gb(activations)} GB, are more than everything stage 3 keeps" in text


def test_the_fewest_gpus_and_the_largest_micro_batch(cells, notebook):
    text = cells["limits-read"]
    assert zl.peak(MODEL, 10**6, 0, SETTINGS).persistent["total"] == 16 * zl.parameter_count(MODEL)
    assert f"its replicated state alone is {gb(16 * zl.parameter_count(MODEL))} GB" in text
    assert "Stage 1 fits from 3 GPUs, stages 2 and 3 from 2" in text
    spare = H100 - zl.peak(MODEL, 2, 2, SETTINGS).total
    assert 0 < spare and zl.peak(MODEL, 1, 2, SETTINGS).total > H100
    assert f"(stage 2 with {gb(spare)} GB to spare)" in text
    largest = [zl.largest_micro_batch(MODEL, GPUS, s, SETTINGS, device="h100-80gb") for s in zl.STAGES]
    assert largest == [0, 2, 2, 3]
    assert "stages 1 and 2 take 2 sequences per GPU and stage 3 takes 3" in text
    # By hand at stage 3: 16 x P / 8 + 1 GB + 2 GB + 2 GiB does not grow; each sequence adds the
    # activations and the logits.
    P = zl.parameter_count(MODEL)
    fixed = 16 * P // 8 + 10**9 + 2 * 10**9 + 2 * 2**30
    per_sequence = zl.working_set(MODEL, 3, SETTINGS)["activations"] + 6 * 4096 * 32_000
    assert f"is {gb(16 * P // 8, 2)} + 1 + 2 + {gb(2 * 2**30, 2)} = {gb(fixed, 2)} GB" in text
    assert f"each sequence adds 20.2 + 0.79 = {gb(per_sequence, 2)} GB" in text
    assert f"({gb(H100, 2)} − {gb(fixed, 2)}) / {gb(per_sequence, 2)} = {(H100 - fixed) / per_sequence:.1f}" in text
    assert math.floor((H100 - fixed) / per_sequence) == 3
    # The table says "never", not 0 or <NA>, where nothing fits.
    # The table itself moved to appendix A's A.6 (the sentence above says it all).
    appendix = nbformat.read(REPO / "notebooks" / "11-appendix-papers-and-other-systems.ipynb", as_version=4)
    table = next(c for c in appendix.cells if c.get("id") == "main-limits").outputs[0]["data"]["text/plain"]
    assert table.count("never") == 2 and "<NA>" not in table and "None" not in table
    assert re.search(r"Plain data parallelism\s+never", table)


def test_the_explorers_things_to_try(cells):
    text = cells["explorer-read"]
    two = dataclasses.replace(SETTINGS, micro_batch=2)
    grown = zl.peak(MODEL, GPUS, 1, two).total - zl.peak(MODEL, GPUS, 1, SETTINGS).total
    assert grown == zl.peak(MODEL, GPUS, 3, two).total - zl.peak(MODEL, GPUS, 3, SETTINGS).total
    assert f"every bar is {gb(grown)} GB taller" in text
    stage1 = zl.peak(MODEL, GPUS, 1, two).total
    assert H100 - 4 * GB < stage1 <= H100                                   # "just under the line"
    assert f"stage 1 reaches {gb(stage1)} GB, just under the line, and needs " \
           f"{zl.fewest_gpus_for_peak(MODEL, 1, two, device='h100-80gb')} GPUs instead of 3" in text
    # No recomputation, no flash attention: a x s x s probabilities in 2 bytes a layer.
    bare = dataclasses.replace(SETTINGS, recompute="none", flash_attention=False)
    assert 32 * 4096 * 4096 * 2 == 1_073_741_824
    assert "32 × 4,096 × 4,096 attention probabilities, 1.07 GB a layer" in text
    assert zl.peak(MODEL, GPUS, 1, bare).total > H100
    assert f"stage 1 no longer fits ({gb(zl.peak(MODEL, GPUS, 1, bare).total)} GB)" in text
    none = zl.working_set(MODEL, 1, dataclasses.replace(SETTINGS, recompute="none"))["activations"]
    assert f"differ by {gb(none - zl.working_set(MODEL, 1, SETTINGS)['activations'], 2)} GB" in text
    full = dataclasses.replace(SETTINGS, recompute="full")
    assert f"the activations fall to {gb(zl.working_set(MODEL, 3, full)['activations'], 2)} GB" in text
    assert (f"stage 3 takes {zl.largest_micro_batch(MODEL, GPUS, 3, full, device='h100-80gb', max_micro_batch=64)} "
            "sequences per GPU") in text


def test_the_mixtral_thing_to_try_in_the_explorer(cells):
    text = cells["explorer-read"]
    assert ("Mixtral-8x7B: on 8 GPUs nothing fits, not even stage 3 (its model state alone is "
            f"{gb(16 * zl.parameter_count('mixtral-8x7b') // 8)} GB per GPU); move the GPUs to 20 and "
            "stage 3 fits") in text
    explorer = WillItFitExplorer(model="llama-2-7b", gpus=8, micro_batch=1, seq_len=4096,
                                 recompute="selective", flash_attention=True, device="h100-80gb")
    explorer.controls["model"].value = "mixtral-8x7b"
    assert "Fits under no strategy" in explorer.summary.value
    explorer.controls["gpus"].value = 20
    assert "ZeRO stage 3" in explorer.summary.value and "Fits under no strategy" not in explorer.summary.value
    explorer.controls["gpus"].value = 19
    assert "Fits under no strategy" in explorer.summary.value


def test_the_shipped_blocks_range_in_one_sentence(cells):
    shipped = report.load_shipped()
    relative = shipped.groupby("case")["measured_bytes"].sum() / shipped.groupby("case")["formula_bytes"].sum() - 1
    low, high = f"{round(100 * relative.min())}%", f"{round(100 * relative.max())}%"
    assert (low, high) == ("23%", "63%")
    assert f"save {low} to {high} more" in cells["left-out"]
