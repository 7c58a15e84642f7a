"""Megatron-LM's theoretical_memory_usage.py (d98e8a64) latent-attention and MoE terms, by hand.

A small DeepSeek-style model (tiny-mla): h = 64, 3 layers (the first dense), 4 heads, q_lora_rank
32, kv_lora_rank 16, qk_head_dim 16, rope 8, v_head_dim 16, RMSNorm, SwiGLU, dense MLP 96, 4
routed experts of 32 (top-2), one shared expert of 32, vocabulary 256 untied. The file's terms:
  q_term     = 32 (64 + 4 (16 + 8) + 1)        =  5,152
  kv         = 16 (64 + 4 (16 + 16) + 1)       =  3,088
  rope k     = 64 x 8                          =    512
  o proj     = 4 x 16 x 64                     =  4,096   -> attention 12,848 per layer
  dense MLP  = 2 x 64 x 96 x 3/2 = 18,432; shared expert 2 x 64 x 32 x 3/2 = 6,144;
  routed     = 2 x 64 x 32 x 4 x 3/2 = 24,576 (active, top-2: 12,288); router 64 x 4 = 256;
  norms 2 x 64 = 128 per layer; final norm 64; embeddings 2 x 256 x 64 = 32,768.
  dense layer 31,408; MoE layer 43,952; total 31,408 + 2 x 43,952 + 64 + 32,768 = 152,144;
  active 31,408 + 2 x 31,664 + 64 + 32,768 = 127,568.
"""
from __future__ import annotations

import dataclasses
from fractions import Fraction

import pytest

from zerolib.core.catalogue.hf_config import model_from_config
from zerolib.crosscheck.conventions import megatron_theoretical_memory as megatron
from zerolib.crosscheck.trained import ARCHITECTURES

TINY = model_from_config({
    "model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 96,
    "moe_intermediate_size": 32, "n_routed_experts": 4, "n_shared_experts": 1,
    "num_experts_per_tok": 2, "first_k_dense_replace": 1, "kv_lora_rank": 16, "q_lora_rank": 32,
    "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "vocab_size": 256,
    "tie_word_embeddings": False, "max_position_embeddings": 128, "moe_layer_freq": 1},
    name="tiny-mla")
MOE_LAYER = 43_952


def test_parameter_counts_of_a_small_latent_model_by_hand():
    counts = megatron.parameter_counts(megatron.args_for(TINY, 16, 1))
    assert counts["total"] == 152_144 and counts["active"] == 127_568
    assert counts["mtp_block"] == 0 and counts["embedding_layers"] == 32_768


def test_parameters_agree_with_zerolib_to_the_parameter():
    frame = megatron.parameter_comparison(TINY)
    assert list(frame.zerolib_bytes) == [152_144, 127_568]
    assert (frame.difference_bytes == 0).all() and (frame.differs_by == "").all()


def test_deepseek_v3_is_its_published_671b_and_37b_active():
    # the report (arXiv 2412.19437): 671B total, 37B activated per token, without the MTP module
    frame = megatron.parameter_comparison(ARCHITECTURES["deepseek-v3"]).set_index("item")
    assert frame.loc["total parameters", "megatron_bytes"] == 671_026_404_352
    assert round(frame.loc["total parameters", "megatron_bytes"] / 1e9) == 671
    # 37,552,282,624 active (the embedding and output layer included): the report's "37B"
    assert frame.loc["active parameters", "megatron_bytes"] == 37_552_282_624
    assert (frame.difference_bytes == 0).all()


def test_deepseek_v3_with_its_mtp_layer_counts_one_moe_layer_more():
    # one MoE layer of DeepSeek-V3: MLA 187,107,328 (q 1536 (7168 + 128 x 192 + 1) = 48,760,320;
    # kv 512 (7168 + 128 x 256 + 1) = 20,448,768; 7168 x 64 = 458,752; o 128 x 128 x 7168 =
    # 117,440,512), routed 256 x 3 x 7168 x 2048 = 11,274,289,152, shared 3 x 7168 x 2048 =
    # 44,040,192, router 7168 x 256 = 1,835,008, norms 14,336: 11,507,286,016
    frame = megatron.parameter_comparison(ARCHITECTURES["deepseek-v3"], mtp_layers=1)
    assert set(frame.difference_bytes) == {-11_507_286_016}
    assert set(frame.differs_by) == {"mtp-layers"}


