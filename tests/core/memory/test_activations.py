"""Activations saved for backward: Korthikanti et al. (MLSys 2023) (arXiv 2205.05198) reproduced.

Expected values are the paper's Table 2 expressions evaluated by hand for the paper's own model
configurations (its Table 3: sequence length 2048, tensor-parallel size 8), and the savings it
quotes in Sec. 5. They are written out here, not computed by zerolib.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerolib.core.catalogue.models import TransformerConfig, get_model
from zerolib.core.memory.activations import (
    ActivationOptions,
    layer_activation_bytes,
    layer_activation_terms,
    layer_shape,
    model_activation_terms,
)

S = 2048   # the paper's sequence length
T = 8      # the paper's tensor-parallel size for every configuration of Table 3
# Table 3: (name, attention heads a, hidden size h, layers L)
PAPER_MODELS = [("22B", 64, 6144, 48), ("175B", 96, 12288, 96),
                ("530B", 128, 20480, 105), ("1T", 160, 25600, 128)]


def table2(s, b, h, a, t):
    """Table 2, bytes per layer, each row written as integers: sbh * x/t is (sbh * x) // t."""
    sbh, quad = s * b * h, 5 * a * s * s * b          # 5as/h * sbh = 5 a s^2 b
    return {
        "no parallelism": 34 * sbh + quad,
        "tensor parallel": 10 * sbh + 24 * sbh // t + quad // t,
        "tensor + sequence parallel": 34 * sbh // t + quad // t,
        "tensor parallel + selective": 10 * sbh + 24 * sbh // t,
        "tensor + sequence parallel + selective": 34 * sbh // t,
        "full recompute": 2 * sbh,
    }


CALLS = {
    "no parallelism": dict(),
    "tensor parallel": dict(tensor_parallel=T),
    "tensor + sequence parallel": dict(tensor_parallel=T, sequence_parallel=True),
    "tensor parallel + selective": dict(tensor_parallel=T, recompute="selective"),
    "tensor + sequence parallel + selective": dict(tensor_parallel=T, sequence_parallel=True,
                                                   recompute="selective"),
    "full recompute": dict(tensor_parallel=T, recompute="full"),
}


@pytest.mark.parametrize("row", list(CALLS))
@pytest.mark.parametrize("name, a, h, layers", PAPER_MODELS, ids=[m[0] for m in PAPER_MODELS])
@pytest.mark.parametrize("b", [1, 4])
def test_table2_rows_for_the_papers_models(row, name, a, h, layers, b):
    expected = table2(S, b, h, a, T)[row]
    assert layer_activation_bytes(S, b, h, a, **CALLS[row]) == expected


def test_gpt3_175b_worked_numbers():
    # s=2048, b=1, h=12288, a=96: sbh = 25,165,824; 5as/h = 80; sbh * (34 + 80) bytes.
    assert layer_activation_bytes(2048, 1, 12288, 96) == 25_165_824 * 114 == 2_868_903_936
    # The attention block alone is 11sbh + 5as^2b, the MLP 19sbh, the norms 4sbh (Sec. 4.1).
    terms = layer_activation_terms(layer_shape(12288, 96), 2048, 1)
    attention = sum(v for k, v in terms.items() if k.startswith(("qkv", "query", "key", "value",
                                                                 "softmax", "attention_d", "attention_o")))
    assert attention == 11 * 25_165_824 + 5 * 96 * 2048 * 2048
    assert terms["attention_norm_input"] + terms["mlp_norm_input"] == 4 * 25_165_824
    mlp = sum(v for k, v in terms.items() if k.startswith("mlp_") and "norm" not in k)
    assert mlp == 19 * 25_165_824


@pytest.mark.parametrize("a, h, saving", [(96, 12288, 0.70), (128, 20480, 0.65)],
                         ids=["GPT-3 175B", "MT-NLG 530B"])
def test_selective_recomputation_saves_what_section_5_says(a, h, saving):
    # Sec. 5: selective recomputation cuts activation memory by 70% for GPT-3 (5as/h = 80) and
    # by 65% for MT-NLG (5as/h = 64), without tensor parallelism.
    none = layer_activation_bytes(S, 1, h, a)
    selective = layer_activation_bytes(S, 1, h, a, recompute="selective")
    assert round(1 - selective / none, 2) == saving


