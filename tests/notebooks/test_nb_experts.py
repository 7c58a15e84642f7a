"""Notebook 10's prose (experts and other architectures): every number and claim its markdown
states, recomputed with zerolib (and by hand where noted).

Each test reads one markdown cell (by id), normalises its whitespace and checks the phrases that
carry numbers against values computed here, so a change that moves a number makes the sentence
fail until the text (and the executed notebook) follow.
"""
from __future__ import annotations

from conftest import documentation_text

import dataclasses
from pathlib import Path

import nbformat
import pytest
from prose_support import markdown_cells

import zerolib as zl
from zerolib.core.catalogue.devices import get_device
from zerolib.core.memory.activations import ActivationOptions, layer_activation_terms, layer_shape
from zerolib.core.units import GB

ROOT = Path(__file__).resolve().parents[2]
REPO = ROOT
NOTEBOOK = ROOT / "notebooks" / "10-experts-and-other-architectures.ipynb"
H100 = get_device("h100-80gb").capacity
SETTINGS = zl.WorkingSetSettings(seq_len=4096, micro_batch=1, recompute="selective", flash_attention=True)
GPUS = 8


@pytest.fixture(scope="module")
def cells() -> dict[str, str]:
    return markdown_cells("10-experts-and-other-architectures")


def gb(n_bytes, digits=1) -> str:
    return f"{n_bytes / GB:.{digits}f}"


def test_the_notebook_uses_notebook_4s_settings():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    (code,) = [c for c in nb.cells if c.id == "setting"]
    assert ('zl.WorkingSetSettings(seq_len=4096, micro_batch=1, recompute="selective", '
            'flash_attention=True)') in code.source
    assert "gpus = 8" in code.source and 'zl.get_device("h100-80gb")' in code.source


def test_shapes_prose(cells):
    text = cells["shapes-read"]
    big = "llama-3.1-405b"
    P = zl.parameter_count(big)
    assert f"{P:,} parameters, {zl.get_model(big).layers} layers of {zl.get_model(big).hidden:,}" in text
    assert f"{16 * P / GB:,.0f} GB without ZeRO" in text
    assert f"stage 3 needs {zl.fewest_gpus(P, 3, device='h100-80gb')} H100s just to hold it" in text
    activations = zl.working_set(big, 3, SETTINGS)["activations"]
    assert activations > H100
    assert f"its activations, {gb(activations)} GB even with selective recomputation" in text
    full = dataclasses.replace(SETTINGS, recompute="full")
    assert f"stage 3 fits from {zl.fewest_gpus_for_peak(big, 3, full, device='h100-80gb')} GPUs" in text
    assert zl.fewest_gpus_for_peak(big, 3, SETTINGS, device="h100-80gb") is None

    gemma = zl.get_model("gemma-2-9b")
    assert (gemma.heads, gemma.head_width, gemma.hidden, gemma.query_width) == (16, 256, 3584, 4096)
    assert "16 heads of 256 on a hidden size of 3,584" in text and "4,096 wide, not 3,584" in text
    assert f"{zl.parameter_count(gemma):,} parameters" in text
    logits = zl.model_activation_terms(gemma, 4096, 1)["logits_loss"]
    assert logits == 6 * 4096 * 256_000
    assert f"logits and loss {gb(logits, 2)} GB per 4,096-token sequence" in text
    terms = layer_activation_terms(layer_shape(gemma.hidden, gemma.heads, kv_heads=gemma.kv_heads,
                                               head_dim=256, post_norms=True, gated_mlp=True,
                                               ffn_hidden=gemma.ffn_hidden), 4096, 1)
    assert terms["post_attention_norm_input"] == terms["post_mlp_norm_input"] == 2 * 4096 * gemma.hidden

    moe = "mixtral-8x7b"
    assert (f"{zl.parameter_count(moe):,} parameters in all, {zl.active_parameter_count(moe):,} active "
            f"per token") in text
    assert round(zl.active_parameter_count(moe) / 1e9, 1) == 12.9
    readme = documentation_text(flat=True)
    assert f"{zl.active_parameter_count(moe):,} of Mixtral's {zl.parameter_count(moe):,}" in readme


