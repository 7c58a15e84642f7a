"""A model of one's own from its config.json: published configs counted exactly, bad input named.

The committed configs (tests/data/*.json, each cited in tests/data/README.md) are counted two
ways: against the count recorded from transformers building the same config on the meta device
(always), and, when transformers is installed, against a fresh meta-device build (no weights, no
network). One count is also re-added by hand below.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import REPO, optional_import

from zerolib.core.catalogue.hf_config import model_from_config
from zerolib.core.catalogue.models import (
    MODELS,
    active_parameter_count,
    largest_layer,
    modules,
    parameter_count,
)

DATA = REPO / "tests" / "data"

# file -> (total parameters, active per token) as transformers 5.24.0 reports them for the
# same config built on the meta device (num_parameters(); see tests/data/README.md), and where a
# total is also published elsewhere.
EXPECTED = {
    "gpt2": (124_439_808, None),                    # keras-hub gpt2_base_en 'params' too
    "tinyllama-1.1b-chat-v1.0": (1_100_048_384, None),
    "llama-3.2-1b": (1_235_814_400, None),
    "llama-3.1-70b": (70_553_706_496, None),         # the llama-3-70b preset's published total
    "mistral-7b-v0.3": (7_248_023_552, None),
    "mixtral-8x7b-v0.1": (46_702_792_704, 12_879_925_248),  # keras-hub mixtral_8x7b_en 'params'
    "qwen2-0.5b": (494_032_768, None),
    "gemma-2b": (2_506_172_416, None),
    "gemma-2-2b": (2_614_341_888, None),
    "phi-3.5-mini-instruct": (3_821_079_552, None),
    "redpajama-incite-3b-v1": (2_775_864_320, None),
    "qwen3-0.6b": (596_049_920, None),
    "gemma-3-1b-it": (999_885_952, None),
    "olmo-2-7b": (7_298_617_344, None),
    # 60 routed experts (4 per token) of 1,408 and a shared expert of 5,632 with its gate: the
    # active count is the 2.7B of the model's name.
    "qwen1.5-moe-a2.7b": (14_315_784_192, 2_689_173_504),
    # MLC LLM's entry leaves out the published "q_lora_rank": null, so transformers (and zerolib)
    # take DeepseekV2Config's default 1536; with the published null see the test below.
    "deepseek-v2-lite": (15_748_993_024, 2_703_659_008),
}

# Shape fields of published configs (model cards of bigscience/bloom-560m and tiiuae/falcon-7b),
# and two small variants of Falcon's other layouts; counts from transformers 5.24.0 on the meta
# device (bloom-560m's and falcon-7b's are also the totals their Hub pages show).
DICTS = {
    "bloom-560m": ({"model_type": "bloom", "n_embed": 1024, "n_layer": 24, "num_attention_heads": 16,
                    "vocab_size": 250880}, 559_214_592),
    "falcon-7b": ({"model_type": "falcon", "hidden_size": 4544, "n_head": 71, "n_layer": 32,
                   "multi_query": True, "parallel_attn": True, "bias": False, "alibi": False,
                   "new_decoder_architecture": False, "vocab_size": 65024}, 6_921_720_704),
    "falcon-new-decoder": ({"model_type": "falcon", "hidden_size": 512, "num_attention_heads": 16,
                            "num_kv_heads": 4, "num_hidden_layers": 3, "new_decoder_architecture": True,
                            "parallel_attn": True, "bias": False, "vocab_size": 1000}, 8_776_704),
    "falcon-rw": ({"model_type": "falcon", "hidden_size": 256, "num_attention_heads": 8,
                   "num_hidden_layers": 2, "multi_query": False, "parallel_attn": False,
                   "alibi": True, "bias": True, "vocab_size": 500}, 1_708_032),
    # DeepSeek-V3's shape fields (its config.json and the DeepSeek-V3 report, arXiv 2412.19437,
    # Sec. 4.2): 61 layers, the first 3 dense, 256 routed experts (8 per token) and 1 shared.
    "deepseek-v3": ({"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61,
                     "num_attention_heads": 128, "num_key_value_heads": 128,
                     "intermediate_size": 18432, "moe_intermediate_size": 2048,
                     "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
                     "first_k_dense_replace": 3, "kv_lora_rank": 512, "q_lora_rank": 1536,
                     "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
                     "vocab_size": 129280, "moe_layer_freq": 1, "n_group": 8, "topk_group": 4,
                     "num_nextn_predict_layers": 1, "max_position_embeddings": 163840,
                     "tie_word_embeddings": False}, 671_026_404_352),
    "qwen3-moe-small": ({"model_type": "qwen3_moe", "hidden_size": 256, "num_attention_heads": 8,
                         "num_key_value_heads": 2, "head_dim": 64, "num_hidden_layers": 2,
                         "intermediate_size": 1024, "moe_intermediate_size": 96, "num_experts": 16,
                         "num_experts_per_tok": 4, "vocab_size": 1000}, 3_536_384),
}


def _path(name: str) -> Path:
    return DATA / f"{name}.json"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_committed_config_counts_exactly(name):
    total, active = EXPECTED[name]
    config = model_from_config(_path(name))
    assert config.name == name
    assert parameter_count(config) == total
    assert active_parameter_count(config) == (total if active is None else active)


@pytest.mark.parametrize("name", sorted(DICTS))
def test_config_dicts_count_exactly(name):
    data, total = DICTS[name]
    assert parameter_count(model_from_config(data)) == total


def test_falcon_7b_by_hand():
    # One LayerNorm per layer (attention and MLP side by side), multi-query fused qkv of
    # 4544 + 2 x 64, no biases, GeLU MLP of 4 x 4544, tied 65024 x 4544 embedding, ALiBi off.
    h, f = 4544, 4 * 4544
    layer = 2 * h + h * (h + 2 * 64) + h * h + 2 * h * f
    config = model_from_config(DICTS["falcon-7b"][0])
    assert config.kv_heads == 1 and config.shared_norm and config.norms_per_layer == 1
    assert parameter_count(config) == 32 * layer + 65024 * h + 2 * h


def test_bloom_has_an_embedding_norm_and_no_position_table():
    config = model_from_config(DICTS["bloom-560m"][0])
    names = [m.name for m in modules(config)]
    assert config.position_embedding == "alibi" and "position_embedding" not in names
    assert names[:2] == ["embedding", "embedding_norm"]


def test_qwen3_norms_queries_and_keys_per_head_olmo2_per_projection():
    qwen3 = {m.name: m.elements for m in modules(model_from_config(_path("qwen3-0.6b")))}
    olmo2 = {m.name: m.elements for m in modules(model_from_config(_path("olmo-2-7b")))}
    assert (qwen3["query_norm"], qwen3["key_norm"]) == (128, 128)
    assert (olmo2["query_norm"], olmo2["key_norm"]) == (4096, 4096)


def test_dense_layers_among_sparse_ones_are_refused(tmp_path):
    data = {**json.loads(_path("qwen1.5-moe-a2.7b").read_text()), "mlp_only_layers": [0]}
    with pytest.raises(ValueError, match="field mlp_only_layers .*zerolib cannot express it"):
        model_from_config(_write(tmp_path, data))


def test_deepseek_v2_lite_as_published_projects_queries_directly():
    # The published config says "q_lora_rank": null: a direct 2048 x 16 x 192 query projection
    # instead of the 1536-wide latent, 42,508,800 fewer parameters (27 layers x (2048 x 1536 +
    # 1536 + 1536 x 3072 - 2048 x 3072)), the 15.7B of the model card.
    data = {**json.loads(_path("deepseek-v2-lite").read_text()),
            "q_lora_rank": None}
    config = model_from_config(data)
    assert parameter_count(config) == 15_748_993_024 - 27 * (2048 * 1536 + 1536 + 1536 * 3072
                                                            - 2048 * 3072) == 15_706_484_224
    names = [m.name for m in modules(config)]
    assert "query_projection" in names and "query_down_projection" not in names


def test_deepseek_v3_by_hand_and_what_it_leaves_out():
    config = model_from_config(DICTS["deepseek-v3"][0])
    h, L, dense, E = 7168, 61, 3, 256
    attention = (h * 1536 + 1536 + 1536 * 128 * 192 + h * (512 + 64) + 512 + 512 * 128 * 256
                 + 128 * 128 * h)
    moe = E * 3 * h * 2048 + h * E + 3 * h * 2048     # routed experts, router, 1 shared expert
    total = L * (attention + 2 * h) + dense * 3 * h * 18432 + (L - dense) * moe + 2 * 129280 * h + h
    assert parameter_count(config) == total
    # 8 of 256 routed experts per token: the report's 37B active (embedding and output included).
    assert active_parameter_count(config) == total - (L - dense) * (E - 8) * 3 * h * 2048
    assert "not built by transformers and not counted: num_nextn_predict_layers 1" in config.source


def test_tinyllama_count_re_added_by_hand():
    # 22 layers of h 2048, 32 heads of 64, 4 key/value heads, SwiGLU 5632, vocab 32000, untied.
    h, f, v, kv = 2048, 5632, 32000, 4 * 64
    layer = h * h + 2 * h * kv + h * h + 3 * h * f + 2 * h
    assert parameter_count(model_from_config(_path("tinyllama-1.1b-chat-v1.0"))) == (
        22 * layer + 2 * v * h + h)


def test_config_matching_a_preset_gives_its_numbers():
    # Mixtral's published config.json reads back as the preset (same shape, same counts).
    config = model_from_config(_path("mixtral-8x7b-v0.1"))
    preset = MODELS["mixtral-8x7b"]
    for field in ("hidden", "layers", "heads", "kv_heads", "ffn_hidden", "vocab", "experts",
                  "experts_per_token", "tied_embeddings", "gated_mlp", "norm", "qkv_bias"):
        assert getattr(config, field) == getattr(preset, field), field
    assert largest_layer(config) == largest_layer(preset)


def test_phi3_fuses_gate_and_up_in_one_module():
    # Phi-3 keeps gate and up in one gate_up_proj of 3072 x (2 x 8192) and q, k, v in one
    # qkv_proj of 3072 x 9216; its largest module stays the 32064 x 3072 embedding.
    config = model_from_config(_path("phi-3.5-mini-instruct"))
    found = {m.name: m.elements for m in modules(config)}
    assert found["mlp_gate_up_projection"] == 3072 * 2 * 8192
    assert found["qkv_projection"] == 3072 * 3 * 3072
    assert "mlp_up_projection" not in found and "mlp_gate_projection" not in found
    assert largest_layer(config) == 32064 * 3072


def test_fields_that_change_no_parameter_are_named():
    config = model_from_config(_path("llama-3.2-1b"))
    assert "fields that change no parameter: rope_scaling" in config.source
    gemma2 = model_from_config(_path("gemma-2-2b"))
    assert "sliding_window" in gemma2.source and "final_logit_softcapping" in gemma2.source


def test_dict_directory_and_cache_snapshot(tmp_path):
    data = json.loads(_path("qwen2-0.5b").read_text())
    expected = EXPECTED["qwen2-0.5b"][0]
    assert parameter_count(model_from_config(data)) == expected
    folder = tmp_path / "my-model"
    folder.mkdir()
    shutil.copy(_path("qwen2-0.5b"), folder / "config.json")
    assert model_from_config(folder).name == "my-model"
    cache = tmp_path / "hub" / "models--Qwen--Qwen2-0.5B"
    snapshot = cache / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    shutil.copy(_path("qwen2-0.5b"), snapshot / "config.json")
    for where in (cache, snapshot, snapshot / "config.json"):
        config = model_from_config(where)
        assert config.name == "Qwen/Qwen2-0.5B" and parameter_count(config) == expected
    # Two snapshots: refs/main says which.
    other = cache / "snapshots" / "def456"
    other.mkdir()
    shutil.copy(_path("gpt2"), other / "config.json")
    with pytest.raises(ValueError, match="2 snapshots"):
        model_from_config(cache)
    (cache / "refs").mkdir()
    (cache / "refs" / "main").write_text("def456\n")
    assert parameter_count(model_from_config(cache)) == EXPECTED["gpt2"][0]


def test_hub_name_found_in_the_local_cache_offline(tmp_path, monkeypatch):
    snapshot = tmp_path / "models--Qwen--Qwen2-0.5B" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    shutil.copy(_path("qwen2-0.5b"), snapshot / "config.json")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.chdir(tmp_path)     # no local Qwen/Qwen2-0.5B folder shadows the name
    config = model_from_config("Qwen/Qwen2-0.5B")
    assert config.name == "Qwen/Qwen2-0.5B" and parameter_count(config) == EXPECTED["qwen2-0.5b"][0]
    with pytest.raises(ValueError, match=r"Qwen/Qwen9: no such file or directory \(nor, as a Hub name, "
                                         r"in the local cache"):
        model_from_config("Qwen/Qwen9")


def _write(tmp_path, data) -> Path:
    path = tmp_path / "config.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


LLAMA = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
         "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
         "vocab_size": 32000}


@pytest.mark.parametrize("change, words", [
    ({"model_type": None}, "missing field model_type"),
    ({"model_type": "bert"}, "field model_type: 'bert' is an encoder"),
    ({"model_type": "t5", "is_encoder_decoder": True}, "field is_encoder_decoder"),
    ({"model_type": "no-such-model"}, "field model_type: 'no-such-model' is not one zerolib reads"),
    ({"hidden_size": None}, "missing field hidden_size"),
    ({"hidden_size": "4096"}, "field hidden_size must be a whole number"),
    ({"num_hidden_layers": 0}, "field num_hidden_layers must be a whole number from 1"),
    ({"hidden_size": 4100}, "field head_dim is missing and hidden size 4100 is not a multiple of "
                            "num_attention_heads (32)"),
    ({"num_key_value_heads": 5}, "field num_key_value_heads (5) must divide num_attention_heads (32)"),
    ({"tie_word_embeddings": "yes"}, "field tie_word_embeddings must be true or false"),
    ({"quantization_config": {"bits": 4}}, "field quantization_config"),
])
def test_bad_configs_name_the_file_and_field(tmp_path, change, words):
    data = {k: v for k, v in {**LLAMA, **change}.items() if v is not None}
    path = _write(tmp_path, data)
    with pytest.raises(ValueError) as error:
        model_from_config(path)
    assert str(error.value).startswith(f"{path}: ")
    assert words in str(error.value)


def test_experts_per_token_above_experts(tmp_path):
    data = {**LLAMA, "model_type": "mixtral", "num_local_experts": 2, "num_experts_per_tok": 3}
    with pytest.raises(ValueError, match=r"field num_experts_per_tok \(3\) must be at most "
                                         r"num_local_experts \(2\)"):
        model_from_config(_write(tmp_path, data))


def test_missing_file_directory_and_malformed_json(tmp_path):
    with pytest.raises(ValueError, match="no such file or directory"):
        model_from_config(tmp_path / "absent.json")
    with pytest.raises(ValueError, match="directory without config.json"):
        model_from_config(tmp_path)
    with pytest.raises(ValueError, match=r"config.json: malformed JSON \(line 1, column 2"):
        model_from_config(_write(tmp_path, "{oops"))
    with pytest.raises(ValueError, match="holds one JSON object, got list"):
        model_from_config(_write(tmp_path, "[1, 2]"))
    with pytest.raises(TypeError, match="config must be a path"):
        model_from_config(42)


def test_gpt2_cross_attention_is_refused(tmp_path):
    data = {**json.loads(_path("gpt2").read_text()), "add_cross_attention": True}
    with pytest.raises(ValueError, match="field add_cross_attention .*cannot express it"):
        model_from_config(_write(tmp_path, data))


def _transformers_count(path: Path) -> tuple[int, int]:
    """(num_parameters(), largest module's own parameters) of transformers' meta-device build."""
    torch = optional_import("torch", "pip install torch==2.13.0")
    transformers = optional_import("transformers", "pip install -e '.[validate]'")
    config = transformers.AutoConfig.for_model(**json.loads(path.read_text()))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return model.num_parameters(), largest


@pytest.mark.torch
@pytest.mark.parametrize("name", sorted(EXPECTED) + sorted(DICTS))
def test_count_matches_transformers_on_the_meta_device(name, tmp_path):
    path = _path(name) if name in EXPECTED else _write(tmp_path, DICTS[name][0])
    total, largest = _transformers_count(path)
    config = model_from_config(path)
    assert parameter_count(config) == total
    if not config.mixture_of_experts:     # transformers 5 fuses a layer's experts in one module
        assert largest_layer(config) == largest
    else:
        assert largest_layer(config, fused_experts=True) == largest