def test_output_layer_matches_section_4_3_with_fp32_logits():
    # Sec. 4.3, no pipeline parallelism, sequence parallel: the embedding dropout mask sbh/t,
    # and the output side 4sbh/t (1 + v/h): final norm 2sbh/t + projection input 2sbh/t +
    # fp32 logits 4sbv/t. GPT-3 175B with the paper's 51,200-entry vocabulary.
    gpt3 = TransformerConfig("gpt3-175b", hidden=12288, layers=96, heads=96, kv_heads=96,
                             ffn_hidden=4 * 12288, vocab=51200, max_positions=2048,
                             tied_embeddings=True, gated_mlp=False, norm="layernorm",
                             position_embedding="learned", qkv_bias=True, output_bias=True,
                             mlp_bias=True, dropout=True)
    s, b, h, v, t = 2048, 1, 12288, 51200, 8
    terms = model_activation_terms(gpt3, s, b, t, ActivationOptions(
        sequence_parallel=True, recompute="selective", logits_bytes=(4,)))
    assert terms["embedding_dropout_mask"] == s * b * h // t
    output_side = terms["final_norm_input"] + terms["output_projection_input"] + terms["logits_loss"]
    assert output_side == 4 * s * b * h // t + 4 * s * b * v // t
    assert terms["transformer_layers"] == 96 * 34 * s * b * h // t
    assert terms["recompute_transient"] == 5 * 96 * s * s * b // t   # one layer's attention core


def test_default_logits_count_the_element_size_and_an_fp32_copy():
    # Llama-3-8B: vocabulary 128,256; 8192 tokens; bf16 logits (2 bytes) + fp32 for the loss.
    terms = model_activation_terms("llama-3-8b", 8192, 1, options=ActivationOptions(flash_attention=True))
    assert terms["logits_loss"] == (2 + 4) * 8192 * 128256
    assert terms["embedding_dropout_mask"] == 0       # trained without dropout


def test_gated_mlp_with_grouped_query_flash_attention_by_hand():
    # A Llama-2-7B layer, 4096 tokens, no dropout, flash attention:
    # norms 2*2sbh, QKV input 2sbh, Q 2sbh, K 2sbh, V 2sbh, output projection input 2sbh,
    # MLP input 2sbh, four f-wide tensors 4*2sbf, and an fp32 log-sum-exp per head and token.
    s, b, h, a, f = 4096, 1, 4096, 32, 11008
    sbh, sbf = s * b * h, s * b * f
    expected = 16 * sbh + 8 * sbf + 4 * a * s * b
    assert layer_activation_bytes(s, b, h, a, ffn_hidden=f, gated_mlp=True, flash_attention=True,
                                  dropout=False) == expected
    # Llama-2-70B's grouped-query attention: K and V are 8 heads x 128 wide, not 8192.
    s, h, a, kv, f = 4096, 8192, 64, 8, 28672
    sbh = s * h
    narrow = 2 * s * kv * 128
    expected = (4 + 2 + 2 + 2 + 2) * sbh + 2 * narrow + 8 * s * f + 4 * a * s
    assert layer_activation_bytes(s, 1, h, a, ffn_hidden=f, gated_mlp=True, flash_attention=True,
                                  dropout=False, kv_heads=kv) == expected


def test_no_dropout_keeps_only_the_softmax_output():
    # Without dropout the s x s term is the softmax output alone: 2as^2b instead of 5as^2b,
    # and the two sbh masks go: 34 - 2 = 32 sbh.
    s, b, h, a = 1024, 2, 1024, 16
    assert layer_activation_bytes(s, b, h, a, dropout=False) == 32 * s * b * h + 2 * a * s * s * b


def test_element_and_mask_widths_are_parameters():
    # fp32 activations (4 bytes) and 1-byte masks: every 2-byte term doubles, masks stay.
    s, b, h, a = 512, 1, 512, 8
    sbh, quad = s * b * h, a * s * s * b
    # 2-byte: (34 - 2) sbh of elements + 2 sbh of masks; quad: 4 of elements + 1 mask.
    assert layer_activation_bytes(s, b, h, a, element_bytes=4) == 2 * 32 * sbh + 2 * sbh + 2 * 4 * quad + quad
    assert layer_activation_bytes(s, b, h, a, mask_bytes=0) == 32 * sbh + 4 * quad


SETTINGS = st.fixed_dictionaries({
    "recompute": st.sampled_from(["none", "selective", "full"]),
    "tensor_parallel": st.sampled_from([1, 2, 4]),
    "sequence_parallel": st.booleans(),
    "flash_attention": st.booleans(),
    "gated_mlp": st.booleans(),
    "dropout": st.booleans(),
})
SHAPES = st.tuples(st.integers(1, 4096), st.sampled_from([(256, 4), (512, 8), (768, 12), (4096, 32)]))