def test_experts_prose(cells):
    moe = "mixtral-8x7b"
    P = zl.parameter_count(moe)
    text = cells["experts-intro"]
    assert f"({16 * P / GB:.1f} GB for Mixtral without ZeRO)" in text
    per_gpu = zl.model_state(P, GPUS, 3).total
    assert per_gpu == 16 * P // GPUS and per_gpu > H100
    assert f"stage 3 keeps {gb(per_gpu)} GB of model state per GPU, more than the {gb(H100)} GB" in text
    read = cells["experts-read"]
    state_only = zl.fewest_gpus(P, 3, device="h100-80gb")
    with_working_set = zl.fewest_gpus_for_peak(moe, 3, SETTINGS, device="h100-80gb")
    assert (state_only, with_working_set) == (9, 20)
    assert "Nine GPUs hold Mixtral's model state at stage 3; with the working set it takes 20" in read

    def layers(name):
        return zl.model_activation_terms(name, 4096, 1, options=SETTINGS.activation_options)[
            "transformer_layers"]

    assert f"{gb(layers(moe))} GB for 32 layers at 4,096 tokens" in read
    dense = gb(layers("mistral-7b-v0.1"))
    assert f"Mistral-7B, the same attention and width with one dense MLP, keeps {dense} GB" in read
    mistral, mixtral = zl.get_model("mistral-7b-v0.1"), zl.get_model(moe)
    assert (mistral.hidden, mistral.heads, mistral.kv_heads, mistral.ffn_hidden) == \
           (mixtral.hidden, mixtral.heads, mixtral.kv_heads, mixtral.ffn_hidden)
    # The largest module, per-expert modules against transformers 5's fused experts, and the
    # stage-3 gathered-parameter bound max(10^9, largest + 5 x 10^7) in 16-bit bytes.
    assert zl.largest_layer(moe) == 131_072_000 and "131,072,000-element embedding" in read
    fused = zl.largest_layer(moe, fused_experts=True)
    assert f"one module of {fused:,} elements" in read
    bound = max(10**9, fused + 50_000_000)
    assert f"from 10⁹ elements to {bound:,} ({gb(2 * bound, 2)} GB in 16 bits instead of 2 GB)" in read
    assert zl.working_set(moe, 3, SETTINGS)["gathered_parameters"] == 2 * 10**9
    summary = cells["summary"]
    active = zl.active_parameter_count(moe)
    assert (f"what a dense model of {P / 1e9:.1f}B parameters does, whatever its "
            f"{active / 1e9:.1f}B active parameters") in summary


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
    summary = cells["summary"]
    assert f"what a dense model of {P / 1e9:.1f}B parameters does" in summary


