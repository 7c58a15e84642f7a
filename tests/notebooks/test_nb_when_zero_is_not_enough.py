"""Notebook 06's prose (the main path's last notebook): every number and judgement a markdown
cell states, recomputed with zerolib.

Each test reads one markdown cell (by id), normalises its whitespace and checks the phrases that
carry numbers against values computed here, so a change in the library that moves a number makes
the sentence fail until the text (and the executed notebook) follow.
"""
from __future__ import annotations

from pathlib import Path

import nbformat
import numpy as np
import pytest
from prose_support import markdown_cells, says

import zerolib as zl
from zerolib.core.inputs import MAX_GPUS
from zerolib.core.memory.model_parallel import Pipeline
from zerolib.core.memory.pipeline_schedule import layer_activations_held
from zerolib.core.planner import FAMILIES
from zerolib.core.step.model_parallel_traffic import tensor_parallel_traffic
from zerolib.paths import APPENDIX, CHAPTER, GOING_FURTHER

STEM = "06-when-zero-is-not-enough"
# Moved out of 06 for the main path's hour, their sentences still held here: the numbers per split
# (to 08) and the fewest-GPUs table (to appendix A's A.6).
BESIDE = "08-zero-beside-model-parallelism"
APPENDIX_A = "11-appendix-papers-and-other-systems"
NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / f"{STEM}.ipynb"
GB = 10**9
M = "llama-2-70b"
A100 = zl.get_device("a100-80gb")
SELECTIVE = zl.WorkingSetSettings(seq_len=4096, micro_batch=1, recompute="selective")
FULL = zl.WorkingSetSettings(seq_len=4096, micro_batch=1, recompute="full")


@pytest.fixture(scope="module")
def notebook():
    return nbformat.read(NOTEBOOK, as_version=4)


@pytest.fixture(scope="module")
def cells():
    return markdown_cells(STEM)


@pytest.fixture(scope="module")
def a100_plan():
    return zl.plan(M, 64, 8, "a100-80gb", 4096, 1024)


def gb(n_bytes, places=2) -> str:
    return f"{n_bytes / GB:,.{places}f}"


def ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def stage3(gpus, settings=SELECTIVE):
    return zl.peak(M, gpus, 3, settings)


def acts(t, p, sp, r):
    options = zl.WorkingSetSettings(sequence_parallel=sp, recompute="selective",
                                    flash_attention=True).activation_options
    return int(zl.activation_bytes_per_gpu(M, 4096, 1, t, p, pipeline_stage=r, options=options))


def test_no_explorer_here(notebook):
    # The planner's explorer lives in 08; 06 shows the static figure and links there.
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    assert not any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs)
    assert "widgets" not in notebook.metadata


def test_title(cells):
    # "they alone are larger than an 80 GB GPU"
    assert stage3(64).working_set["activations"] > A100.capacity
    says(cells["title"], "Llama-2-70B at 4,096 tokens fits at no GPU count under ZeRO alone",
         "64 A100 80GB", "It ends the main path",
         "[the ZeRO paper](https://arxiv.org/abs/1910.02054) (Rajbhandari et al., SC20)")
    assert "Memory Optimizations Toward" not in " ".join(cells.values())      # short form only


def test_activations_intro(cells):
    says(cells["activations-intro"], "Notebook [3](03-memory-vs-model-size.ipynb) found that "
         "Llama-2-70B's model state fits on 64 GPUs and its run does not")
    assert zl.model_state_fits(zl.parameter_count(M), 64, 3, device=A100)
    assert stage3(64).total > A100.capacity