@settings(max_examples=200, deadline=None)
@given(shape=SHAPES, batch=st.integers(1, 64), options=SETTINGS)
def test_linear_in_micro_batch(shape, batch, options):
    # Hidden sizes and heads here are multiples of every tensor-parallel degree drawn, so no
    # split rounds and the bytes are exactly proportional to the micro-batch.
    seq, (h, a) = shape
    one = layer_activation_bytes(seq, 1, h, a, **options)
    assert layer_activation_bytes(seq, batch, h, a, **options) == batch * one


@settings(max_examples=200, deadline=None)
@given(shape=SHAPES, options=SETTINGS)
def test_flash_attention_removes_the_s_by_s_term(shape, options):
    seq, (h, a) = shape
    options = {**options, "tensor_parallel": 1}
    flash = {**options, "flash_attention": True}
    # Linear in the sequence length: doubling it exactly doubles the bytes.
    assert layer_activation_bytes(2 * seq, 1, h, a, **flash) == 2 * layer_activation_bytes(seq, 1, h, a, **flash)
    slow = {**options, "flash_attention": False}
    if options["recompute"] == "none":
        # Without flash, doubling s adds 2 * (5 or 2) a s^2 b on top of doubling.
        per_score = 5 if options["dropout"] else 2
        extra = layer_activation_bytes(2 * seq, 1, h, a, **slow) - 2 * layer_activation_bytes(seq, 1, h, a, **slow)
        assert extra == 2 * per_score * a * seq * seq


@settings(max_examples=200, deadline=None)
@given(shape=SHAPES, batch=st.integers(1, 8), options=SETTINGS)
def test_full_recomputation_is_smallest(shape, batch, options):
    seq, (h, a) = shape
    by_mode = {mode: layer_activation_bytes(seq, batch, h, a, **{**options, "recompute": mode})
               for mode in ("none", "selective", "full")}
    assert by_mode["full"] <= by_mode["selective"] <= by_mode["none"]
    assert by_mode["full"] < by_mode["selective"]


def test_model_level_adds_up():
    terms = model_activation_terms("gpt2", 1024, 2, options=ActivationOptions(recompute="full"))
    # Full recomputation: each of 12 layers keeps its input, 2 * 1024 * 2 * 768 bytes.
    assert terms["transformer_layers"] == 12 * 2 * 1024 * 2 * 768
    # ... and the layer being recomputed holds a whole no-recompute layer (GPT-2 has dropout):
    # Table 2, sbh (34 + 5as/h) = 34 x 1,572,864 + 5 x 12 x 1024^2 x 2 = 179,306,496 bytes.
    assert terms["recompute_transient"] == 34 * 1024 * 2 * 768 + 5 * 12 * 1024**2 * 2 == 179_306_496


@pytest.mark.parametrize("kwargs, error", [
    (dict(seq_len=0), ValueError), (dict(seq_len=-4), ValueError), (dict(seq_len=2.5), ValueError),
    (dict(seq_len=True), TypeError), (dict(seq_len="4096"), TypeError),
    (dict(micro_batch=0), ValueError), (dict(micro_batch=float("nan")), ValueError),
    (dict(recompute="partial"), ValueError), (dict(tensor_parallel=5), ValueError),
    (dict(heads=7), ValueError), (dict(kv_heads=5), ValueError), (dict(ffn_hidden=0), ValueError),
    (dict(element_bytes=0), ValueError), (dict(mask_bytes=-1), ValueError),
    (dict(flash_attention="yes"), TypeError), (dict(sequence_parallel=1), TypeError),
])
def test_bad_input_is_rejected_with_its_name(kwargs, error):
    call = dict(seq_len=1024, micro_batch=1, hidden=768, heads=12)
    call.update(kwargs)
    name = next(iter(kwargs))
    positional = [call.pop(k) for k in ("seq_len", "micro_batch", "hidden", "heads")]
    with pytest.raises(error, match=name):
        layer_activation_bytes(*positional, **call)


def test_model_level_bad_logits_widths():
    with pytest.raises(TypeError, match="logits_bytes"):
        model_activation_terms("gpt2", 128, 1, options=ActivationOptions(logits_bytes=4))
    with pytest.raises(ValueError, match="logits_bytes"):
        model_activation_terms("gpt2", 128, 1, options=ActivationOptions(logits_bytes=(0,)))
    with pytest.raises(ValueError, match="model must be one of"):
        model_activation_terms("gpt-5", 128, 1)


