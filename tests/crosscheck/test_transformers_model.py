"""Any decoder transformers can build: read from what it builds, exact to the parameter.

The architectures zerolib does not read itself (OLMoE, StarCoder2, Command-R and Aya (cohere),
GLM-4 (glm, glm4), Phi-3.5-MoE, Granite) are built by transformers on the meta device and their
count compared with transformers' own ``num_parameters()`` of the same config, to the parameter
(torch-marked: they skip without transformers, and fail under ZEROLIB_REQUIRE_OPTIONAL=1). The
totals are also held to the rounded totals their authors publish, and one is added by hand. What
cannot be expressed (hybrids, stray parameters, layers that differ) is refused in one line;
the bounds hold before anything is built; without transformers one line names the extra.
"""
from __future__ import annotations

import json

import pytest
from conftest import REPO, optional_import

from zerolib.core.catalogue.hf_config import HYBRIDS, model_from_config
from zerolib.core.catalogue.models import active_parameter_count, modules, parameter_count
from zerolib.crosscheck import transformers_model
from zerolib.crosscheck.transformers_model import (
    MAX_BUILD_EXPERTS,
    MAX_BUILD_LAYERS,
    Built,
    check_build_size,
    config_from_built,
    model_from_any_config,
)

DATA = REPO / "tests" / "data"

# file -> (total, active per token) as transformers 5.24.0 counts the config built on the meta
# device (tests/data/README.md), and the rounded total (and active) its authors publish.
EXPECTED = {
    # OLMoE paper (arXiv 2409.02060), abstract and Table 1: 6.9B total, 1.3B active
    "olmoe-1b-7b": (6_919_161_856, 1_282_017_280),
    "starcoder2-7b": (7_173_923_840, None),      # the StarCoder2 paper's 7B model: 7.17B
    "aya-23-8b": (8_028_033_024, None),          # Aya 23's 8B model
    "command-r-v01": (34_980_831_232, None),     # Command-R: 35B
    "glm-4-9b-chat": (9_399_951_360, None),      # GLM-4-9B: 9.4B
    "glm-4-9b-0414": (9_400_279_040, None),      # the 0414 layout: two norms more per layer
    # Phi-3.5-MoE's model card: 16 experts of 3.8B, 6.6B active, 41.9B in all
    "phi-3.5-moe": (41_872_793_600, 6_640_640_000),
    "granite-defaults": (6_738_415_616, None),   # GraniteConfig's defaults: Llama-2-7B's shape
}
PUBLISHED = {"olmoe-1b-7b": (6.9, 1.3), "starcoder2-7b": (7.2, None), "command-r-v01": (35.0, None),
             "glm-4-9b-chat": (9.4, None), "phi-3.5-moe": (41.9, 6.6)}


def _data(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text())


def _built(name: str) -> Built:
    """What transformers builds of a committed config, built in this process (one import of
    torch for every test; model_from_any_config's own process is tested once below)."""
    optional_import("transformers", "pip install -e '.[validate]'")
    return Built(**transformers_model.summary_of(_data(name)))


@pytest.mark.torch
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_counts_equal_transformers_own(name):
    built = _built(name)
    config = config_from_built(built, name=name)
    total, active = EXPECTED[name]
    assert built.total == total                     # transformers' own count, as recorded
    assert parameter_count(config) == built.total   # zerolib's description, to the parameter
    assert active_parameter_count(config) == (total if active is None else active)


def test_recorded_counts_round_to_the_published_totals():
    for name, (total, active) in PUBLISHED.items():
        assert round(EXPECTED[name][0] / 1e9, 1) == total, name
        if active is not None:
            assert round(EXPECTED[name][1] / 1e9, 1) == active, name


def test_olmoe_by_hand():
    # 16 layers of h 2048, 16 heads (no grouping), q and k norms over the whole projection, a
    # router over 64 experts of gated width 1024, two RMSNorms; untied 50304 x 2048 embeddings.
    h, f, E, V = 2048, 1024, 64, 50304
    layer = 4 * h * h + 2 * h + h * E + E * 3 * h * f + 2 * h
    assert EXPECTED["olmoe-1b-7b"][0] == 16 * layer + 2 * V * h + h
    # 8 of the 64 experts per token
    assert EXPECTED["olmoe-1b-7b"][1] == 16 * (layer - (E - 8) * 3 * h * f) + 2 * V * h + h