def test_activations_read(cells):
    text = cells["activations-read"]
    p3, big = stage3(64), stage3(1024)
    says(text, f"model state to {gb(p3.persistent['total'])} GB per GPU",
         f"the peak is still {gb(p3.total)} GB", f"activations alone are "
         f"{gb(p3.working_set['activations'])} GB", f"whole working set {gb(p3.working_set_total)} GB",
         f"A100's {gb(A100.capacity, 1)} GB", f"holds {gb(big.persistent['total'])} GB of state",
         f"still peaks at {gb(big.total)} GB")
    assert p3.working_set_total > A100.capacity and p3.total > 130 * GB
    assert p3.working_set_total == big.working_set_total       # "does not depend on ... GPUs"
    assert not np.any(zl.fewest_gpus_for_peak(M, [0, 1, 2, 3], SELECTIVE, device=A100))


def test_fewest_table_says_never():
    appendix = nbformat.read(NOTEBOOK.parent / f"{APPENDIX_A}.ipynb", as_version=4)
    (cell,) = [c for c in appendix.cells if c.id == "main-fewest-70b"]
    shown = "".join(cell.outputs[0]["data"]["text/plain"])
    assert "never" in shown and "<NA>" not in shown
    # Seven of the eight answers are "never"; stage 3 with full recomputation fits from 16.
    assert shown.count("never") == 7 and "16" in shown


def test_fewest_read(cells):
    text = cells["fewest-read"]
    full64 = stage3(64, FULL)
    fewest = zl.fewest_gpus_for_peak(M, 3, FULL, device=A100)
    assert MAX_GPUS == 2**24            # fewest_gpus_for_peak searches up to it
    says(text, "no stage fits at any GPU count up to 2²⁴ with selective recomputation",
         "([appendix A](11-appendix-papers-and-other-systems.ipynb) tabulates each stage)",
         f"the activations fall to {gb(full64.working_set['activations'])} GB",
         f"stage 3 fits from {fewest} GPUs", f"({gb(full64.total)} GB on 64)",
         "8 FLOPs per parameter and token instead of 6, a third more compute")
    assert zl.ComputeSettings(1, 0.4, "full").flops_per_param_token == 8
    assert zl.ComputeSettings(1, 0.4).flops_per_param_token == 6


def test_divide_table(cells):
    text = cells["divide-intro"]
    says(text, "| **tensor**, *t* GPUs", "| **sequence**", "| **pipeline**, *p* stages",
         "| **context**, *c* GPUs", "*t* at most the key/value heads (8 here)",
         "two [all-reduces](05-the-price-of-zero.ipynb#The-words) of the layer's output per layer and pass",
         "it keeps *p* micro-batches of *L*/*p* layers, *L* layers' worth",
         "ZeRO shards over *d* × *c*")
    assert zl.get_model(M).kv_heads == 8
    # The first stage keeps p micro-batches of L/p layers: L layers' worth.
    for p in (2, 4, 8, 16, 80):
        assert int(layer_activations_held(80, p, 0)) == 80
    # Two all-reduces per layer (after attention and after the MLP) in the forward pass.
    rows = tensor_parallel_traffic(M, 4096, 1, 8, Pipeline(1, micro_batches=1), 0)
    forward = [r for r in rows if r.collective == "all-reduce" and r.phase == "forward"
               and "attention and MLP" in r.what]
    assert forward[0].calls == 2 * 80
    # Context parallelism divides every activation by c: 131,072 tokens over 8 keep 16,384's.
    h100 = zl.get_device("h100-80gb")

    def peak(seq, c):
        run = zl.Run.of(M, 64, seq_len=seq, micro_batch=1, recompute="selective", tensor_parallel=8,
                        sequence_parallel=True, context_parallel=c, device=h100.name, stages=(3,))
        return zl.estimate(run).stages[0]["peak"]
    assert peak(131072, 8) == peak(16384, 1)


