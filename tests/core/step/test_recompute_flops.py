"""The FLOPs of a step (zerolib.core.step.time, docs/flops.md): 6 per multiplied parameter and
token (the input embedding is a lookup), the attention core forward, backward (twice) and once
more per recomputation (none 6 M + 3 A, selective 6 M + 4 A, full 8 M + 4 A; Korthikanti et al.
2023, Sec. 5), causal with flash attention. Worked by hand from the model's shape."""
import numpy as np
import pytest

import zerolib as zl
from zerolib.core.memory.model_parallel import parameters_per_gpu
from zerolib.core.step.flops import idle_parameters, lookup_parameters_on, multiplied_parameters
from zerolib.core.step.parallel import parallel_step_time
from zerolib.core.step.tables import tradeoff_frame
from zerolib.core.step.time import ComputeSettings, attention_core_flops, compute_seconds, step_flops

P70 = 68_976_648_192                 # Llama-2-70B
M70 = P70 - 32_000 * 8192            # less its input embedding, a lookup: 68,714,504,192
A100_RATE = 0.4 * 312e12             # FLOP/s at the default mfu
# Llama-2-70B's attention core at 4,096 tokens, per token: 80 layers x (2 x 4,096 x 64 heads x
# 128 for Q K^T + the same for the attention over V) = 80 x 4 x 4,096 x 8,192 over the whole
# s x s matrix; a causal kernel computes half of it.
CORE70 = 80 * 4 * 4096 * 8192        # 10,737,418,240
CAUSAL70 = CORE70 // 2               # 5,368,709,120


def seventy(recompute, flash=True):
    return zl.WorkingSetSettings(seq_len=4096, micro_batch=1, recompute=recompute,
                                 flash_attention=flash)


