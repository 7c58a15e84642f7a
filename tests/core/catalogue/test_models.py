"""Model presets: exact parameter counts against the published totals, and largest layers.

The expected totals are transcribed from where they are published (cited per row), not taken
from zerolib. The per-architecture hand derivations below re-add each model's tensors.
"""
from __future__ import annotations

import dataclasses

import pytest
from conftest import optional_import

from zerolib.core.catalogue.models import (
    MODELS,
    TransformerConfig,
    active_parameter_count,
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
    ("llama-3.1-405b", 405_853_388_800,
     "Hugging Face Hub API safetensors.total for meta-llama/Llama-3.1-405B (revision "
     "b906e4dc842aa489c962f9db26554dcfdde901fe), quoted in public code"),
    ("gemma-2-9b", 9_241_705_984,
     "keras-team/keras-hub keras_hub/src/models/gemma/gemma_presets.py: gemma2_9b_en params"),
    ("mixtral-8x7b", 46_702_792_704,
     "keras-team/keras-hub keras_hub/src/models/mixtral/mixtral_presets.py: mixtral_8x7b_en params"),
]


PUBLISHED_NAMES = [p[0] for p in PUBLISHED]


@pytest.mark.parametrize("name, published, where", PUBLISHED, ids=PUBLISHED_NAMES)
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


def test_llama_3_1_405b_by_hand():
    # Llama 3 paper Table 3 and Meta's sku_list.py: 126 layers, hidden 16,384, 128 heads of 128,
    # 8 key/value heads, FFN 53,248, vocabulary 128,256, untied output.
    h, L, v, f, kv = 16384, 126, 128256, 53248, 8 * 128
    attention = 2 * h * h + 2 * h * kv             # q, o: 268,435,456 each; k, v: 16,777,216 each
    assert attention == 570_425_344
    block = attention + 3 * h * f + 2 * h          # gate/up/down 2,617,245,696 + two RMSNorms
    assert block == 3_187_703_808
    assert 2 * v * h + L * block + h == 405_853_388_800


def test_gemma_2_9b_by_hand_head_width_and_four_norms():
    # Gemma 2 paper Table 1: 16 heads of 256 (not 3584 / 16 = 224), 8 key/value heads; 4 RMSNorms
    # per layer, each one vector of 3,584; tied 256,000 x 3,584 embedding.
    h, L, v, f = 3584, 42, 256000, 14336
    q, kv = 16 * 256, 8 * 256
    block = h * q + 2 * h * kv + q * h + 3 * h * f + 4 * h
    assert block == 198_195_200
    non_embedding = L * block + h
    assert non_embedding == 8_324_201_984              # the paper's Table 2, non-embedding column
    assert v * h + non_embedding == 9_241_705_984
    # The paper's own total, 9,242,164,736, counts a vocabulary of 256,128: 3,584 x 128 more.
    assert 9_242_164_736 - parameter_count("gemma-2-9b") == 3584 * 128
    config = get_model("gemma-2-9b")
    assert config.head_width == 256 and config.query_width == 4096 and config.norms_per_layer == 4


def test_mixtral_by_hand_total_and_active():
    # Mixtral paper Table 1: 32 layers, hidden 4,096, 32 heads, 8 kv heads, expert FFN 14,336,
    # 8 experts, top-2, vocabulary 32,000; untied output.
    h, L, v, f, kv, experts, top = 4096, 32, 32000, 14336, 1024, 8, 2
    attention = 2 * h * h + 2 * h * kv
    expert = 3 * h * f                                  # w1, w3, w2: 176,160,768
    router, norms = h * experts, 2 * h
    assert L * (attention + experts * expert + router + norms) + 2 * v * h + h == 46_702_792_704
    active = L * (attention + top * expert + router + norms) + 2 * v * h + h
    assert active == 12_879_925_248 == active_parameter_count("mixtral-8x7b")
    # Rounds to Mistral AI's "12.9B active"; without the embedding and output layer it would be
    # 12.6B, so the published figure counts them, as here.
    assert round(active / 1e9, 1) == 12.9 and round((active - 2 * v * h) / 1e9, 1) == 12.6


@pytest.mark.parametrize("name", [name for name in PUBLISHED_NAMES if name != "mixtral-8x7b"])
def test_dense_models_are_all_active(name):
    assert active_parameter_count(name) == parameter_count(name)