def test_divide_read():
    text = markdown_cells(BESIDE)["divide-read"]
    one, t8 = int(zl.parameters_per_gpu(M, 1, 1)), int(zl.parameters_per_gpu(M, 8, 1))
    p8 = int(zl.parameters_per_gpu(M, 1, 8))
    says(text, f"({one / 1e9:.2f} to {t8 / 1e9:.2f} billion per GPU)",
         f"from {gb(acts(1, 1, False, 0))} to {gb(acts(8, 1, False, 0))} GB",
         f"divides that part too: {gb(acts(8, 1, True, 0))} GB",
         f"({p8 / 1e9:.2f} billion on the heaviest stage)",
         f"first stage still keeps {gb(acts(1, 8, False, 0))} GB",
         f"keeps {gb(acts(1, 8, False, 7))} GB", f"leave {gb(acts(8, 8, True, 0))} GB")
    assert 7.5 < one / p8 < 8.0     # "by about 8"


def test_planner_intro(cells, a100_plan):
    text = cells["planner-intro"]
    says(text, "DeepSpeed 0.19.8 at its defaults unless told", "a global batch of 1,024 sequences "
         "(Llama 2's 4M tokens), 40% of peak", "the five fastest that fit")
    assert 1024 * 4096 == 4 * 2**20                       # "4M tokens" (Touvron et al., Table 1)
    assert a100_plan.settings.engine.name == "deepspeed" and a100_plan.settings.mfu == 0.4


def test_ranking_read(cells, a100_plan):
    text = cells["ranking-read"]
    c = a100_plan.counts()
    fits = a100_plan.fits
    best = fits.iloc[0]
    fits_peak = a100_plan.valid[a100_plan.valid["fits"]]
    assert len(fits_peak) == c["fit"] and (fits_peak["peak_bytes"] <= A100.capacity).all()
    says(text, f"Of {c['configurations']:,} configurations {c['fit']:,} fit: their peaks, not only "
               f"their model state, are under the A100's {gb(A100.capacity, 1)} GB")
    # The fastest, in the words of 01-06: t 2 with sequence parallelism, no pipeline, ZeRO stage 3
    # over the remaining 64 / 2 = 32 GPUs, no recomputation, 1,024 sequences / 32 = 32
    # micro-batches of one sequence per step.
    assert (int(best["tensor_parallel"]), bool(best["sequence_parallel"]), int(best["pipeline_parallel"]),
            int(best.get("context_parallel", 1)), int(best["stage"]), str(best["recompute"]),
            int(best["micro_batch"]), int(best["micro_batches"]), str(best["offload"])) == (
        2, True, 1, 1, 3, "none", 1, 32, "none")
    assert best["data_parallel"] == best["shard_group"] == 32 == 64 // 2
    says(text, "The fastest splits every layer over 2 GPUs (tensor parallelism, with sequence "
               "parallelism), uses no pipeline, and shards the model state with ZeRO stage 3 over the 32 "
               "data-parallel GPUs that remain, without recomputation, in 32 micro-batches of one sequence "
               f"per step: {gb(best['peak_bytes'])} GB per GPU, {best['step_seconds']:.1f} s per step",
         "ZeRO stage 3 over the 32 data-parallel GPUs to fit without recomputation")
    assert acts(2, 1, True, 0) * 2 == pytest.approx(acts(1, 1, False, 0), rel=0.01)  # "halves"
    # "its gathers hide": all that waits for ZeRO is the first layer's gather per micro-batch.
    assert best["data_parallel_seconds"] < 0.01 * best["step_seconds"]
    plain = fits[(fits["tensor_parallel"] == 1) & (fits["pipeline_parallel"] == 1)]
    assert set(plain["recompute"]) == {"full"}
    says(text, "ZeRO alone (*t* = *p* = 1) fits only with full recomputation",
         f"its best ranks {ordinal(int(plain.iloc[0]['rank']))}, at {plain.iloc[0]['step_seconds']:.1f} s")