def test_the_attention_core_by_hand():
    assert attention_core_flops("llama-2-70b", 4096) == CORE70
    assert attention_core_flops("llama-2-70b", 4096, causal=True) == CAUSAL70
    # Grouped-query attention changes nothing: the scores run over every query head.
    assert zl.get_model("llama-2-70b").kv_heads == 8
    # Tensor parallelism splits the heads, a pipeline stage holds some of the layers.
    assert attention_core_flops("llama-2-70b", 4096, 8, 10) == CORE70 // 64
    assert attention_core_flops("llama-2-70b", 4096, np.array([1, 2]), 80).tolist() == [
        CORE70, CORE70 // 2]
    # Gemma-2-9B's heads are 256 wide on a hidden size of 3,584: 42 x 4 x 2,048 x 16 x 256.
    assert attention_core_flops("gemma-2-9b", 2048) == 42 * 4 * 2048 * 16 * 256
    with pytest.raises(ValueError, match="layers"):
        attention_core_flops("llama-2-70b", 4096, 1, 81)
    with pytest.raises(TypeError, match="causal"):
        attention_core_flops("llama-2-70b", 4096, causal="yes")


def test_the_step_flops_by_hand():
    # Per token, 10 multiplied parameters and 3 FLOPs of core forward: forward 2 x 10 + 3,
    # backward 4 x 10 + 2 x 3, and what each recomputation repeats.
    assert [float(x) for x in step_flops(10, 3, "none")] == [23, 46]
    assert [float(x) for x in step_flops(10, 3, "selective")] == [23, 49]
    assert [float(x) for x in step_flops(10, 3, "full")] == [23, 69]


def test_the_input_embedding_is_a_lookup():
    # Llama-2-7B: 32,000 x 4,096 embedding rows looked up, the output projection multiplied.
    assert idle_parameters("llama-2-7b") == 32_000 * 4096
    assert multiplied_parameters("llama-2-7b") == 6_738_415_616 - 131_072_000
    # GPT-2 ties its output projection to the embedding: the one 50,257 x 768 table is
    # multiplied (as the output); its 1,024 x 768 learned positions are looked up.
    assert idle_parameters("gpt2") == 1024 * 768
    assert multiplied_parameters("gpt2") == 124_439_808 - 786_432
    # Split over a pipeline, the first stage looks up its rows of the table (t 4: 8,000 rows)
    # and the last stage's copy of the tied table is multiplied; no other stage looks anything up.
    assert lookup_parameters_on(zl.get_model("llama-2-7b"), 4, 2, np.array([0, 1])).tolist() == [
        8_000 * 4096, 0]
    assert lookup_parameters_on(zl.get_model("gpt2"), 1, 2, np.array([0, 1])).tolist() == [
        50_257 * 768 + 1024 * 768, 0]
    # A mixture's idle parameters are its skipped experts too: Mixtral's 6 of 8 experts in
    # each of 32 layers (3 x 4,096 x 14,336 each) and its 32,000 x 4,096 embedding.
    assert idle_parameters("mixtral-8x7b") == 32 * 6 * 3 * 4096 * 14336 + 32_000 * 4096


def test_for_run_reads_the_working_set():
    for recompute in ("none", "selective", "full"):
        c = ComputeSettings.for_run("llama-2-70b", seventy(recompute))
        assert (c.tokens_per_gpu, c.mfu, c.recompute) == (4096, 0.4, recompute)
        assert c.attention_flops_per_token == CAUSAL70       # flash attention: causal
        assert c.idle_parameters == 32_000 * 8192
        assert c.recomputed_attention_flops == (0 if recompute == "none" else CAUSAL70)
        assert c.attention_step_flops == (3 if recompute == "none" else 4) * CAUSAL70
        assert c.flops_per_param_token == (8 if recompute == "full" else 6)
    # Megatron-LM's unfused core computes the whole s x s matrix.
    assert ComputeSettings.for_run("llama-2-70b", seventy("none", flash=False)
                                   ).attention_flops_per_token == CORE70
    with pytest.raises(TypeError, match="settings must be a WorkingSetSettings"):
        ComputeSettings.for_run("llama-2-70b", "full")


@pytest.mark.parametrize("recompute, per_token", [
    ("none", 6 * M70 + 3 * CAUSAL70), ("selective", 6 * M70 + 4 * CAUSAL70),
    ("full", 8 * M70 + 4 * CAUSAL70)])
def test_estimate_times_the_recomputation_its_working_set_has(recompute, per_token):
    # Before: 6 x P70 (13.58 s) without recomputation, the core only when recomputed.
    (row,) = zl.estimate("llama-2-70b", 64, seq_len=4096, micro_batch=1, recompute=recompute,
                         device="a100-80gb", stages=[3], link="dgx-a100").stages
    assert row["communication"]["compute_seconds"] == pytest.approx(per_token * 4096 / A100_RATE,
                                                                     rel=1e-12)


def test_the_notebook_06_run_is_one_run():
    # 06 judges its peak with full recomputation and times the same run: (8 x 68,714,504,192
    # + 4 x 5,368,709,120) x 4,096 tokens at 124.8e12 FLOP/s = 18.7468 s in both.
    full = seventy("full")
    table = zl.group_traffic_table("llama-2-70b", 64, "dgx-a100", "a100-80gb",
                                   ComputeSettings.for_run("llama-2-70b", full))
    (row,) = zl.estimate("llama-2-70b", 64, seq_len=4096, micro_batch=1, recompute="full",
                         device="a100-80gb", stages=[3], link="dgx-a100").stages
    assert (8 * M70 + 4 * CAUSAL70) * 4096 / A100_RATE == pytest.approx(18.7468, rel=1e-5)
    assert np.allclose(table["compute_seconds"], 18.7468, rtol=1e-5)
    assert row["communication"]["compute_seconds"] == pytest.approx(18.7468, rel=1e-5)


def test_tradeoff_frame_times_its_settings():
    none, selective = (tradeoff_frame("llama-2-7b", 8, "dgx-h100", "h100-80gb",
                                      zl.WorkingSetSettings(recompute=r)).set_index("stage")
                       for r in ("none", "selective"))
    # Llama-2-7B's causal core at 4,096 tokens: 32 x 4,096 x 32 x 256 = 2^30 FLOPs per token,
    # once more, x 4,096 tokens at 0.4 x 989.5e12 FLOP/s = 0.011112 s more compute.
    extra = float(selective["compute_seconds"][3] - none["compute_seconds"][3])
    assert extra == pytest.approx(2**30 * 4096 / (0.4 * 989.5e12), rel=1e-9)


def test_the_planners_step_pays_the_core_per_stage_and_tensor_rank():
    # t 2, p 2: each GPU holds 32 of the 64 heads and 40 of the 80 layers: CAUSAL70 / 4 per
    # token, x 4,096 tokens x 2 micro-batches of 1 sequence, once more under selective.
    common = dict(seq_len=4096, micro_batch=1, tensor_parallel=2, pipeline_parallel=2,
                  data_parallel=16, stage=1, micro_batches=2)
    none, selective, full = (parallel_step_time("llama-2-70b", "dgx-a100", "a100-80gb",
                                                recompute=r, **common)
                             for r in ("none", "selective", "full"))
    core = CAUSAL70 / 4 * 4096 * 2 / A100_RATE
    assert float(selective.parts["compute"] - none.parts["compute"]) == pytest.approx(core, rel=1e-9)
    # Full: the forward's matrices again (2 FLOPs per parameter of the busier stage, the last,
    # which multiplies all it holds) and the same core.
    last = int(parameters_per_gpu("llama-2-70b", 2, 2, pipeline_stage=1))
    matrices = 2 * last * 4096 * 2 / A100_RATE
    assert float(full.parts["compute"] - none.parts["compute"]) == pytest.approx(matrices + core,
                                                                                 rel=1e-9)
    # Without recomputation: 6 per multiplied parameter and 3 x the stage's core.
    assert float(none.parts["compute"]) == pytest.approx(
        (6 * last + 3 * CAUSAL70 / 4) * 4096 * 2 / A100_RATE, rel=1e-9)


def test_a_bare_count_has_no_core():
    forward, backward = compute_seconds(10**9, "v100-32gb", ComputeSettings(1000, 0.5, "selective"))
    assert float(forward + backward) == pytest.approx(6e12 / (0.5 * 125e12))
    forward, backward = compute_seconds(10**9, "v100-32gb", ComputeSettings(1000, 0.5, "full"))
    assert float(forward + backward) == pytest.approx(8e12 / (0.5 * 125e12))