@pytest.mark.torch
def test_what_each_architecture_is_read_as():
    olmoe = config_from_built(_built("olmoe-1b-7b"), name="olmoe")
    assert (olmoe.experts, olmoe.experts_per_token, olmoe.ffn_hidden, olmoe.qk_norm) == (64, 8, 1024, "projection")
    starcoder = config_from_built(_built("starcoder2-7b"), name="starcoder2")
    assert (starcoder.norm, starcoder.gated_mlp, starcoder.mlp_bias, starcoder.qkv_bias) == (
        "layernorm", False, True, True)
    assert starcoder.kv_heads == 4 and starcoder.dropout     # its published dropouts of 0.1
    command_r = config_from_built(_built("command-r-v01"), name="command-r")
    assert command_r.shared_norm and command_r.tied_embeddings and command_r.norm == "rmsnorm"
    assert "LayerNorm without a bias counted as its weight" in command_r.source
    glm4 = config_from_built(_built("glm-4-9b-0414"), name="glm4")
    assert glm4.post_norms and glm4.fused_gate_up and glm4.qkv_bias and not glm4.output_bias
    assert glm4.kv_heads == 2 and glm4.head_width == 128
    phimoe = config_from_built(_built("phi-3.5-moe"), name="phimoe")
    assert (phimoe.experts, phimoe.experts_per_token, phimoe.norm) == (16, 2, "layernorm")


@pytest.mark.torch
def test_an_output_projection_bias_and_multipliers():
    optional_import("transformers", "pip install -e '.[validate]'")
    small = {"model_type": "phimoe", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 100, "num_local_experts": 4,
             "lm_head_bias": True, "attention_bias": True}
    built = Built(**transformers_model.summary_of(small))
    config = config_from_built(built, name="phimoe-small")
    assert config.output_projection_bias and config.qkv_bias and config.output_bias
    assert parameter_count(config) == built.total
    assert dict((m.name, m.elements) for m in modules(config))["output_projection"] == 100 * 64 + 100
    granite = {"model_type": "granite", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
               "intermediate_size": 96, "vocab_size": 100, "embedding_multiplier": 12.0, "logits_scaling": 8.0}
    config = config_from_built(Built(**transformers_model.summary_of(granite)), name="granite-small")
    assert "fields that change no parameter: embedding_multiplier, logits_scaling" in config.source


@pytest.mark.torch
@pytest.mark.slow
def test_the_whole_path_in_a_process_of_its_own():
    optional_import("transformers", "pip install -e '.[validate]'")
    config = model_from_any_config(DATA / "olmoe-1b-7b.json")
    assert config.name == "olmoe-1b-7b" and parameter_count(config) == EXPECTED["olmoe-1b-7b"][0]
    assert config.source.startswith("built by transformers ")
    # what zerolib reads itself is read natively, without building anything
    native = model_from_any_config(DATA / "qwen2-0.5b.json")
    assert native == model_from_config(DATA / "qwen2-0.5b.json")


def test_the_native_reader_names_the_extra_for_other_decoders():
    with pytest.raises(ValueError, match=r"'olmoe' is not one zerolib reads natively .*"
                                         r"pip install 'zerolib\[validate\]'"):
        model_from_config(DATA / "olmoe-1b-7b.json")


def test_without_transformers_one_line_names_the_extra(monkeypatch):
    monkeypatch.setattr(transformers_model, "transformers_installed", lambda: False)
    with pytest.raises(ValueError, match=r"olmoe-1b-7b.json: field model_type: 'olmoe' is read by "
                                         r"building it with transformers, which is not installed: "
                                         r"pip install 'zerolib\[validate\]'"):
        model_from_any_config(DATA / "olmoe-1b-7b.json")


@pytest.mark.parametrize("model_type", sorted(HYBRIDS))
def test_hybrids_are_refused_with_what_they_are(model_type):
    with pytest.raises(ValueError, match=f"'{model_type}' is a hybrid, not a transformer of attention "
                                         f"and MLP layers: .*zerolib cannot express it"):
        model_from_any_config({"model_type": model_type})


def test_jamba_says_it_interleaves_mamba_layers():
    with pytest.raises(ValueError, match="Jamba interleaves state-space \\(Mamba\\) layers with attention"):
        model_from_any_config(DATA / "jamba-v0.1.json")


