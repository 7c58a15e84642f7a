"""Uneven pipeline stages (``parallel.pipeline_layers``: the first and last stage's layers, the
rest split evenly), as Megatron-LM's ``--decoder-first/last-pipeline-num-layers`` split them.

Expected values are worked by hand from the architectures:

- Llama 3.1 405B (h 16384, 126 layers, 128 heads of 128, 8 key/value heads, MLP 53,248,
  vocabulary 128,256, untied): one layer is q and o 16384^2 each, k and v 16384 x 1024 each,
  three MLP matrices 16384 x 53248 and two RMSNorms of 16384: 3,187,671,040 matrix elements
  + 32,768. At t = 8: 398,458,880 + 32,768 = 398,491,648 per GPU. Its embedding and output
  layer are 16,032 rows x 16,384 = 262,668,288 each per GPU; the final norm 16,384. Meta ran
  it over 16 stages with one layer fewer on the first and last ("we reduce one Transformer
  layer each from the first and the last stages", arXiv 2407.21783 Sec. 3.3.2): 7, 8 x 14, 7.
- BLOOM-176B (h 14336, 70 layers, LayerNorm with biases, fused QKV with bias, 4h GeLU MLP with
  biases, 250,880 tied vocabulary rows), 12 stages with 5 layers plus an embedding on the first
  and last and 6 elsewhere (BigScience's tr11 notes). At t = 4 a layer is
  (3h^2 + 3h) / 4 + h^2 / 4 + h + (4h^2 + 4h) / 4 + h^2 + h + 4h = 3h^2 + 7.75h = 616,673,792;
  the embedding 62,720 rows x 14,336 = 899,153,920 (the last stage keeps its own tied copy),
  the final LayerNorm 28,672.
"""
from __future__ import annotations

import numpy as np
import pytest

from zerolib.core.catalogue.models import get_model
from zerolib.core.estimate import estimate
from zerolib.core.memory.model_parallel import Pipeline, check_parallel, grid_of, parameters_on
from zerolib.core.memory.pipeline_schedule import layer_activations_held
from zerolib.core.run import Run
from zerolib.crosscheck.trained import BLOOM

LLAMA_LAYER = (2 * 16384 * 16384 + 2 * 16384 * 1024 + 3 * 16384 * 53248) // 8 + 2 * 16384
LLAMA_VOCAB = 16032 * 16384
H = 14336
BLOOM_LAYER = 3 * H * H + 31 * H // 4
BLOOM_VOCAB = 62720 * H


def parameters_per_gpu(model, t, pipeline, pipeline_stage=None):
    return parameters_on(grid_of(model, t, pipeline, pipeline_stage))


def test_the_hand_counts_agree_with_the_model_totals():
    # the per-GPU counts x t, over every stage, are the published totals
    assert get_model("llama-3.1-405b").layers == 126 and LLAMA_LAYER == 398_491_648
    whole = 126 * (LLAMA_LAYER - 2 * 16384) * 8 + 126 * 2 * 16384 + 2 * 128256 * 16384 + 16384
    assert whole == 405_853_388_800    # Hugging Face's safetensors total
    assert BLOOM_LAYER == 616_673_792


@pytest.mark.parametrize("stage,expected", [
    (0, 7 * LLAMA_LAYER + LLAMA_VOCAB),               # 3,052,109,824
    (1, 8 * LLAMA_LAYER),                             # 3,187,933,184
    (14, 8 * LLAMA_LAYER),
    (15, 7 * LLAMA_LAYER + 16384 + LLAMA_VOCAB),      # 3,052,126,208
])
def test_llama_405b_as_meta_split_it(stage, expected):
    got = parameters_per_gpu("llama-3.1-405b", 8, Pipeline(16, first_last=(7, 7)),
                             pipeline_stage=stage)
    assert int(got) == expected


def test_the_most_loaded_stage_of_meta_split_is_a_middle_one():
    # 8 layers outweigh 7 and an embedding (262.7M < one layer's 398.5M)
    busiest = parameters_per_gpu("llama-3.1-405b", 8, Pipeline(16, first_last=(7, 7)))
    assert int(busiest) == 8 * LLAMA_LAYER == 3_187_933_184
    # the even split (126 = 16 x 7 + 14: 8 layers on stages 0-13) puts 8 layers and the
    # embedding on the first stage
    assert int(parameters_per_gpu("llama-3.1-405b", 8, 16)) == 8 * LLAMA_LAYER + LLAMA_VOCAB


