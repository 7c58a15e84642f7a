"""Model presets: exact parameter counts against the published totals, and largest layers.

The expected totals are transcribed from where they are published (cited per row), not taken
from zerolib. The per-architecture hand derivations below re-add each model's tensors.
"""
from __future__ import annotations

import dataclasses

import pytest
from conftest import optional_import

from zerolib.core.models import (
    MODELS,
    get_model,
    largest_layer,
    modules,
    parameter_count,
)

# (preset, published total, where it is published)
PUBLISHED = [
    ("gpt2", 124_439_808,
     "keras-team/keras-hub keras_hub/src/models/gpt2/gpt2_presets.py: gpt2_base_en params"),
    ("llama-2-7b", 6_738_415_616,
     "keras-team/keras-hub keras_hub/src/models/llama/llama_presets.py: llama2_7b_en params"),
    ("llama-2-13b", 13_015_864_320,
     "LlamaForCausalLM num_parameters() for Llama-2-13B, quoted in public notes and the "
     "HarmBench classifier table (cais/HarmBench-Llama-2-13b-cls)"),
    ("llama-2-70b", 68_976_648_192,
     "peft print_trainable_parameters 'all params: 68,976,648,192' for Llama-2-70B; "
     "Megatron-DeepSpeed AuroraGPT-70B TOTAL_PARAMS=68976648192"),
    ("llama-3-8b", 8_030_261_248,
     "keras-team/keras-hub keras_hub/src/models/llama3/llama3_presets.py: llama3_8b_en params"),
    ("llama-3-70b", 70_553_706_496,
     "Hugging Face Hub safetensors total for the Llama-3 70B architecture (80 x 8192, GQA 8, "
     "vocab 128256), quoted in public code"),
    ("mistral-7b-v0.1", 7_241_732_096,
     "keras-team/keras-hub keras_hub/src/models/mistral/mistral_presets.py: mistral_7b_en params"),
    ("qwen2.5-7b", 7_615_616_512,
     "Hugging Face Hub safetensors total / GGUF general.parameter_count for Qwen2.5-7B; "
     "model card: 7.61B parameters"),
]