def test_sizes_beyond_any_decoder_are_refused_before_building():
    for data, field in (({"num_hidden_layers": MAX_BUILD_LAYERS + 1}, "num_hidden_layers"),
                        ({"num_local_experts": MAX_BUILD_EXPERTS + 1}, "num_local_experts"),
                        ({"hidden_size": "4096"}, "hidden_size"), ({"vocab_size": True}, "vocab_size")):
        with pytest.raises(ValueError, match=f"here: field {field} must be a whole number"):
            check_build_size(data, "here")
    huge = {"num_hidden_layers": 1024, "hidden_size": 2**20, "intermediate_size": 2**22,
            "num_experts": 4096, "vocab_size": 10}
    with pytest.raises(ValueError, match="here: about .* parameters"):
        check_build_size(huge, "here")
    check_build_size(_data("phi-3.5-moe"), "here")     # a real one passes


def test_the_build_has_a_time_bound(monkeypatch):
    monkeypatch.setattr(transformers_model, "transformers_installed", lambda: True)
    with pytest.raises(ValueError, match=r"time_limit must be seconds"):
        model_from_any_config(DATA / "olmoe-1b-7b.json", time_limit=0)
    import subprocess

    def too_slow(*args, **kwargs):
        raise subprocess.TimeoutExpired(args[0], kwargs["timeout"])

    monkeypatch.setattr(subprocess, "run", too_slow)
    with pytest.raises(ValueError, match=r"olmoe-1b-7b.json: transformers took longer than 0.5 s "
                                         r"to build model_type 'olmoe'"):
        model_from_any_config(DATA / "olmoe-1b-7b.json", time_limit=0.5)


# A small Llama-shaped build written out by hand: what the reader makes of parameters it was
# not built from (no transformers needed).
def _llama_like(extra=(), layers=2, config=None) -> Built:
    h, f, v = 8, 12, 20
    per_layer = [("self_attn.q_proj.weight", (h, h)), ("self_attn.k_proj.weight", (4, h)),
                 ("self_attn.v_proj.weight", (4, h)), ("self_attn.o_proj.weight", (h, h)),
                 ("mlp.gate_proj.weight", (f, h)), ("mlp.up_proj.weight", (f, h)),
                 ("mlp.down_proj.weight", (h, f)), ("input_layernorm.weight", (h,)),
                 ("post_attention_layernorm.weight", (h,))]
    params = [("model.embed_tokens.weight", (v, h))]
    params += [(f"model.layers.{i}.{name}", shape) for i in range(layers) for name, shape in per_layer]
    params += [("model.norm.weight", (h,)), ("lm_head.weight", (v, h)), *extra]
    total = 0
    for _, shape in params:
        n = 1
        for d in shape:
            n *= d
        total += n
    return Built("toy", "ToyForCausalLM", total, tuple(params), ("LlamaRotaryEmbedding",),
                 {"num_attention_heads": 2, "max_position_embeddings": 64} if config is None else config)


def test_a_hand_made_build_reads_as_llama():
    config = config_from_built(_llama_like(), name="toy")
    assert (config.hidden, config.heads, config.kv_heads, config.ffn_hidden, config.vocab) == (8, 2, 1, 12, 20)
    assert config.gated_mlp and not config.tied_embeddings and config.position_embedding == "rotary"
    assert parameter_count(config) == _llama_like().total


def test_what_has_no_place_is_refused_in_one_line():
    cases = {
        "stray": (_llama_like([("model.layers.0.self_attn.sinks", (2,))]), "layer 0: transformers builds "
                  "self_attn.sinks \\(2,\\), which zerolib's description has no place for"),
        "outside": (_llama_like([("model.extra_embedding.weight", (3, 8))]), "model.extra_embedding.weight"),
        "no heads": (_llama_like(config={}), "names no attention heads"),
        "hybrid": (Built("toy", "ToyForCausalLM", 1, (), ("ToyMambaMixer",), {}), "is a hybrid"),
    }
    for what, (built, message) in cases.items():
        with pytest.raises(ValueError, match=message):
            config_from_built(built, name=what, where="toy.json")


def test_layers_that_differ_are_refused():
    built = _llama_like([("model.layers.1.self_attn.q_proj.bias", (8,))])
    with pytest.raises(ValueError, match="layer 1's attention or norms differ from layer 0's"):
        config_from_built(built, name="toy")