@pytest.mark.parametrize("stage,expected", [
    (0, 5 * BLOOM_LAYER + BLOOM_VOCAB),                # 3,982,522,880
    (1, 6 * BLOOM_LAYER),                              # 3,700,042,752
    (11, 5 * BLOOM_LAYER + 2 * H + BLOOM_VOCAB),       # 3,982,551,552: its own tied copy
])
def test_bloom_as_bigscience_split_it(stage, expected):
    got = parameters_per_gpu(BLOOM, 4, Pipeline(12, first_last=(5, 5)), pipeline_stage=stage)
    assert int(got) == expected
    # the even split would put 6 layers and the embedding on the first: 616,673,792 more
    assert int(parameters_per_gpu(BLOOM, 4, 12, pipeline_stage=0)) == 6 * BLOOM_LAYER + BLOOM_VOCAB


def test_each_stage_keeps_the_activations_of_its_own_layers():
    # 1F1B, pipeline full: stage r holds p - r micro-batches of its layers
    held = layer_activations_held(126, 16, np.array([0, 1, 14, 15]), first_last=(7, 7))
    assert held.tolist() == [16 * 7, 15 * 8, 2 * 8, 1 * 7]
    # interleaved: 28 layers over p = 4 as (7, 7) and 7-layer middles, v = 7: 1 layer a chunk
    held = layer_activations_held(28, 4, np.array([0, 1]), schedule="interleaved", chunks=7,
                                  first_last=(7, 7))
    # rank 0: 2(p - 1) + (v - 1)p + 1 = 31 chunk passes of 1 layer; rank 1: 29
    assert held.tolist() == [31, 29]


@pytest.mark.parametrize("pipeline,first_last,message", [
    (16, (8, 8), "the layers left split evenly over the middle stages"),
    (2, (60, 60), "all of them at 2 stages"),
])
def test_splits_megatron_lm_refuses_are_refused(pipeline, first_last, message):
    with pytest.raises(ValueError, match=message):
        check_parallel("llama-3.1-405b", 8, Pipeline(pipeline, first_last=first_last))


def test_the_run_door_names_the_field_in_one_line():
    with pytest.raises(ValueError, match=r"^parallel.pipeline_layers 8,8 does not split "
                                         r"llama-3.1-405b's 126 layers over 16 stages: the other "
                                         r"110 layers must split evenly over the 14 middle stages"):
        Run.of("llama-3.1-405b", 128, tensor_parallel=8, pipeline_parallel=16, pipeline_layers=(8, 8))
    with pytest.raises(ValueError, match=r"^parallel.pipeline_layers must be two whole numbers"):
        Run.of("llama-3.1-405b", 128, tensor_parallel=8, pipeline_parallel=16, pipeline_layers=(0, 7))
    with pytest.raises(ValueError, match=r"^parallel.pipeline_layers needs parallel.pipeline of 2"):
        Run.of("llama-3.1-405b", 8, tensor_parallel=8, pipeline_layers=(7, 7))
    with pytest.raises(ValueError, match="needs a model with layers"):
        Run.of(7_000_000_000, 16, pipeline_parallel=2, pipeline_layers=(1, 1))
    # interleaved: v divides every stage's layers (Megatron-LM's TransformerConfig)
    with pytest.raises(ValueError, match="with 2 model chunks per stage each stage's layers must "
                                         "divide by 2 \\(FIRST 7, LAST 7, middle 8\\)"):
        Run.of("llama-3.1-405b", 128, tensor_parallel=8, pipeline_parallel=16, pipeline_layers=(7, 7),
               pipeline_schedule="interleaved", pipeline_chunks=2)


def test_the_run_file_round_trips_the_split():
    from zerolib.core.run_file import run_from_toml
    run = Run.of("llama-3.1-405b", 1024, tensor_parallel=8, pipeline_parallel=16,
                 pipeline_layers=(7, 7))
    text = run.to_toml()
    assert "pipeline_layers = [7, 7]" in text
    assert run_from_toml(text).parallel.pipeline_layers == (7, 7)


def _estimate(**fields):
    run = Run.of("llama-3.1-405b", 8192, device="h100-80gb", tensor_parallel=8,
                 pipeline_parallel=16, engine="megatron", stages=(1,), seq_len=8192,
                 micro_batches=16, link="dgx-h100", **fields)
    return estimate(run).stages[0]