@pytest.mark.parametrize("name, published, where", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_preset_count_equals_published_total(name, published, where):
    assert parameter_count(name) == published, where


def test_every_preset_is_checked_and_has_a_source():
    assert {p[0] for p in PUBLISHED} == set(MODELS)
    for config in MODELS.values():
        assert "config.json" in config.source and len(config.source) > 40


def test_gpt2_small_by_hand():
    h, L, v, p, f = 768, 12, 50257, 1024, 3072
    block = (2 * h                      # ln_1 weight + bias
             + h * 3 * h + 3 * h        # c_attn
             + h * h + h                # attention c_proj
             + 2 * h                    # ln_2
             + h * f + f + f * h + h)   # c_fc, mlp c_proj
    assert block == 7_087_872
    assert v * h + p * h + L * block + 2 * h == 124_439_808   # tied head adds nothing


def test_llama_2_70b_by_hand_grouped_query_attention():
    h, L, v, f, kv = 8192, 80, 32000, 28672, 8 * 128
    block = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h
    assert block == 855_654_400
    assert 2 * v * h + L * block + h == 68_976_648_192


def test_qwen_counts_its_qkv_biases_and_untied_head():
    config = get_model("qwen2.5-7b")
    without_bias = dataclasses.replace(config, qkv_bias=False)
    # 28 layers x (3584 + 512 + 512) bias elements
    assert parameter_count(config) - parameter_count(without_bias) == 28 * (3584 + 512 + 512)
    tied = dataclasses.replace(config, tied_embeddings=True)
    assert parameter_count(config) - parameter_count(tied) == 152064 * 3584


def test_llama_2_rotary_buffers_are_not_parameters():
    # Checkpoints that store rotary inv_freq (head_dim / 2 = 64 per layer) total 6,738,417,664.
    assert parameter_count("llama-2-7b") == 6_738_417_664 - 32 * 64


@pytest.mark.parametrize("name, expected", [
    ("gpt2", 50257 * 768),               # the (tied) token embedding
    ("llama-2-7b", 32000 * 4096),        # embed_tokens / lm_head; an MLP matrix is 45M
    ("llama-2-70b", 32000 * 8192),       # 262M > one MLP matrix (8192 x 28672 = 235M)
    ("llama-3-8b", 128256 * 4096),
    ("qwen2.5-7b", 152064 * 3584),
])
def test_largest_layer_is_deepspeed_largest_module(name, expected):
    assert largest_layer(name) == expected


def test_largest_layer_counts_weight_and_bias_of_one_module():
    # With a tiny vocabulary GPT-2's first MLP projection c_fc is the largest module:
    # 768 x 3072 weight + 3072 bias = 2,362,368 (more than c_attn, 768 x 2304 + 2304 = 1,771,776,
    # and the MLP's c_proj, 3072 x 768 + 768 = 2,360,064).
    config = dataclasses.replace(get_model("gpt2"), vocab=100, max_positions=64)
    assert largest_layer(config) == 2_362_368


def test_get_model_is_forgiving_about_spelling_and_strict_about_names():
    assert get_model("Llama-2-7B") is MODELS["llama-2-7b"]
    assert get_model("Meta-Llama-3-8B") is MODELS["llama-3-8b"]
    with pytest.raises(ValueError, match="llama-2-7b.*qwen2.5-7b"):
        get_model("llama-9b")
    with pytest.raises(ValueError):
        get_model(7)


@pytest.mark.parametrize("change, error", [
    ({"hidden": 0}, ValueError), ({"layers": -1}, ValueError), ({"heads": 7}, ValueError),
    ({"kv_heads": 5}, ValueError), ({"vocab": 1.5}, TypeError), ({"hidden": True}, TypeError),
    ({"norm": "batchnorm"}, ValueError), ({"position_embedding": "alibi"}, ValueError),
    ({"tied_embeddings": "no"}, TypeError), ({"name": ""}, TypeError),
])
def test_bad_configs_are_rejected(change, error):
    (name,) = change
    with pytest.raises(error, match=name):
        dataclasses.replace(get_model("llama-2-7b"), **change)


@pytest.mark.torch
@pytest.mark.parametrize("name", sorted(MODELS))
def test_counts_match_torch_modules_built_from_the_config(name):
    """Build each preset's modules in PyTorch on the meta device (no memory) and count them the
    way DeepSpeed's model_to_params does: unique tensors for the total, per-module own
    parameters for the largest layer."""
    torch = optional_import("torch", "pip install torch==2.13.0")
    nn = torch.nn
    c = get_model(name)
    d = c.hidden // c.heads
    with torch.device("meta"):
        def norm():
            return nn.LayerNorm(c.hidden) if c.norm == "layernorm" else nn.RMSNorm(c.hidden)
        model = nn.Module()
        model.embed = nn.Embedding(c.vocab, c.hidden)
        if c.position_embedding == "learned":
            model.pos = nn.Embedding(c.max_positions, c.hidden)
        blocks = nn.ModuleList()
        for _ in range(c.layers):
            block = nn.Module()
            block.norm1 = norm()
            if c.fused_qkv:
                block.qkv = nn.Linear(c.hidden, c.hidden + 2 * c.kv_heads * d, bias=c.qkv_bias)
            else:
                block.q = nn.Linear(c.hidden, c.heads * d, bias=c.qkv_bias)
                block.k = nn.Linear(c.hidden, c.kv_heads * d, bias=c.qkv_bias)
                block.v = nn.Linear(c.hidden, c.kv_heads * d, bias=c.qkv_bias)
            block.o = nn.Linear(c.heads * d, c.hidden, bias=c.output_bias)
            block.norm2 = norm()
            block.up = nn.Linear(c.hidden, c.ffn_hidden, bias=c.mlp_bias)
            if c.gated_mlp:
                block.gate = nn.Linear(c.hidden, c.ffn_hidden, bias=c.mlp_bias)
            block.down = nn.Linear(c.ffn_hidden, c.hidden, bias=c.mlp_bias)
            blocks.append(block)
        model.blocks = blocks
        model.final_norm = norm()
        model.head = nn.Linear(c.hidden, c.vocab, bias=False)
        if c.tied_embeddings:
            model.head.weight = model.embed.weight
    total = sum(p.numel() for p in model.parameters())       # parameters() deduplicates ties
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    assert total == parameter_count(c)
    assert largest == largest_layer(c)
    assert sum(m.count for m in modules(c)) == sum(1 for m in model.modules()
                                                  if any(True for _ in m.parameters(recurse=False)))
