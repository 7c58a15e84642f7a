"""Notebook 08's prose: every number its markdown states, recomputed with zerolib.

Each test reads one markdown cell (by id), normalises its whitespace and checks the phrases that
carry numbers against values computed here, so a change that moves a number makes the sentence
fail until the text (and the executed notebook) follow.
"""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

import zerolib as zl
from zerolib.core.planner import describe_configuration
from zerolib.crosscheck.conventions.megatron_theoretical_memory import (
    args_for,
    parameters_on_most_loaded_shard,
)

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "08-size-your-own-model.ipynb"
CONFIG = ROOT / "tests" / "data" / "mistral-7b-v0.3.json"
SETTINGS = zl.WorkingSetSettings(seq_len=4096, micro_batch=1, recompute="selective")
GPT3 = ("--num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048 "
        "--max-position-embeddings 2048 --vocab-size 50257 --tensor-model-parallel-size 8")


@pytest.fixture(scope="module")
def cells():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    return {c.id: " ".join(c.source.split()) for c in nb.cells if c.cell_type == "markdown"}


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
    summary = cells["closing"].split("## Summary", 1)[1]
    assert f"({peaks[0] / 1e9:.2f} GB per GPU)" in summary and f"({peaks[3] / 1e9:.2f} GB under stage 3)" in summary
    assert f"Mistral-7B-v0.3 has {zl.parameter_count(model):,} parameters" in summary


def test_fewest_gpus(cells, model):
    fewest = zl.fewest_gpus_for_peak(model, [0, 1, 2, 3], SETTINGS,
                                     device=zl.get_device("h100-80gb")).tolist()
    assert fewest == [0, 3, 3, 3]
    assert "Stages 1 to 3 fit from 3 GPUs (0 means at no GPU count" in cells["explorer-intro"]


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


def test_megatron_gpt3(cells):
    gpt3 = zl.model_from_megatron_args(GPT3)
    total = zl.parameter_count(gpt3)
    formula = parameters_on_most_loaded_shard(args_for(gpt3, 2048, 1))
    text = cells["megatron-text"]
    assert f"comes to {total:,} parameters" in text
    assert f"padded to {gpt3.vocab:,} rows (a multiple of 128 x 8)" in text
    assert f"{total - int(formula):,} parameters fewer" in text


# ---------------------------------------------------------------------------------------------
# Mixtures of experts. Mixtral-8x7B by hand: 32 layers of 8 gated experts, each 3 matrices of
# 4,096 x 14,336, so X = 32 x 8 x 3 x 4,096 x 14,336 = 45,097,156,608 routed-expert parameters;
# the rest, D = P - X, is the dense part. Mixed-precision Adam: 2 + 2 + 12 bytes per parameter.

MIXTRAL = ROOT / "tests" / "data" / "mixtral-8x7b-v0.1.json"
EXPERTS = 32 * 8 * 3 * 4096 * 14336


@pytest.fixture(scope="module")
def mixtral():
    return zl.model_from_config(MIXTRAL)


def _gb(n_bytes, places=2):
    return f"{n_bytes / 1e9:,.{places}f}"


def _state(mixtral, gpus, stage, e):
    return zl.expert_model_state(mixtral, 1, 1, gpus, stage, expert_parallel=e)


def _by_hand(params, gpus, stage):
    """ZeRO's stages of the paper by hand: 2 + 2 + 12 bytes, the first `stage` categories of
    optimizer, gradients, parameters divided by `gpus` (exact for these counts)."""
    weights, grads, optimizer = 2 * params, 2 * params, 12 * params
    if stage >= 1:
        optimizer //= gpus
    if stage >= 2:
        grads //= gpus
    if stage >= 3:
        weights //= gpus
    return weights + grads + optimizer


def test_the_section_reads_mixtral_from_its_config(mixtral):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    (code,) = [c for c in nb.cells if c.id == "moe-state"]
    assert 'zl.model_from_config("../tests/data/mixtral-8x7b-v0.1.json")' in code.source
    assert (NOTEBOOK.parent / "../tests/data/mixtral-8x7b-v0.1.json").is_file()
    assert zl.parameter_count(mixtral) == zl.parameter_count("mixtral-8x7b") == 46_702_792_704
    assert (mixtral.layers, mixtral.experts, mixtral.experts_per_token) == (32, 8, 2)
    assert (mixtral.hidden, mixtral.ffn_hidden, mixtral.gated_mlp) == (4096, 14336, True)