def test_meta_split_lowers_the_peak_and_names_the_middle_stage():
    even, meta = _estimate(), _estimate(pipeline_layers=(7, 7))
    assert (even["pipeline_stage"], meta["pipeline_stage"]) == (0, 1)
    # activations: 16 micro-batches x 8 layers on the even first stage against 15 x 8 on the
    # uneven second (the first holds 16 x 7 = 112): 8 layer copies fewer, and no embedding's
    assert even["working_set"]["activations"] > meta["working_set"]["activations"]
    # parameters: the embedding's share gone (2 bytes each, ZeRO-1 keeps them whole)
    assert even["parameters"] - meta["parameters"] == 2 * LLAMA_VOCAB
    assert meta["peak"] < even["peak"]


def test_the_slowest_stage_sets_the_pace():
    """Compute per micro-batch is 6 x the multiplied parameters x tokens + the attention core
    (time.py's rule, held by its own tests); here only which stage sets it is worked by hand:
    the 8-layer middle stage (3,187,933,184 parameters, none of them a lookup) against the last
    (7 layers + the 262.7M-row output projection: 3,052,126,208) and the first (7 layers, its
    embedding a lookup). So the uneven run's compute equals an 8-layer stage's, the even
    run's first stage's (8 layers and a lookup): the same seconds."""
    even, meta = _estimate(), _estimate(pipeline_layers=(7, 7))
    assert meta["parallel_step"]["parts"]["compute"] == pytest.approx(
        even["parallel_step"]["parts"]["compute"], rel=1e-12)
    # BLOOM's split: the last stage (5 layers + the output projection, 3,982.5M) outweighs a
    # middle one (6 layers, 3,700.0M): the last sets the pace, 3,982,551,552 / 3,700,042,752 of
    # a middle stage's matrix FLOPs.
    assert (5 * BLOOM_LAYER + BLOOM_VOCAB) / (6 * BLOOM_LAYER) == pytest.approx(1.07635, rel=1e-5)


def test_bloom_last_stage_sets_the_pace_by_hand():
    """BLOOM at t 4 over 12 stages as (5, 5), s = 2048, b = 1, m = 8, no recomputation, on A100
    (312 TFLOP/s bf16) at utilisation 0.5. Per token, forward 2 M + A and backward 4 M + 2 A
    (M the multiplied parameters, A the attention core, causal under flash attention: s x 28
    heads on a GPU x (128 + 128) per layer = 14,680,064).
    Last stage: M = 3,982,551,552 (5 layers, the final norm, the output projection), 5 layers
    of core: 6 M + 3 A = 24,115,510,272 FLOPs per token. Middle: 6 layers, 3,700,042,752:
    22,464,497,664. First: 5 layers and a lookup: less. The last sets the pace."""
    run = Run.of(BLOOM, 384, device="a100-80gb", tensor_parallel=4, pipeline_parallel=12,
                 pipeline_layers=(5, 5), engine="megatron", stages=(1,), seq_len=2048,
                 micro_batches=8, link="dgx-a100", mfu=0.5, recompute="none")
    row = estimate(run).stages[0]
    per_token = 6 * (5 * BLOOM_LAYER + 2 * H + BLOOM_VOCAB) + 3 * 5 * 2048 * 28 * 256
    assert per_token == 24_115_510_272
    assert row["parallel_step"]["parts"]["compute"] == pytest.approx(
        8 * 2048 * per_token / (312e12 * 0.5), rel=1e-12)


def test_interleaved_uneven_stages_by_hand():
    """Llama-2-7B (32 layers; a layer 4 x 4096^2 + 3 x 4096 x 11008 + 2 x 4096 = 202,383,360)
    over 4 stages as 6, 8, 8, 10 with 2 model chunks a stage: chunks of 3, 4, 4 and 5 layers
    (Megatron-LM: v divides every stage's layers). The last stage holds 10 layers, the final norm
    and the 32,000 x 4,096 output layer: 2,154,909,696. In flight at the peak, rank r holds
    2 (p - r - 1) + (v - 1) p + 1 chunk passes: 11 on rank 0 (x 3 layers = 33), 9 on rank 1
    (x 4 = 36), 5 on rank 3 (x 5 = 25)."""
    layer = 4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096
    pipeline = Pipeline(4, "interleaved", 2, first_last=(6, 10))
    assert int(parameters_per_gpu("llama-2-7b", 1, pipeline, 3)) == 10 * layer + 4096 + 32000 * 4096
    assert int(parameters_per_gpu("llama-2-7b", 1, pipeline)) == 2_154_909_696
    held = layer_activations_held(32, 4, np.array([0, 1, 3]), schedule="interleaved", chunks=2,
                                  first_last=(6, 10))
    assert held.tolist() == [33, 36, 25]
    with pytest.raises(ValueError, match="chunks divide each stage's layers"):
        check_parallel("llama-2-7b", 1, Pipeline(4, "interleaved", 2, first_last=(5, 11)))