def test_the_answer_uses_only_words_the_main_path_defines(notebook):
    """The main path's last notebook says its answer in terms 01-06 define: no pipeline schedule's
    name, no "ZeRO-3 over N", no "micro-batch 1 x 32" (07 and 08 define those spellings)."""
    shown = [c.source for c in notebook.cells if c.cell_type == "markdown"]
    shown += [o.get("data", {}).get("text/html", "") + o.get("data", {}).get("text/plain", "")
              for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    for text in shown:
        for spelling in ("1F1B", "ZeRO-3 over", "ZeRO-1 over", "ZeRO-2 over", "micro-batch 1 x", " x d "):
            assert spelling not in text, f"06 says {spelling!r}: {text[:200]}"


def test_figure_read(cells, a100_plan):
    says(cells["figure-read"], "a third slower", "fits only on the right",
         "ZeRO without model parallelism (the legend's \"data parallel only\", every stage)")
    valid = a100_plan.valid
    # The frontier, checked pair by pair: a row is on it when no other row is at most as slow and
    # at most as large, and strictly better in one.
    step, peak = valid["step_seconds"].to_numpy(), valid["peak_bytes"].to_numpy()
    beaten = [((step <= s) & (peak <= b) & ((step < s) | (peak < b))).any() for s, b in zip(step, peak)]
    on = valid[~np.array(beaten)]
    says(cells["figure-read"], f"the {len(on)} configurations no other beats")
    plain = valid[(valid["tensor_parallel"] == 1) & (valid["pipeline_parallel"] == 1)]
    says(cells["figure-read"], f"at best {plain[plain['fits']]['step_seconds'].min():.1f} s")
    assert set(plain[plain["fits"]]["recompute"]) == {"full"}
    assert set(plain["stage"]) == {0, 1, 2, 3}          # "every stage"
    assert FAMILIES[0] == "data parallel only" and set(plain["family"].astype(str)) == {FAMILIES[0]}
    assert zl.ComputeSettings(1, 0.4, "full").flops_per_param_token / 6 == pytest.approx(4 / 3)


def test_where_zero_stops(cells, a100_plan):
    text = cells["where-zero-stops"]
    p3 = stage3(64)
    best = a100_plan.fits.iloc[0]
    says(text, f"Llama-2-70B's {gb(p3.working_set_total)} GB is on an {gb(A100.capacity, 1)} GB A100",
         f"ZeRO stage 3 still shards the model state over the {int(best['data_parallel'])} data-parallel GPUs",
         "(08-zero-beside-model-parallelism.ipynb)", "(07-shard-groups-and-offload.ipynb)")
    assert int(best["stage"]) == 3
    # "whole on every GPU at any data-parallel count"
    assert len({zl.peak(M, n, 3, SELECTIVE).working_set_total for n in (8, 64, 512, 4096)}) == 1
    sentences = [s for s in text.removeprefix("## Where ZeRO stops").split(". ") if s.strip()]
    assert 3 <= len(sentences) <= 5


def test_summary(cells, a100_plan):
    text = cells["summary"]
    p3 = stage3(64)
    c = a100_plan.counts()
    a = a100_plan.fits.iloc[0]
    says(text, f"peaks at {gb(p3.total)} GB per GPU under stage 3 on 64 A100 80GB",
         f"its working set alone, {gb(p3.working_set_total)} GB",
         f"The planner's fastest of {c['fit']:,} configurations that fit is ZeRO stage 3 beside tensor "
         f"parallelism over {int(a['tensor_parallel'])} GPUs, {a['step_seconds']:.1f} s per step "
         "under DeepSpeed 0.19.8's rules", "The main path ends here")
    for stem in (*GOING_FURTHER, *APPENDIX):
        says(text, f"({stem}.ipynb)")
    previous, following = CHAPTER[CHAPTER.index(STEM) - 1], CHAPTER[CHAPTER.index(STEM) + 1]
    says(text, f"Previous: [5 · The price of ZeRO]({previous}.ipynb) · "
               f"Next: [7 · Shard groups and offload]({following}.ipynb) · [Contents](00-index.ipynb)")
