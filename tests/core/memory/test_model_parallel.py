"""Tensor- and pipeline-parallel parameters per GPU: split rules, stages, validity.

Expected values are worked out by hand from the architectures (comments show the arithmetic);
the brute-force checks compare the vectorised "most-loaded stage" with every stage.
"""
from __future__ import annotations

import numpy as np
import pytest

from zerolib.core.catalogue.models import MODELS, Module, TransformerConfig, get_model, largest_layer, parameter_count
from zerolib.core.memory import model_parallel as mp
from zerolib.core.memory.accounting import model_state


def test_every_module_of_every_preset_has_a_split_rule():
    for name in MODELS:
        for module in mp.module_splits(name):        # raises on a module without a rule
            assert module.split in mp.SPLITS and module.place in mp.PLACES


def test_a_module_without_a_rule_is_an_error(monkeypatch):
    extra = (*mp.modules(MODELS["llama-2-7b"]), Module("expert_router", 4096 * 8, 32))
    monkeypatch.setattr(mp, "modules", lambda config: extra)
    with pytest.raises(ValueError, match="'expert_router' has no tensor-parallel split rule"):
        mp.parameters_per_gpu("llama-2-7b", 2)


def test_one_gpu_holds_the_whole_model():
    for name in MODELS:
        assert int(mp.parameters_per_gpu(name)) == parameter_count(name)
        assert int(mp.largest_module_per_gpu(name)) == largest_layer(name)


def test_llama_2_70b_on_8_tensor_parallel_ranks_by_hand():
    # Per layer: q, o 8192 x 8192 (67,108,864 each), k, v 8192 x 1024 (8,388,608 each),
    # gate/up/down 8192 x 28672 (234,881,024 each): 855,638,016 split 8 ways = 106,954,752;
    # two RMSNorm weights (2 x 8192) whole: 106,971,136 per layer.
    per_layer = 855_638_016 // 8 + 16_384
    embedding = 32_000 * 8192 // 8                    # 32,768,000 rows x 8192 / 8
    assert int(mp.parameters_per_gpu("llama-2-70b", 8)) == 80 * per_layer + 2 * embedding + 8192
    # 4 stages of 20 layers: the first adds the embedding, the last the output layer and the
    # final norm, so the last stage is the most loaded (by the 8,192-element norm).
    first = int(mp.parameters_per_gpu("llama-2-70b", 8, 4, pipeline_stage=0))
    last = int(mp.parameters_per_gpu("llama-2-70b", 8, 4, pipeline_stage=3))
    middle = int(mp.parameters_per_gpu("llama-2-70b", 8, 4, pipeline_stage=1))
    assert (first, middle, last) == (20 * per_layer + embedding, 20 * per_layer,
                                     20 * per_layer + embedding + 8192)
    assert int(mp.parameters_per_gpu("llama-2-70b", 8, 4)) == last == 2_172_198_912


def test_gpt2_biases_positions_and_tied_output_by_hand():
    # GPT-2 small on 4 ranks. Per layer: two LayerNorms (2 x 1536) whole; c_attn 768 x 2304 +
    # 2304 bias, column-parallel: 1,771,776 / 4 = 442,944; c_proj 768 x 768 / 4 = 147,456 plus
    # its 768 bias whole (row-parallel); fc1 (768 x 3072 + 3072) / 4 = 590,592; fc2 768 x 3072 / 4
    # = 589,824 plus 768. Sum 1,775,424.
    per_layer = 3072 + 442_944 + 147_456 + 768 + 590_592 + 589_824 + 768
    assert per_layer == 1_775_424
    embedding = 12_565 * 768          # ceil(50257 / 4) = 12,565 rows on the most-loaded rank
    positions = 1024 * 768            # learned positions, replicated
    assert int(mp.parameters_per_gpu("gpt2", 4)) == 12 * per_layer + embedding + positions + 1536
    # Two stages: the tied output layer becomes a second copy of the embedding on stage 1.
    stages = [int(mp.parameters_per_gpu("gpt2", 4, 2, pipeline_stage=r)) for r in (0, 1)]
    assert stages == [6 * per_layer + embedding + positions, 6 * per_layer + 1536 + embedding]
    table = mp.split_table("gpt2", 4).set_index("module")
    assert table.at["attention_output_projection", "elements_per_gpu"] == 147_456 + 768
    assert table.at["output_projection", "shared"] and table.at["embedding", "split"] == "vocabulary"


