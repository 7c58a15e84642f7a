"""A model whose first layers are dense and the rest hold experts (DeepSeek-V2-Lite as read
from tests/data): parameters, largest module and activations per pipeline stage, each worked
out by hand from the config's fields."""
from __future__ import annotations

import pytest
from conftest import REPO

from zerolib.core.catalogue.hf_config import model_from_config
from zerolib.core.memory.activations import ActivationOptions, layer_activation_terms, layer_shape
from zerolib.core.memory.model_parallel import Pipeline, largest_module_per_gpu, parameters_per_gpu
from zerolib.core.memory.pipeline_schedule import stage_activation_terms

CONFIG = model_from_config(REPO / "tests" / "data" / "deepseek-v2-lite.json")
TOTAL = 15_748_993_024          # the count test_hf_config pins (transformers on the meta device)

H, V, HEADS = 2048, 102400, 16
Q_RANK, KV_RANK, NOPE, ROPE, VD = 1536, 512, 128, 64, 128    # q_lora_rank: transformers' default
DENSE_F, EXPERT_F, EXPERTS, SHARED = 10944, 1408, 64, 2


def attention(t=1):
    """One layer's attention and its two norms on one of t ranks: the down projections and
    every norm whole, the up and output projections split by heads."""
    whole = H + H * Q_RANK + Q_RANK + H * (KV_RANK + ROPE) + KV_RANK + H   # norms, down projections
    split = Q_RANK * HEADS * (NOPE + ROPE) + KV_RANK * HEADS * (NOPE + VD) + HEADS * VD * H
    return whole + split // t


def dense_mlp(t=1):
    return 3 * H * DENSE_F // t


def expert_mlp(t=1):
    """Router (whole on every rank), 64 routed experts and the 2 shared ones (2 x 1408 wide)."""
    return H * EXPERTS + (EXPERTS * 3 * H * EXPERT_F + 3 * H * SHARED * EXPERT_F) // t


EMBEDDING = OUTPUT = V * H      # untied
FINAL_NORM = H


def test_hand_sum_is_the_whole_model():
    assert EMBEDDING + 27 * attention() + dense_mlp() + 26 * expert_mlp() + FINAL_NORM + OUTPUT == TOTAL
    assert parameters_per_gpu(CONFIG) == TOTAL