def test_dropout_adds_masks_but_no_s_by_s_term_under_flash():
    llama = TransformerConfig("tiny", 256, 2, 4, 4, 1024, 1000, 512, False, True)
    on = model_activation_terms(llama, 128, 1, options=ActivationOptions(flash_attention=True, dropout=True))
    off = model_activation_terms(llama, 128, 1, options=ActivationOptions(flash_attention=True, dropout=False))
    # per layer: two 1-byte sbh masks; plus the embedding mask
    assert on["transformer_layers"] - off["transformer_layers"] == 2 * (2 * 128 * 256)
    assert on["embedding_dropout_mask"] == 128 * 256


def test_fewer_key_value_heads_than_ranks_keep_one_head_per_rank():
    # Llama-3-8B shapes (a = 32, kv = 8, head_dim 128) on 16 tensor-parallel ranks: each rank
    # holds 2 query heads but still one whole key/value head (Megatron replicates the groups).
    s, h, a = 1024, 4096, 32
    shape = layer_shape(h, a, kv_heads=8, gated_mlp=True, ffn_hidden=14336)
    options = ActivationOptions(dropout=False, flash_attention=True)
    terms = layer_activation_terms(shape, s, 1, 16, options)
    assert terms["query"] == 2 * s * 2 * 128
    assert terms["key"] == terms["value"] == 2 * s * 1 * 128
    # With 8 ranks each holds exactly one of the 8 key/value heads as well.
    terms8 = layer_activation_terms(shape, s, 1, 8, options)
    assert terms8["key"] == 2 * s * 128 and terms8["query"] == 2 * s * 4 * 128


# --- shapes beyond the dense Llama block -------------------------------------------------------

# Every preset that existed before head widths, extra norms and experts, with its shape written
# out: (name, hidden, heads, kv_heads, ffn, gated, trains with dropout).
DENSE_PRESETS = [
    ("gpt2", 768, 12, 12, 3072, False, True),
    ("llama-2-7b", 4096, 32, 32, 11008, True, False),
    ("llama-2-13b", 5120, 40, 40, 13824, True, False),
    ("llama-2-70b", 8192, 64, 8, 28672, True, False),
    ("llama-3-8b", 4096, 32, 8, 14336, True, False),
    ("llama-3-70b", 8192, 64, 8, 28672, True, False),
    ("mistral-7b-v0.1", 4096, 32, 8, 14336, True, False),
    ("qwen2.5-7b", 3584, 28, 4, 18944, True, False),
]


@pytest.mark.parametrize("name, h, a, kv, f, gated, drop", DENSE_PRESETS, ids=[p[0] for p in DENSE_PRESETS])
@pytest.mark.parametrize("s, b", [(1024, 1), (512, 3)])
@pytest.mark.parametrize("flash", [False, True])
def test_existing_presets_keep_their_numbers(name, h, a, kv, f, gated, drop, s, b, flash):
    # Sec. 4.1's list in 2-byte elements: two norm inputs, the QKV input, Q (sbh), K and V
    # (kv_heads x head_dim each), the output projection's input, the MLP's input; the MLP's
    # f-wide tensors (GeLU: input and output; gated: four); 1-byte masks after attention and MLP
    # with dropout; the s x s terms (softmax, and with dropout its mask and output: 2 + 1 + 2 bytes)
    # or, with flash attention, a 4-byte log-sum-exp per head and token.
    sbh, d = s * b * h, h // a
    expected = 2 * (6 * sbh + 2 * s * b * kv * d) + 2 * (4 if gated else 2) * s * b * f
    expected += 2 * sbh if drop else 0
    if flash:
        expected += 4 * a * s * b
    else:
        expected += (5 if drop else 2) * a * s * s * b
    terms = model_activation_terms(name, s, b, options=ActivationOptions(flash_attention=flash))
    assert terms["transformer_layers"] == get_model(name).layers * expected


def test_head_dim_equal_to_hidden_over_heads_changes_nothing():
    plain = layer_activation_terms(layer_shape(4096, 32, kv_heads=8, gated_mlp=True, ffn_hidden=14336),
                                   512, 2)
    explicit = layer_activation_terms(layer_shape(4096, 32, kv_heads=8, gated_mlp=True,
                                                  ffn_hidden=14336, head_dim=128), 512, 2)
    assert plain == explicit


