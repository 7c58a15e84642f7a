"""Megatron-LM's theoretical_memory_usage MoE path (expert parallelism) against zerolib, by hand.

Mixtral-8x7B: dense part 1,605,636,096 parameters (attention 41,943,040, norms 8,192 and router
32,768 per layer, x 32; embeddings 2 x 32000 x 4096; final norm 4,096), one routed expert of a
layer 3 x 4096 x 14336 = 176,160,768. Megatron-LM's bytes per parameter under its distributed
optimizer: 6 + 12 / d for the dense part, 6 + 12 / EDP for the experts, EDP = world / (ETP x EP x PP).
"""
from __future__ import annotations

from fractions import Fraction

from zerolib.crosscheck.conventions import megatron_theoretical_memory as megatron

DENSE, EXPERT = 1_605_636_096, 176_160_768


def test_eight_way_expert_parallelism_on_eight_gpus_by_hand():
    args = megatron.args_for("mixtral-8x7b", 4096, 1,
                             megatron.ParallelFlags(data_parallel=8, expert_parallel=8),
                             distributed_optimizer=True)
    assert megatron.expert_data_parallel_size(args) == 1
    pieces = megatron.moe_shard_pieces(args)
    assert pieces["tp_sharded"] + pieces["replicated"] == DENSE
    assert pieces["expert_sharded"] == 32 * EXPERT
    got = megatron.moe_weight_and_optimizer_bytes(args)
    assert got["dense"] == DENSE * Fraction(15, 2) == 12_042_270_720
    assert got["experts"] == 32 * EXPERT * 18 == 101_468_602_368


def test_expert_tensor_parallelism_changes_the_expert_group():
    # t = 2, d = 8 (16 GPUs), E = 4, ETP = 1: EDP = 16 / (1 x 4 x 1) = 4; experts whole, 2 a layer
    args = megatron.args_for("mixtral-8x7b", 4096, 1,
                             megatron.ParallelFlags(2, data_parallel=8, expert_parallel=4, expert_tensor_parallel=1),
                             distributed_optimizer=True)
    assert megatron.expert_data_parallel_size(args) == 4
    assert megatron.moe_shard_pieces(args)["expert_sharded"] == 32 * 2 * EXPERT
    assert megatron.moe_weight_and_optimizer_bytes(args)["experts"] == 32 * 2 * EXPERT * 9


def test_comparison_agrees_to_the_byte_but_the_named_final_norm():
    frame = megatron.moe_comparison()
    assert len(frame) == 3 * len(megatron.MOE_SETTINGS)
    plain = frame[frame.differs_by == ""]
    assert (plain.difference_bytes == 0).all()
    named = frame[frame.differs_by != ""]
    # p = 4: Megatron-LM charges the first stage 4096 / 4 final-norm parameters at 6 + 12/8 B
    assert set(named.difference_bytes) == {-1024 * 15 // 2}
    assert set(named["item"]) == {"dense", "total"}


def test_latent_attention_is_transcribed_not_refused():
    # DeepSeek-V2-Lite's config.json: latent attention beside experts (refused before)
    from conftest import REPO

    from zerolib.core.catalogue.hf_config import model_from_config
    config = model_from_config(REPO / "tests" / "data" / "deepseek-v2-lite.json")
    args = megatron.args_for(config, 4096, 1)
    assert args.multi_latent_attention and args.kv_lora_rank == 512 and args.qk_pos_emb_head_dim == 64