@pytest.mark.parametrize("t", [1, 2])
def test_three_stages_hold_their_own_layers(t):
    # 27 layers over 3 stages: 9 each; the one dense layer (layer 0) sits on stage 0.
    stage = [EMBEDDING // t + 9 * attention(t) + dense_mlp(t) + 8 * expert_mlp(t),
             9 * attention(t) + 9 * expert_mlp(t),
             9 * attention(t) + 9 * expert_mlp(t) + FINAL_NORM + OUTPUT // t]
    got = [int(parameters_per_gpu(CONFIG, t, 3, pipeline_stage=r)) for r in range(3)]
    assert got == stage
    if t == 1:
        assert sum(got) == TOTAL
    assert parameters_per_gpu(CONFIG, t, 3) == max(stage[0], stage[2])


def test_uneven_stages_and_every_divisor_sum_to_the_model():
    # 27 = 3 x 9 = 9 x 3 = 27 x 1: the stages' sum is the model for every p dividing the layers.
    for p in (1, 3, 9, 27):
        assert sum(int(parameters_per_gpu(CONFIG, 1, p, pipeline_stage=r)) for r in range(p)) == TOTAL
    # p = 27: one layer per stage, stage 0 the dense one.
    assert parameters_per_gpu(CONFIG, 1, 27, pipeline_stage=0) == EMBEDDING + attention() + dense_mlp()
    assert parameters_per_gpu(CONFIG, 1, 27, pipeline_stage=1) == attention() + expert_mlp()


def test_largest_module_counts_only_the_layers_a_stage_holds():
    # The dense MLP's 2048 x 10944 matrices (22,413,312) live on stage 0 only; a stage of expert
    # layers has the shared experts' 2048 x 2816 (5,767,168) as its largest.
    assert largest_module_per_gpu(CONFIG, 1, 27, pipeline_stage=1) == H * SHARED * EXPERT_F
    assert largest_module_per_gpu(CONFIG, 1, 27, pipeline_stage=0) == EMBEDDING
    # At t = 4 the shared experts split to 1,441,792; the query down projection stays whole.
    assert largest_module_per_gpu(CONFIG, 4, 27, pipeline_stage=1) == H * Q_RANK


S, B = 1024, 1
COMMON = dict(kv_heads=16, head_dim=128, kv_lora_rank=KV_RANK, q_lora_rank=Q_RANK,
              rope_head_dim=ROPE, v_head_dim=VD, gated_mlp=True)
OPTIONS = ActivationOptions(dropout=False, flash_attention=True)


def _layer(**mlp) -> int:
    return sum(layer_activation_terms(layer_shape(H, HEADS, **COMMON, **mlp), S, B,
                                      options=OPTIONS).values())


SPARSE = _layer(ffn_hidden=EXPERT_F, experts=EXPERTS, experts_per_token=6,
                shared_expert_ffn=SHARED * EXPERT_F)
DENSE = _layer(ffn_hidden=DENSE_F)


def test_stage_activations_count_the_dense_layer_where_it_sits():
    assert DENSE != SPARSE
    flash = ActivationOptions(flash_attention=True)
    # 1F1B, p = 3: stage 0 holds 3 micro-batches of layers 0-8 (one dense), stage 2 one of 18-26.
    first = stage_activation_terms(CONFIG, S, B, 1, 3, 0, flash)["transformer_layers"]
    last = stage_activation_terms(CONFIG, S, B, 1, 3, 2, flash)["transformer_layers"]
    assert first == 3 * (DENSE + 8 * SPARSE)
    assert last == 9 * SPARSE
    assert stage_activation_terms(CONFIG, S, B, options=flash)["transformer_layers"] == DENSE + 26 * SPARSE


def test_interleaved_counts_the_chunk_passes_that_hold_the_dense_layer():
    # p = 3, v = 3: chunks of 3 layers, rank 0 holds chunks 0, 3, 6 (layers 0-2, 9-11, 18-20).
    # Its 2(p - 1) + (v - 1)p + 1 = 11 warm-up passes run chunks 0,0,0,1,1,1,2,2,2,0,0
    # (Megatron-LM: pass k is chunk (k // p) mod v): 5 passes of its first chunk, whose 3
    # layers include the dense one, so 5 dense copies and 11 x 3 - 5 = 28 expert-layer copies.
    interleaved = Pipeline(3, "interleaved", 3)
    flash = ActivationOptions(flash_attention=True)
    got = stage_activation_terms(CONFIG, S, B, 1, interleaved, 0, flash)["transformer_layers"]
    assert got == 5 * DENSE + 28 * SPARSE
    # Rank 1 (chunks 1, 4, 7: layers 3-5, ...) holds no dense layer.
    got = stage_activation_terms(CONFIG, S, B, 1, interleaved, 1, flash)["transformer_layers"]
    assert got == (2 * 1 + 2 * 3 + 1) * 3 * SPARSE


def test_a_middle_stage_can_be_the_most_loaded():
    # 27 layers over 4 stages: 7, 7, 7, 6. An expert layer (about 571M) outweighs the
    # embedding (210M) plus the dense layer's MLP (67M), so stage 1 (7 expert layers) holds more
    # than stage 0 (embedding, the dense layer, 6 expert layers) and more than stage 3 (6 expert
    # layers, the final norm and the output layer).
    stages = [EMBEDDING + 7 * attention() + dense_mlp() + 6 * expert_mlp(),
              7 * attention() + 7 * expert_mlp(), 7 * attention() + 7 * expert_mlp(),
              6 * attention() + 6 * expert_mlp() + FINAL_NORM + OUTPUT]
    assert [int(parameters_per_gpu(CONFIG, 1, 4, pipeline_stage=r)) for r in range(4)] == stages
    assert sum(stages) == TOTAL
    assert parameters_per_gpu(CONFIG, 1, 4) == stages[1] > max(stages[0], stages[3])


def test_the_peak_is_taken_over_every_stage():
    from zerolib.core.memory.working_set import WorkingSetSettings, peaks
    # ZeRO stage 0 on 4 GPUs, no data parallelism: the model state (16 bytes a parameter) and
    # DDP's gradient copy (2 more) of stage 1's ~300M more parameters outweigh the first stage's
    # one more micro-batch of 7 layers' activations at 1,024 tokens, so stage 1 decides.
    settings = WorkingSetSettings(seq_len=1024, pipeline_parallel=4)
    (result,) = peaks(CONFIG, 4, [0], settings)
    assert result.pipeline_stage == 1
    assert result.persistent["parameters"] == 2 * (7 * attention() + 7 * expert_mlp())


def test_interleaved_chunks_place_the_dense_layers_rank_by_rank():
    # 24 layers, the first 5 dense: with p = 4 and 2 chunks of 3 layers, rank 0 holds layers
    # 0-2 and 12-14 (3 dense), rank 1 layers 3-5 and 15-17 (2 dense: 3 and 4), rank 2 none;
    # under 1F1B rank 0 holds layers 0-5 (all 5 dense) and rank 1 none.
    import json
    data = json.loads((REPO / "tests" / "data" / "deepseek-v2-lite.json").read_text())
    config = model_from_config({**data, "num_hidden_layers": 24, "first_k_dense_replace": 5})
    a, d, e = attention(), dense_mlp(), expert_mlp()
    interleaved = [EMBEDDING + 6 * a + 3 * d + 3 * e, 6 * a + 2 * d + 4 * e, 6 * a + 6 * e,
                   6 * a + 6 * e + FINAL_NORM + OUTPUT]
    got = [int(parameters_per_gpu(config, 1, 4, pipeline_stage=r, schedule="interleaved", chunks=2))
           for r in range(4)]
    assert got == interleaved
    assert int(parameters_per_gpu(config, 1, 4, pipeline_stage=1)) == 6 * a + 6 * e
    assert int(parameters_per_gpu(config, 1, 4, pipeline_stage=0)) == EMBEDDING + 6 * a + 5 * d + e