def test_expert_sharded_shard_by_hand():
    # t = 2, d = 2 (4 GPUs), E = 2, ETP = 1: EDP = 4 / (1 x 2 x 1) = 2; 6 + 12/2 = 12 B each
    args = megatron.args_for(TINY, 16, 1,
                             megatron.ParallelFlags(2, data_parallel=2, expert_parallel=2, expert_tensor_parallel=1),
                             distributed_optimizer=True)
    pieces = megatron.moe_shard_pieces(args)
    # (3 x 12,848 + 18,432 + 2 x 6,144 + 2 x 16,384) / 2; 3 x 128 + 2 x 256 + 64; 2 x 24,576 / 2
    assert pieces == {"tp_sharded": 51_016, "replicated": 960, "expert_sharded": 24_576}
    got = megatron.moe_weight_and_optimizer_bytes(args)
    assert got["dense"] == 51_976 * 12 and got["experts"] == 24_576 * 12


def test_mtp_layer_on_the_most_loaded_shard_by_hand():
    # the MTP layer is a MoE layer (the last layer is), whole on the shard (not divided by p)
    args = megatron.args_for(TINY, 16, 1,
                             megatron.ParallelFlags(2, data_parallel=2, expert_parallel=2, expert_tensor_parallel=1),
                             distributed_optimizer=True, mtp_layers=1)
    pieces = megatron.moe_shard_pieces(args)
    assert pieces == {"tp_sharded": 51_016 + (12_848 + 6_144) // 2, "replicated": 960 + 128 + 256,
                      "expert_sharded": 24_576 + 24_576 // 2}
    assert megatron.parameter_counts(args)["total"] == 152_144 + MOE_LAYER


def test_latent_down_projections_are_the_only_difference_at_t_2():
    # zerolib keeps the down projections and their norms whole on each rank; the file divides
    # them by t: (32 x 65 + 16 x 65 + 64 x 8) x 3 layers / 2 = 5,448 parameters at 12 B
    frame = megatron.moe_comparison(TINY, ((2, 1, 2, 2, 1, True), (1, 1, 4, 4, None, True)))
    at_two = frame[frame.model.str.contains("t=2")].set_index("item")
    assert at_two.loc["dense", "difference_bytes"] == 5_448 * 12 == at_two.loc["total", "difference_bytes"]
    assert at_two.loc["experts", "difference_bytes"] == 0
    assert set(at_two.loc[["dense", "total"], "differs_by"]) == {"latent-down-over-t"}
    at_one = frame[frame.model.str.contains("t=1")]
    assert (at_one.difference_bytes == 0).all() and (at_one.differs_by == "").all()


def test_deepseek_v3_state_reconciles_term_by_term():
    ds = ARCHITECTURES["deepseek-v3"]
    frame = megatron.moe_comparison(ds, megatron.MLA_SETTINGS)
    down = 1536 * 7169 + 512 * 7169 + 7168 * 64           # 15,140,864 per layer
    assert megatron.latent_down_parameters(ds) == down
    for (t, _, d, _, _, distributed), rows in zip(megatron.MLA_SETTINGS,
                                                  [frame.iloc[i:i + 3] for i in range(0, len(frame), 3)]):
        per_parameter = 6 + Fraction(12, d) if distributed else 18
        expected = down * 61 * (1 - Fraction(1, t)) * per_parameter
        assert list(rows.difference_bytes) == [expected, 0, expected]


def test_what_zerolib_cannot_express_is_refused():
    args = megatron.args_for(TINY, 16, 1)
    # transcribed: a latent MoE adds its two projections, the experts work on the latent width
    latent = dataclasses.replace(args, moe_latent_size=16)
    counts = megatron.parameter_counts(latent)
    # per MoE layer: projections 2 x 64 x 16 = 2,048 more; routed 2 x 16 x 32 x 4 x 3/2 = 6,144
    assert counts["total"] == 152_144 + 2 * (2_048 - (24_576 - 6_144)) == 119_376
    with pytest.raises(ValueError, match="moe_latent_size 16: a latent mixture of experts"):
        megatron.check_zerolib_expressible(latent)
    biased = dataclasses.replace(args, add_bias_linear=True)
    assert megatron.parameter_counts(biased)["total"] == 152_144 + 2 * 4      # the router's bias
    with pytest.raises(ValueError, match="router with a bias"):
        megatron.check_zerolib_expressible(biased)
    with pytest.raises(ValueError, match="mtp_layers"):
        megatron.args_for(TINY, 16, 1, mtp_layers=0)


def test_context_parallelism_enters_the_world_size():
    # t = 1, p = 1, d = 2, C = 2: world 4; E = 4, ETP = 1: EDP = 4 / 4 = 1 (was 2 / 4 = 0)
    args = megatron.args_for(TINY, 16, 1,
                             megatron.ParallelFlags(data_parallel=2, context_parallel=2, expert_parallel=4),
                             distributed_optimizer=True)
    assert args.world_size == 4 and megatron.expert_data_parallel_size(args) == 1


def test_latent_attention_needs_its_ranks():
    args = dataclasses.replace(megatron.args_for(TINY, 16, 1), kv_lora_rank=None)
    with pytest.raises(ValueError, match="multi_latent_attention needs kv_lora_rank"):
        megatron.parameter_counts(args)