def test_zero_treats_the_experts_as_dense_model_state(cells, mixtral):
    P = zl.parameter_count(mixtral)
    experts = _state(mixtral, 1, 0, 1).parameters.experts
    assert experts == EXPERTS
    text = cells["moe-intro"]
    assert f"routed experts hold {100 * experts / P:.1f} % of its {P:,} parameters" in text
    assert f"{100 * EXPERTS / P:.1f}" == "96.6"
    # Every stage on 8 GPUs: exactly the dense model of P parameters, by hand and in zerolib.
    rows = [_state(mixtral, 8, s, 1).total for s in zl.STAGES]
    assert rows == [int(zl.model_state(P, 8, s).total) for s in zl.STAGES]
    assert rows == [_by_hand(P, 8, s) for s in zl.STAGES]
    read = cells["moe-state-read"]
    assert ("On 8 GPUs without expert parallelism the row is the dense model's: "
            f"{_gb(rows[0])}, {_gb(rows[1])}, {_gb(rows[2])} and {_gb(rows[3])} GB") in read
    summary = cells["closing"].split("## Summary", 1)[1]
    assert f"what a dense model of {P / 1e9:.1f}B parameters does" in summary


def test_expert_parallelism_on_8_and_on_64_gpus(cells, mixtral):
    P, X = zl.parameter_count(mixtral), EXPERTS
    D = P - X
    h100 = zl.get_device("h100-80gb")
    read = cells["moe-state-read"]
    # 8 GPUs, E = 8: one expert a layer per GPU, a group of 8 / 8 = 1, the experts never divided.
    held = _state(mixtral, 8, 0, 8)
    assert held.parameters.experts == X // 8 == 5_637_144_576 and held.layout.expert_data_parallel == 1
    assert f"one whole expert of each layer, {X // 8:,} parameters, in a group of 8 / 8 = 1 GPU" in read
    assert all(_state(mixtral, 8, s, 8).experts["total"] == 16 * X // 8 for s in zl.STAGES)
    assert f"their {_gb(16 * X // 8)} GB stay at every stage" in read
    ep8 = [_state(mixtral, 8, s, 8).total for s in (1, 2, 3)]
    assert ep8 == [_by_hand(D, 8, s) + 16 * X // 8 for s in (1, 2, 3)]
    assert all(total > h100.capacity for total in ep8)
    assert (f"Stages 1 to 3 keep {_gb(ep8[0])}, {_gb(ep8[1])} and {_gb(ep8[2])} GB of model state, "
            f"none of them within an H100's {h100.capacity / 1e9:.1f} GB") in read
    assert _state(mixtral, 8, 3, 8).total == _state(mixtral, 8, 3, 1).total == 2 * P
    assert f"Stage 3 is {_gb(2 * P)} GB either way" in read
    # 64 GPUs, E = 8: the group is 64 / 8 = 8 and ZeRO shards the experts over it again.
    again = _state(mixtral, 64, 1, 8)
    assert again.layout.expert_data_parallel == 8
    without = _state(mixtral, 64, 1, 1).total
    assert without == _by_hand(P, 64, 1)
    assert again.total == _by_hand(D, 64, 1) + _by_hand(X // 8, 8, 1)
    assert f"stage 1 falls from {_gb(without)} to {_gb(again.total)} GB" in read
    # "d / E of them without tensor parallelism": every row of the table.
    for gpus, e in [(8, 1), (8, 8), (64, 1), (64, 8)]:
        assert _state(mixtral, gpus, 0, e).layout.expert_data_parallel == gpus // e


def test_what_moves_instead(cells, mixtral):
    X = EXPERTS
    a2a = zl.expert_traffic(mixtral, 4096, 1, 8)
    # By hand: 4 all-to-alls x 32 MoE layers; 4,096 tokens x 2 experts = 8,192 rows of 4,096
    # 16-bit values each; 7/8 of the rows go to the other 7 GPUs' experts.
    assert a2a.calls == 4 * 32 == 128
    assert a2a.rows == 4096 * 2 and a2a.handed_bytes == 8192 * 4096 * 2
    assert a2a.step_sent_bytes == 128 * (8192 * 7 // 8) * 4096 * 2
    # ZeRO-3 on 8 GPUs gathers every expert twice (forward, backward), 7/8 of 2 bytes each.
    frame = zl.traffic_frame(X, 8, stages=[3]).set_index("kind")
    gathers = int(frame.loc["all_gather", "sent_bytes"])
    assert gathers == 2 * 2 * X * 7 // 8
    assert "4 all-to-alls: the dispatch of each token to its 2 experts" in cells["moe-state-read"]
    assert "ZeRO-3's all-gathers of the same experts without expert parallelism" in cells["moe-state-read"]
    text = cells["moe-traffic-read"]
    assert (f"E = 8 costs each GPU {a2a.calls} all-to-alls per step (4 x 32 layers), each handing over "
            f"{a2a.rows:,} token rows (2 per token) of 4,096 16-bit values, "
            f"{a2a.handed_bytes / 1e6:.2f} MB, of which 7/8 leave the GPU under uniform routing: "
            f"{_gb(a2a.step_sent_bytes)} GB sent") in text
    assert f"{_gb(gathers)} GB sent per GPU, {round(gathers / a2a.step_sent_bytes)} times as much" in text
    assert round(gathers / a2a.step_sent_bytes) == 21
    # "The all-to-alls grow with the tokens, the gathers with the experts' parameters."
    assert zl.expert_traffic(mixtral, 8192, 1, 8).step_sent_bytes == 2 * a2a.step_sent_bytes
    assert zl.expert_traffic(mixtral, 4096, 2, 8).step_sent_bytes == 2 * a2a.step_sent_bytes
    summary = cells["closing"].split("## Summary", 1)[1]
    assert (f"(for Mixtral on 8 GPUs, {_gb(a2a.step_sent_bytes)} against {_gb(gathers)} GB sent per GPU "
            "per step)") in summary


def test_deepseek_v3_published_layout(cells):
    from zerolib.crosscheck import trained

    (layout,) = [run for run in trained.load() if run.run == "deepseek-v3-2048-h800"]
    t, p, d = layout.tensor_parallel, layout.pipeline_parallel, layout.data_parallel
    peak = trained.judge(layout)
    with_ep = zl.expert_model_state(layout.config, t, p, d, 1, layout.widths, expert_parallel=64)
    judged = {"parameters": peak["parameters"], "data_parallel": d,
              "expert_data_parallel": with_ep.layout.expert_data_parallel,
              "model_state_without_ep": zl.expert_model_state(layout.config, t, p, d, 1,
                                                              layout.widths).total,
              "model_state_with_ep": with_ep.total, "peak": peak["peak"], "fits": peak["fits"]}
    # The layout as the report states it (arXiv 2412.19437 Sec. 3.2), quoted in the notebook.
    assert (layout.gpus, layout.pipeline_parallel, layout.expert_parallel, layout.zero_stage) == (2048, 16, 64, 1)
    quote = ('"16-way Pipeline Parallelism (PP), 64-way Expert Parallelism (EP) spanning 8 nodes, '
             'and ZeRO-1 Data Parallelism (DP)"')
    assert quote in cells["moe-traffic-read"]
    md = (Path(__file__).parents[2] / "data" / "trained_configurations.md").read_text()
    assert " ".join(quote.strip('"').split()) in " ".join(md.split())
    text = cells["deepseek-read"]
    assert judged["parameters"] == 671_026_404_352
    assert f"Its {judged['parameters']:,} parameters (without the multi-token-prediction module)" in text
    assert (judged["data_parallel"], judged["expert_data_parallel"]) == (2048 // 16, 128 // 64)
    assert "d = 2,048 / 16 = 128 data-parallel GPUs and an expert-data-parallel group of 128 / 64 = 2" in text
    assert layout.config.experts == 256 and "all 256 experts of its stage's layers" in text
    assert (layout.widths.parameters, layout.widths.gradients) == (2, 4)   # 16-bit weights, fp32 gradients
    assert f"ZeRO-1 would keep {_gb(judged['model_state_without_ep'])} GB of model state" in text
    assert f"With E = 64 that is {_gb(judged['model_state_with_ep'])} GB" in text
    assert (layout.recompute, layout.seq_len) == ("full", 4096)
    assert f"the peak with full recomputation at 4,096 tokens is {_gb(judged['peak'])} GB" in text
    assert judged["fits"] and judged["peak"] <= zl.get_device(layout.device).capacity
    assert "the published layout is runnable on an 80 GB GPU" in text
    summary = cells["closing"].split("## Summary", 1)[1]
    assert f"layout peaks at {_gb(judged['peak'])} GB per GPU" in summary