def test_new_module_names_in_model_order():
    names = [m.name for m in modules("gemma-2-9b")]
    assert names == ["embedding", "attention_norm", "query_projection", "key_projection",
                     "value_projection", "attention_output_projection", "post_attention_norm",
                     "mlp_norm", "mlp_gate_projection", "mlp_up_projection", "mlp_down_projection",
                     "post_mlp_norm", "final_norm", "output_projection"]
    found = {m.name: m for m in modules("mixtral-8x7b")}
    assert [m.name for m in modules("mixtral-8x7b")][7:11] == [
        "router", "expert_gate_projection", "expert_up_projection", "expert_down_projection"]
    assert "mlp_up_projection" not in found
    assert (found["router"].elements, found["router"].count) == (4096 * 8, 32)
    assert (found["expert_down_projection"].elements, found["expert_down_projection"].count) == (
        14336 * 4096, 32 * 8)


def test_existing_module_names_are_unchanged():
    assert [m.name for m in modules("llama-2-7b")] == [
        "embedding", "attention_norm", "query_projection", "key_projection", "value_projection",
        "attention_output_projection", "mlp_norm", "mlp_gate_projection", "mlp_up_projection",
        "mlp_down_projection", "final_norm", "output_projection"]
    assert [m.name for m in modules("gpt2")] == [
        "embedding", "position_embedding", "attention_norm", "qkv_projection",
        "attention_output_projection", "mlp_norm", "mlp_up_projection", "mlp_down_projection",
        "final_norm", "output_projection"]


def test_head_width_need_not_divide_hidden():
    # Hidden 100 with 3 heads of 32: q is 96 wide, k and v 32 (one kv head), o maps 96 back to 100.
    config = TransformerConfig("odd", hidden=100, layers=1, heads=3, kv_heads=1, ffn_hidden=10,
                               vocab=7, max_positions=8, tied_embeddings=True, gated_mlp=False,
                               head_dim=32)
    attention = 100 * 96 + 2 * 100 * 32 + 96 * 100
    assert parameter_count(config) == 7 * 100 + 100 + attention + 100 + 2 * 100 * 10 + 100
    with pytest.raises(ValueError, match="head_dim"):
        dataclasses.replace(config, head_dim=None)     # 100 is no multiple of 3


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
    ("llama-3.1-405b", 128256 * 16384),  # 2.1B > one MLP matrix (16384 x 53248 = 872M)
    ("gemma-2-9b", 256000 * 3584),       # the tied embedding
    ("mixtral-8x7b", 32000 * 4096),      # 131M > one expert's projection (4096 x 14336 = 59M)
])
def test_largest_layer_is_deepspeed_largest_module(name, expected):
    assert largest_layer(name) == expected


def test_fused_experts_make_all_of_a_layers_experts_one_module():
    # transformers 5's MixtralExperts: gate_up_proj 8 x 28672 x 4096 + down_proj 8 x 4096 x 14336.
    assert largest_layer("mixtral-8x7b", fused_experts=True) == 8 * 28672 * 4096 + 8 * 4096 * 14336
    assert largest_layer("llama-2-7b", fused_experts=True) == largest_layer("llama-2-7b")
    with pytest.raises(TypeError, match="fused_experts"):
        largest_layer("mixtral-8x7b", fused_experts="yes")


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
    ({"norm": "batchnorm"}, ValueError), ({"position_embedding": "sinusoidal"}, ValueError),
    ({"tied_embeddings": "no"}, TypeError), ({"name": ""}, TypeError),
    ({"head_dim": 0}, ValueError), ({"head_dim": 64.0}, TypeError), ({"post_norms": 1}, TypeError),
    ({"experts": -1}, ValueError), ({"experts": 2.0}, TypeError), ({"experts": 8}, ValueError),
    ({"experts_per_token": 2}, ValueError), ({"qk_norm": "layer"}, ValueError),
    ({"shared_expert_ffn": 1408}, ValueError), ({"shared_expert_gate": 1}, TypeError),
    ({"fused_gate_up": "yes"}, TypeError),
])
def test_bad_configs_are_rejected(change, error):
    (name,) = change
    with pytest.raises(error, match=name):
        dataclasses.replace(get_model("llama-2-7b"), **change)


def test_more_experts_per_token_than_experts_is_rejected():
    with pytest.raises(ValueError, match="experts_per_token"):
        dataclasses.replace(get_model("mixtral-8x7b"), experts_per_token=9)