def test_splits_of_a_module_sum_back_to_it():
    """t ranks of a split module hold the module (plus t - 1 copies of what is replicated)."""
    for name in ("gpt2", "qwen2.5-7b", "llama-3-8b"):
        config = get_model(name)
        for piece in mp.module_splits(config):
            if piece.split in ("column", "row"):
                for t in (1, 2, 4):
                    share = int(mp._rank_elements(piece, np.int64(t), 1))
                    assert t * share == piece.elements + (t - 1) * piece.replicated


def test_megatron_vocabulary_padding():
    # Shoeybi et al. Sec. 5.1: GPT-2's 50,257 padded "to be divisible by 128 x 8 = 1024,
    # resulting in a padded vocabulary size of 51,200": 6,400 rows per rank of 8.
    assert int(mp.vocabulary_rows(50_257, 8, 128)) == 51_200 // 8
    assert int(mp.vocabulary_rows(50_257, 8)) == 6_283          # ceil(50257 / 8), no padding
    assert int(mp.vocabulary_rows(32_000, 8, 128)) == 4_096     # 32000 -> 32768 / 8
    padded = int(mp.parameters_per_gpu("llama-2-7b", 8, vocab_divisible_by=128))
    assert padded - int(mp.parameters_per_gpu("llama-2-7b", 8)) == 2 * (4_096 - 4_000) * 4096


def test_layers_per_stage_when_p_does_not_divide_layers():
    # 32 layers on 3 stages: 11, 11, 10 (the first 32 mod 3 = 2 stages take one more).
    assert mp.stage_layers(32, 3, [0, 1, 2]).tolist() == [11, 11, 10]
    for p in range(1, 33):
        assert int(np.sum(mp.stage_layers(32, p, np.arange(p)))) == 32
        assert mp.stage_layers(32, p, np.arange(p)).min() >= 1
    stages = [int(mp.parameters_per_gpu("llama-2-7b", 1, 3, pipeline_stage=r)) for r in range(3)]
    # Summed over stages: the whole model (untied: nothing is copied).
    assert sum(stages) == parameter_count("llama-2-7b")
    assert int(mp.parameters_per_gpu("llama-2-7b", 1, 3)) == max(stages) == stages[0]


CASES = [(name, t, p) for name in ("gpt2", "llama-2-7b", "llama-2-70b", "qwen2.5-7b", "mistral-7b-v0.1")
         for t in (1, 2, 4) for p in (1, 2, 3, 5, 8)
         if get_model(name).heads % t == 0 and get_model(name).kv_heads % t == 0]


@pytest.mark.parametrize("name, t, p", CASES)
def test_the_most_loaded_stage_is_the_first_or_the_last(name, t, p):
    every = [int(mp.parameters_per_gpu(name, t, p, pipeline_stage=r)) for r in range(p)]
    assert int(mp.parameters_per_gpu(name, t, p)) == max(every)
    modules = [int(mp.largest_module_per_gpu(name, t, p, pipeline_stage=r)) for r in range(p)]
    assert int(mp.largest_module_per_gpu(name, t, p)) == max(modules)


def test_vectorised_over_t_and_p_matches_one_at_a_time():
    t = np.array([1, 2, 4, 8])[:, None]
    p = np.array([1, 2, 4, 5, 8, 10])[None, :]
    grid = mp.parameters_per_gpu("llama-2-70b", t, p)
    assert grid.shape == (4, 6) and grid.dtype == np.int64
    for i in range(4):
        for j in range(6):
            assert grid[i, j] == int(mp.parameters_per_gpu("llama-2-70b", int(t[i, 0]), int(p[0, j])))


def test_zero_shards_one_gpus_share_over_data_parallel_replicas():
    state = mp.model_state_per_gpu("llama-2-70b", 8, 4, 2, 3)
    assert int(state.total) == int(model_state(2_172_198_912, 2, 3).total) == 16 * 1_086_099_456
    # Interleaved: 80 layers in 4 x 2 chunks of 10; each GPU holds 20 layers, as 1F1B.
    assert int(mp.parameters_per_gpu("llama-2-70b", 8, 4, schedule="interleaved", chunks=2)) == 2_172_198_912


# --- validity ----------------------------------------------------------------------------------

TINY = TransformerConfig("tiny-odd-ffn", hidden=64, layers=4, heads=4, kv_heads=4, ffn_hidden=150,
                         vocab=100, max_positions=64, tied_embeddings=False, gated_mlp=True)