def test_expert_parallelism_on_8_and_on_64_gpus(cells, mixtral):
    P, X = zl.parameter_count(mixtral), EXPERTS
    D = P - X
    h100 = zl.get_device("h100-80gb")
    read = cells["moe-state-read"]
    # 8 GPUs, e = 8: one expert a layer per GPU, a group of 8 / 8 = 1, the experts never divided.
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
    # 64 GPUs, e = 8: the group is 64 / 8 = 8 and ZeRO shards the experts over it again.
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
    assert "4 all-to-alls: the dispatch of each token to its 2 experts" in cells["moe-traffic-intro"]
    assert ("(6 under full recomputation, whose second forward pass runs the first two again)"
            in cells["moe-traffic-intro"])
    again = zl.expert_traffic(mixtral, 4096, 1, 8, options=ActivationOptions(recompute="full"))
    assert (again.calls, again.step_sent_bytes) == (6 * 32, 3 * a2a.step_sent_bytes // 2)
    assert "ZeRO-3's all-gathers of the same experts without expert parallelism" in cells["moe-traffic-intro"]
    text = cells["moe-traffic-read"]
    assert (f"e = 8 costs each GPU {a2a.calls} all-to-alls per step (4 x 32 layers), each handing over "
            f"{a2a.rows:,} token rows (2 per token) of 4,096 16-bit values, "
            f"{a2a.handed_bytes / 1e6:.2f} MB, of which 7/8 leave the GPU under uniform routing: "
            f"{_gb(a2a.step_sent_bytes)} GB sent") in text
    assert f"{_gb(gathers)} GB sent per GPU, {round(gathers / a2a.step_sent_bytes)} times as much" in text
    assert round(gathers / a2a.step_sent_bytes) == 21
    # "The all-to-alls grow with the tokens, the gathers with the experts' parameters."
    assert zl.expert_traffic(mixtral, 8192, 1, 8).step_sent_bytes == 2 * a2a.step_sent_bytes
    assert zl.expert_traffic(mixtral, 4096, 2, 8).step_sent_bytes == 2 * a2a.step_sent_bytes
    summary = cells["summary"]
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
    assert quote in cells["layouts-intro"]
    md = (Path(__file__).parents[2] / "data" / "trained_configurations.md").read_text()
    assert " ".join(quote.strip('"').split()) in " ".join(md.split())
    text = cells["deepseek-read"]
    assert judged["parameters"] == 671_026_404_352
    assert f"DeepSeek-V3's {judged['parameters']:,} parameters (without the multi-token-prediction module)" in text
    assert (judged["data_parallel"], judged["expert_data_parallel"]) == (2048 // 16, 128 // 64)
    assert "d = 2,048 / 16 = 128 data-parallel GPUs and an expert-data-parallel group of 128 / 64 = 2" in text
    assert layout.config.experts == 256 and "all 256 experts of its stage's layers" in text
    assert (layout.widths.parameters, layout.widths.gradients) == (2, 4)   # 16-bit weights, fp32 gradients
    assert f"ZeRO-1 would keep {_gb(judged['model_state_without_ep'])} GB of model state" in text
    assert f"With e = 64 that is {_gb(judged['model_state_with_ep'])} GB" in text
    assert (layout.recompute, layout.seq_len) == ("full", 4096)
    assert f"the peak with full recomputation at 4,096 tokens is {_gb(judged['peak'])} GB" in text
    assert judged["fits"] and judged["peak"] <= zl.get_device(layout.device).capacity
    assert "the published layout is runnable on an 80 GB GPU" in text
    summary = cells["summary"]
    assert f"layout peaks at {_gb(judged['peak'])} GB per GPU" in summary


def test_mixtral_published_layout(cells):
    """Megatron-Core's Mixtral-8x7B benchmark layout (64 H100, t 1, p 4, e 8, the distributed
    optimizer), judged. By hand: d = 64 / (1 x 4) = 16, the experts' group 16 / 8 = 2."""
    from zerolib.crosscheck import trained

    (run,) = [r for r in trained.load() if r.run == "mixtral-8x7b-megatron-core"]
    assert (run.gpus, run.tensor_parallel, run.pipeline_parallel, run.expert_parallel,
            run.zero_stage, run.device) == (64, 1, 4, 8, 1, "h100-80gb")
    t, p, d = run.tensor_parallel, run.pipeline_parallel, run.data_parallel
    assert d == 64 // (t * p) == 16
    # bf16 parameters, fp32 gradients, fp32 Adam state: Megatron-LM's 18 bytes per parameter.
    widths = {part: sum(w for _, w in pieces) for part, pieces in run.widths.parts.items()}
    assert widths == {"parameters": 2, "gradients": 4, "optimizer": 12}
    without = zl.expert_model_state(run.config, t, p, d, 1, run.widths).total
    with_ep = zl.expert_model_state(run.config, t, p, d, 1, run.widths, expert_parallel=8)
    assert with_ep.layout.expert_data_parallel == 16 // 8 == 2
    judged = trained.judge(run)
    assert (run.recompute, run.seq_len) == ("full", 4096)
    assert {"recompute", "seq_len"} <= set(run.assumed)          # "(both assumed)"
    assert judged["fits"] and judged["peak"] <= H100
    text = cells["deepseek-read"]
    assert "Mixtral on 64 H100 with p = 4 leaves d = 16 and an experts' group of 16 / 8 = 2" in text
    assert (f"would keep {gb(without, 2)} GB of model state without expert parallelism and keeps "
            f"{gb(with_ep.total, 2)} GB with e = 8") in text
    assert (f"its peak with full recomputation at 4,096 tokens (both assumed) is "
            f"{gb(judged['peak'], 2)} GB, runnable too by this count") in text
    summary = cells["summary"]
    assert f"Mixtral's p 4 x e 8 at {gb(judged['peak'], 2)} GB" in summary
    assert "both within an 80 GB GPU by this count" in summary
    says_intro = cells["layouts-intro"]
    assert "Megatron-Core MoE documentation (MCore v0.9) benchmarks Mixtral-8x7B on 64 H100 with p = 4" in says_intro
    md = " ".join((ROOT / "data" / "trained_configurations.md").read_text().split())
    assert "Megatron-Core's MoE documentation (MCore v0.9)" in md and "on 64 H100 with t = 1, p = 4, E = 8" in md


def test_opening_summary_and_links(cells):
    text = cells["title"]
    assert text.startswith("# 10 · Experts and other architectures")
    for target in ("01-bytes-per-parameter.ipynb", "04-will-it-fit.ipynb",
                   "05-the-price-of-zero.ipynb#The-words", "09-size-your-own-model.ipynb",
                   "https://arxiv.org/abs/1910.02054"):
        assert f"]({target})" in text
    everything = " ".join(cells.values())
    assert "Rajbhandari, Rasley" not in everything and "08-size-your-own-model" not in everything
    assert "](08-zero-beside-model-parallelism.ipynb)" in cells["shapes-read"]
    summary = cells["summary"]
    assert summary.startswith("## Summary")
    assert "Previous: [9 · Size your own model](09-size-your-own-model.ipynb)" in summary
    assert "(11-appendix-papers-and-other-systems.ipynb)" in summary and "[Contents](00-index.ipynb)" in summary
    # Gemma-2-9B's 256-wide heads and four norms a layer; 405B beyond one GPU without splitting layers.
    gemma = zl.get_model("gemma-2-9b")
    assert gemma.head_width == 256 and gemma.norms_per_layer == 4
    assert "Gemma-2-9B's 256-wide heads and four norms a layer" in summary
    activations = zl.working_set("llama-3.1-405b", 3, SETTINGS)["activations"]
    from zerolib.core.catalogue.devices import DEVICES
    assert activations > max(device.capacity for device in DEVICES.values())   # "any one GPU"
    assert (f"Llama-3.1-405B's activations alone ({gb(activations)} GB at 4,096 tokens with selective "
            "recomputation) exceed any one GPU") in summary


def test_deepseek_v3_latent_attention(cells):
    """DeepSeek-V3's shape as its config.json gives it (deepseek-ai/DeepSeek-V3; arXiv 2412.19437
    Sec. 2.1.1 and 4.2): 61 layers of 7,168, the first 3 dense; 128 heads of 128 with a 64-wide
    rotary part; key/value latent 512, query latent 1,536; 256 routed experts, 8 per token."""
    from zerolib.crosscheck import trained

    config = next(r.config for r in trained.load() if r.run == "deepseek-v3-2048-h800")
    assert (config.layers, config.hidden, config.dense_layers) == (61, 7168, 3)
    assert (config.heads, config.head_width, config.rope_head_dim) == (128, 128, 64)
    assert (config.kv_lora_rank, config.q_lora_rank) == (512, 1536)
    assert (config.experts, config.experts_per_token) == (256, 8)
    text = cells["mla-read"]
    assert ("its 128 heads of 128 (plus a 64-wide rotary part) read keys and values through a "
            "512-wide latent and queries through a 1,536-wide one") in text
    assert "its first 3 of 61 layers are dense, the rest hold 256 routed experts, 8 per token" in text
    total, active = zl.parameter_count(config), zl.active_parameter_count(config)
    assert (f"counts {total:,} parameters without the multi-token-prediction module, {active:,} active "
            "per token") in text
    assert active // 10**9 == 37            # the report: "37B activated for each token"
    assert "(the report's \"37B activated for each token\")" in text
