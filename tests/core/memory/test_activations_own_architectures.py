"""Activation terms of the architectures read from config.json: each term worked out by hand.

s = 1,024 tokens, b = 2 sequences, 2-byte elements, no dropout, t = 1 unless stated.
"""
import pytest
from conftest import REPO

from zerolib.core.catalogue.hf_config import model_from_config
from zerolib.core.memory.activations import (
    ActivationOptions,
    layer_activation_terms,
    layer_shape,
    model_activation_terms,
)

S, B = 1024, 2
DATA = REPO / "tests" / "data"


def _terms(**shape):
    base = dict(ffn_hidden=1024, gated_mlp=True, kv_heads=4)
    options = ActivationOptions(dropout=False, capacity_factor=shape.pop("capacity_factor", None))
    return layer_activation_terms(layer_shape(512, 8, **{**base, **shape}), S, B, options=options)


def test_qk_norms_save_query_and_key_again():
    # Per head or over the whole projection, a norm saves its input: Q (8 heads x 64) and K
    # (4 key/value heads x 64) once more.
    plain, normed = _terms(), _terms(qk_norm="head")
    assert normed["query_norm_input"] == 2 * S * B * 8 * 64
    assert normed["key_norm_input"] == 2 * S * B * 4 * 64
    assert sum(normed.values()) - sum(plain.values()) == 2 * S * B * (512 + 256)
    assert _terms(qk_norm="projection")["key_norm_input"] == normed["key_norm_input"]
    assert plain["query_norm_input"] == 0


def test_one_shared_norm_stores_no_mlp_norm_input():
    # Falcon-7B's block: the MLP reads the norm output QKV already saved.
    shared = _terms(shared_norm=True)
    assert shared["mlp_norm_input"] == shared["mlp_input"] == 0
    assert sum(_terms().values()) - sum(shared.values()) == 2 * 2 * S * B * 512


def test_shared_expert_and_its_gate():
    # Routed: 8 experts, 2 per token, each 256 wide; shared expert 1,024 wide, gated (4 tensors
    # of s x b x 1024), its sigmoid gate (s x b values) and the gated product (s x b x h).
    terms = _terms(ffn_hidden=256, experts=8, experts_per_token=2, shared_expert_ffn=1024,
                   shared_expert_gate=True)
    for name in ("shared_expert_gate_projection", "shared_expert_activation_output",
                 "shared_expert_up_projection", "shared_expert_down_projection_input"):
        assert terms[name] == 2 * S * B * 1024, name
    assert terms["shared_expert_gate_output"] == 2 * S * B
    assert terms["shared_expert_output"] == 2 * S * B * 512
    # The routed experts' f-wide tensors: k = 2 token copies of 256.
    assert terms["mlp_gate_projection"] == 2 * S * B * 2 * 256


def test_capacity_factor_sizes_the_expert_buffers():
    # 8 experts, 2 per token, 2,048 tokens: 4,096 routed slots dropless; with c = 1.25 each
    # expert holds ceil(1.25 x 4,096 / 8) = 640 slots, 5,120 in all.
    moe = dict(ffn_hidden=256, experts=8, experts_per_token=2)
    dropless, padded = _terms(**moe), _terms(**moe, capacity_factor=1.25)
    assert dropless["expert_input"] == 2 * 4096 * 512
    assert padded["expert_input"] == 2 * 5120 * 512
    assert padded["mlp_up_projection"] == 2 * 5120 * 256
    assert padded["router_probabilities"] == dropless["router_probabilities"]   # per token
    with pytest.raises(ValueError, match="capacity_factor"):
        _terms(**moe, capacity_factor=0.5)


def test_bloom_saves_its_embedding_norm_input():
    bloom = model_from_config({"model_type": "bloom", "n_embed": 1024, "n_layer": 24,
                               "num_attention_heads": 16, "vocab_size": 250880})
    terms = model_activation_terms(bloom, S, B)
    assert terms["embedding_norm_input"] == 2 * S * B * 1024
    # A model without one holds none.
    llama = model_from_config(DATA / "tinyllama-1.1b-chat-v1.0.json")
    assert model_activation_terms(llama, S, B)["embedding_norm_input"] == 0


def test_latent_attention_terms():
    # DeepSeek-style: 8 heads, 64-wide no-rope part + 32 rotary, values 48 wide, latents of
    # 128 (queries) and 96 (keys and values): each latent saved twice (norm input, up input).
    terms = _terms(kv_heads=8, head_dim=64, kv_lora_rank=96, q_lora_rank=128, rope_head_dim=32,
                   v_head_dim=48)
    assert terms["query"] == terms["key"] == 2 * S * B * 8 * (64 + 32)
    assert terms["value"] == terms["attention_output_projection_input"] == 2 * S * B * 8 * 48
    assert terms["query_latent"] == 2 * 2 * S * B * 128
    assert terms["kv_latent"] == 2 * 2 * S * B * 96


def test_dense_first_layers_count_their_own_mlp():
    # DeepSeek-V2-Lite as read: 1 dense layer (MLP 10,944) and 26 with experts.
    config = model_from_config(DATA / "deepseek-v2-lite.json")
    common = dict(kv_heads=16, head_dim=128, kv_lora_rank=512, q_lora_rank=1536, rope_head_dim=64,
                  v_head_dim=128, gated_mlp=True)
    no_dropout = ActivationOptions(dropout=False)
    sparse = sum(layer_activation_terms(layer_shape(2048, 16, ffn_hidden=1408, experts=64,
                                                    experts_per_token=6, shared_expert_ffn=2816,
                                                    **common), S, B, options=no_dropout).values())
    dense = sum(layer_activation_terms(layer_shape(2048, 16, ffn_hidden=10944, **common), S, B,
                                       options=no_dropout).values())
    assert model_activation_terms(config, S, B)["transformer_layers"] == 26 * sparse + dense