def test_gemma_2_9b_layer_by_hand():
    # Gemma-2-9B, 8,192 tokens, flash attention, no dropout. Q and the output projection's input
    # are 16 heads x 256 = 4,096 wide (not the hidden 3,584); K and V 8 x 256 = 2,048. Four norm
    # inputs (before and after attention, before and after the MLP), the QKV input, the MLP input,
    # four gated-MLP tensors of 14,336, and a 4-byte log-sum-exp per head and token.
    s, h, f = 8192, 3584, 14336
    expected = (2 * (4 * s * h + s * h + s * 4096 + 2 * s * 2048 + s * 4096 + s * h)
                + 2 * 4 * s * f + 4 * 16 * s)
    terms = model_activation_terms("gemma-2-9b", s, 1, options=ActivationOptions(flash_attention=True))
    assert terms["transformer_layers"] == 42 * expected
    layer = layer_activation_terms(layer_shape(h, 16, kv_heads=8, head_dim=256, gated_mlp=True,
                                               ffn_hidden=f, post_norms=True), s, 1,
                                   options=ActivationOptions(dropout=False, flash_attention=True))
    assert layer["query"] == layer["attention_output_projection_input"] == 2 * s * 4096
    assert layer["key"] == layer["value"] == 2 * s * 2048
    assert layer["post_attention_norm_input"] == layer["post_mlp_norm_input"] == 2 * s * h


def test_mixtral_layer_by_hand():
    # Mixtral-8x7B, 4,096 tokens, flash attention, no dropout; top-2 of 8 experts, capacity
    # factor 1, no token dropped. Attention as Mistral-7B (norm, QKV input, Q, K and V of 8 x 128,
    # output projection input, log-sum-exp); MLP side: the norm input and the router's input
    # (sbh each), fp32 router probabilities (8 per token), 2 dispatched copies of the input,
    # 2 x four f-wide tensors, 2 expert outputs.
    s, h, f = 4096, 4096, 14336
    attention = 2 * (s * h + s * h + s * h + 2 * s * 1024 + s * h) + 4 * 32 * s
    mlp = 2 * (s * h + s * h) + 4 * 8 * s + 2 * 2 * s * h + 2 * 2 * 4 * s * f + 2 * 2 * s * h
    terms = model_activation_terms("mixtral-8x7b", s, 1, options=ActivationOptions(flash_attention=True))
    assert terms["transformer_layers"] == 32 * (attention + mlp)


def test_expert_mlp_terms_scale_with_experts_per_token():
    s, b, h, a, f = 256, 2, 512, 8, 1024
    common = dict(gated_mlp=True, ffn_hidden=f, dropout=False, flash_attention=True)
    options = ActivationOptions(dropout=False, flash_attention=True)
    dense = layer_activation_terms(layer_shape(h, a, gated_mlp=True, ffn_hidden=f), s, b, options=options)
    one = layer_activation_terms(layer_shape(h, a, gated_mlp=True, ffn_hidden=f, experts=8,
                                             experts_per_token=1), s, b, options=options)
    two = layer_activation_terms(layer_shape(h, a, gated_mlp=True, ffn_hidden=f, experts=8,
                                             experts_per_token=2), s, b, options=options)
    for name in ("mlp_gate_projection", "mlp_activation_output", "mlp_up_projection",
                 "mlp_down_projection_input"):
        assert dense[name] == one[name] == two[name] // 2 == 2 * s * b * f
    assert dense["expert_input"] == dense["router_probabilities"] == 0
    assert two["expert_input"] == two["expert_output"] == 2 * 2 * s * b * h
    assert one["router_probabilities"] == two["router_probabilities"] == 4 * 8 * s * b
    # Attention and the norms do not care about experts.
    assert {k: v for k, v in dense.items() if not k.startswith(("mlp_", "expert", "router"))} == \
           {k: v for k, v in two.items() if not k.startswith(("mlp_", "expert", "router"))}
    # Full recomputation keeps only the layer's input, experts or not.
    assert layer_activation_bytes(s, b, h, a, recompute="full", experts=8, experts_per_token=2,
                                  **common) == 2 * s * b * h


@pytest.mark.parametrize("kwargs", [dict(experts=8), dict(experts_per_token=2),
                                    dict(experts=2, experts_per_token=3), dict(experts=-1)])
def test_bad_expert_settings_are_rejected(kwargs):
    with pytest.raises(ValueError, match="experts"):
        layer_activation_bytes(128, 1, 256, 4, **kwargs)


def test_bad_head_dim_is_rejected():
    with pytest.raises(ValueError, match="head_dim"):
        layer_activation_bytes(128, 1, 256, 4, head_dim=0)
    with pytest.raises(ValueError, match="head_dim"):
        layer_activation_bytes(128, 1, 250, 4)        # 250 is no multiple of 4: say head_dim
    assert layer_activation_bytes(128, 1, 250, 4, head_dim=64) > 0