@pytest.mark.parametrize("model, t, p, options, rule, fragment", [
    ("llama-2-70b", 3, 1, {}, "heads", "tensor_parallel must divide heads: llama-2-70b has heads 64"),
    ("llama-2-70b", 16, 1, {}, "kv_heads", "kv_heads 8; got tensor_parallel 16"),
    (TINY, 4, 1, {}, "ffn_hidden", "ffn_hidden 150"),
    ("llama-2-70b", 16, 1, dict(gpus_per_node=8), "kv_heads", "divide kv_heads"),
    ("llama-2-7b", 16, 1, dict(gpus_per_node=8), "node", "within a node"),
    ("llama-2-70b", 8, 1, dict(seq_len=4100, sequence_parallel=True), "sequence", "seq_len 4100"),
    ("llama-2-70b", 1, 81, {}, "layers", "at most layers .every stage holds a layer.: llama-2-70b has 80 layers"),
    ("llama-2-70b", 1, mp.Pipeline(3, "interleaved", 2), {}, "interleaved_layers",
     "x chunks must divide"),
    ("llama-2-70b", 1, mp.Pipeline(4, "interleaved", 1), {}, "schedule", "chunks >= 2"),
    ("llama-2-70b", 1, mp.Pipeline(4, chunks=2), {}, "schedule", "1f1b has chunks = 1"),
    ("llama-2-70b", 1, mp.Pipeline(4, "interleaved", 2, micro_batches=6), {}, "micro_batches",
     "micro_batches 6"),
    ("llama-2-70b", 8, 2, dict(gpus=24), "gpus", "gpus 24"),
])
def test_each_rule_names_itself(model, t, p, options, rule, fragment):
    rules = mp.parallel_rules(model, t, p, **options)
    assert not rules[rule]
    with pytest.raises(ValueError, match=fragment):
        mp.check_parallel(model, t, p, **options)


def test_rules_are_vectorised_masks():
    t = np.array([1, 2, 3, 4, 8, 16])
    rules = mp.parallel_rules("llama-2-70b", t, 1, gpus_per_node=8)
    ok = np.logical_and.reduce(list(rules.values()))
    assert ok.tolist() == [True, True, False, True, True, False]
    assert rules["heads"].tolist() == [True, True, False, True, True, True]
    assert rules["kv_heads"].tolist() == [True, True, False, True, True, False]
    assert rules["node"].tolist() == [True, True, False, True, True, False]
    with pytest.raises(ValueError, match="tensor_parallel 3"):
        mp.parameters_per_gpu("llama-2-70b", t)


@pytest.mark.parametrize("call, error, fragment", [
    (lambda: mp.parameters_per_gpu("llama-2-7b", 0), ValueError, "tensor_parallel"),
    (lambda: mp.parameters_per_gpu("llama-2-7b", 1.5), ValueError, "tensor_parallel"),
    (lambda: mp.parameters_per_gpu("llama-2-7b", True), TypeError, "tensor_parallel"),
    (lambda: mp.parameters_per_gpu("llama-2-7b", "8"), TypeError, "tensor_parallel"),
    (lambda: mp.parameters_per_gpu("llama-2-7b", 1, 0), ValueError, "pipeline_parallel"),
    (lambda: mp.parameters_per_gpu("llama-2-7b", 1, 2, pipeline_stage=2), ValueError, "pipeline_stage"),
    (lambda: mp.parameters_per_gpu("llama-2-7b", 1, 2, pipeline_stage=-1), ValueError, "pipeline_stage"),
    (lambda: mp.parameters_per_gpu("llama-2-7b", 1, 2, schedule="gpipe"), ValueError, "schedule"),
    (lambda: mp.parameters_per_gpu("llama-2-7b", 1, 2, chunks=0), ValueError, "chunks"),
    (lambda: mp.parameters_per_gpu("llama-2-7b", vocab_divisible_by=0), ValueError, "vocab_divisible_by"),
    (lambda: mp.parameters_per_gpu("llama-9"), ValueError, "model must be one of"),
    (lambda: mp.parameters_per_gpu("llama-2-7b", [1, 2], [1, 2, 4]), ValueError, "broadcast"),
])
def test_bad_input_is_named(call, error, fragment):
    with pytest.raises(error, match=fragment):
        call()