@pytest.mark.torch
@pytest.mark.parametrize("name", sorted(MODELS))
def test_counts_match_torch_modules_built_from_the_config(name):
    """Build each preset's modules in PyTorch on the meta device (no memory) and count them the
    way DeepSpeed's model_to_params does: unique tensors for the total, per-module own
    parameters for the largest layer."""
    torch = optional_import("torch", "pip install torch==2.13.0")
    nn = torch.nn
    c = get_model(name)
    d = c.head_width

    def mlp(block, prefix=""):
        setattr(block, prefix + "up", nn.Linear(c.hidden, c.ffn_hidden, bias=c.mlp_bias))
        if c.gated_mlp:
            setattr(block, prefix + "gate", nn.Linear(c.hidden, c.ffn_hidden, bias=c.mlp_bias))
        setattr(block, prefix + "down", nn.Linear(c.ffn_hidden, c.hidden, bias=c.mlp_bias))

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
            if c.post_norms:
                block.post_attention_norm = norm()
            block.norm2 = norm()
            if c.experts:
                block.router = nn.Linear(c.hidden, c.experts, bias=False)
                block.experts = nn.ModuleList()
                for _ in range(c.experts):
                    expert = nn.Module()
                    mlp(expert)
                    block.experts.append(expert)
            else:
                mlp(block)
            if c.post_norms:
                block.post_mlp_norm = norm()
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


# Each preset's published hyper-parameters in transformers' own terms (the model cards'
# config.json fields; see the sources above), written out here rather than read from zerolib.
TRANSFORMERS_CONFIGS = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(
        n_embd=768, n_layer=12, n_head=12, n_positions=1024, vocab_size=50257)),
    "llama-2-7b": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
        intermediate_size=11008, vocab_size=32000, max_position_embeddings=4096,
        tie_word_embeddings=False)),
    "llama-2-13b": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=5120, num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=40,
        intermediate_size=13824, vocab_size=32000, max_position_embeddings=4096,
        tie_word_embeddings=False)),
    "llama-2-70b": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
        intermediate_size=28672, vocab_size=32000, max_position_embeddings=4096,
        tie_word_embeddings=False)),
    "llama-3-8b": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        intermediate_size=14336, vocab_size=128256, max_position_embeddings=8192,
        tie_word_embeddings=False)),
    "llama-3-70b": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
        intermediate_size=28672, vocab_size=128256, max_position_embeddings=8192,
        tie_word_embeddings=False)),
    "mistral-7b-v0.1": ("MistralConfig", "MistralForCausalLM", dict(
        hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        intermediate_size=14336, vocab_size=32000, max_position_embeddings=32768,
        tie_word_embeddings=False)),
    "qwen2.5-7b": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
        intermediate_size=18944, vocab_size=152064, max_position_embeddings=131072,
        tie_word_embeddings=False)),
    "llama-3.1-405b": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=16384, num_hidden_layers=126, num_attention_heads=128, num_key_value_heads=8,
        intermediate_size=53248, vocab_size=128256, max_position_embeddings=131072,
        tie_word_embeddings=False)),
    "gemma-2-9b": ("Gemma2Config", "Gemma2ForCausalLM", dict(
        hidden_size=3584, num_hidden_layers=42, num_attention_heads=16, num_key_value_heads=8,
        head_dim=256, intermediate_size=14336, vocab_size=256000, max_position_embeddings=8192,
        tie_word_embeddings=True)),
    "mixtral-8x7b": ("MixtralConfig", "MixtralForCausalLM", dict(
        hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        intermediate_size=14336, vocab_size=32000, max_position_embeddings=32768,
        num_local_experts=8, num_experts_per_tok=2, tie_word_embeddings=False)),
}


def test_every_preset_has_a_transformers_configuration():
    assert set(TRANSFORMERS_CONFIGS) == set(MODELS)


@pytest.mark.torch
@pytest.mark.parametrize("name", list(TRANSFORMERS_CONFIGS))
def test_counts_match_transformers_models_on_the_meta_device(name):
    """The model class transformers ships, built from the published configuration on the meta
    device (no weights allocated, nothing downloaded), counts what zerolib and the publication
    count; its largest module is DeepSpeed's largest_layer_params."""
    torch = optional_import("torch", "pip install torch==2.13.0")
    transformers = optional_import("transformers", "install the validate extra: pip install -e '.[validate]'")
    config_class, model_class, fields = TRANSFORMERS_CONFIGS[name]
    config = getattr(transformers, config_class)(**fields)
    with torch.device("meta"):
        model = getattr(transformers, model_class)(config)
    total = sum(p.numel() for p in model.parameters())          # a tied weight once
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    published = dict((p[0], p[1]) for p in PUBLISHED)[name]
    assert total == parameter_count(name) == published
    # transformers 5 holds a layer's experts in one module of 3-D tensors (MixtralExperts).
    fused = any(p.dim() == 3 for p in model.parameters())
    assert largest == largest_layer(name, fused_experts=fused)
    if name == "mixtral-8x7b":
        assert fused == (int(transformers.__version__.split(".")[0]) >= 5)
