"""``--config PATH`` on estimate, plan and models: a published config.json read offline."""
import json

import pytest
from cli_support import estimate_json, run
from conftest import REPO, optional_import

DATA = REPO / "tests" / "data"
MIXTRAL = str(DATA / "mixtral-8x7b-v0.1.json")


def test_models_config_prints_architecture_counts_and_largest_module(capsys):
    status, out, err = run(capsys, "models", "--config", MIXTRAL)
    assert status == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("mixtral-8x7b-v0.1: 32 layers, hidden 4,096, 32 heads (8 key/value) of 128")
    assert "2 of 8 experts per token" in lines[0]
    # Mixtral's published total and active count (keras-hub; Mistral AI's 12.9B active).
    assert "parameters: 46,702,792,704" in lines
    assert "active per token: 12,879,925,248" in lines
    # The largest module: the 32,000 x 4,096 embedding (an expert's matrix is 4,096 x 14,336).
    assert "largest module: embedding (131,072,000 parameters)" in lines


def test_models_config_json(capsys):
    status, out, _ = run(capsys, "models", "--config", str(DATA / "phi-3.5-mini-instruct.json"),
                         "--format", "json")
    found = json.loads(out)
    assert status == 0 and found["parameters"] == 3_821_079_552
    assert found["largest_module"] == "embedding" and found["largest_layer"] == 32064 * 3072


def test_estimate_config_equals_the_preset(capsys):
    # The published Mixtral config reads back as the mixtral-8x7b preset: the same bytes.
    common = ("--gpus", "8", "--device", "h100-80gb", "--seq", "4096")
    own = estimate_json(capsys, "--config", MIXTRAL, *common)
    preset = estimate_json(capsys, "--model", "mixtral-8x7b", *common)
    assert own["params"] == preset["params"] == 46_702_792_704
    assert own["stages"] == preset["stages"]


def test_plan_takes_a_config(capsys):
    status, out, err = run(capsys, "plan", "--config", str(DATA / "qwen2-0.5b.json"), "--gpus", "8",
                           "--gpus-per-node", "8", "--device", "h100-80gb", "--seq", "2048",
                           "--global-batch", "64", "--format", "json")
    assert status == 0 and err == ""
    assert json.loads(out)["settings"]["model"] == "qwen2-0.5b"


def test_bad_config_is_one_line_exit_2(capsys, tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama", "hidden_size": 4096}')
    for argv in (("models", "--config", str(bad)),
                 ("estimate", "--config", str(bad), "--gpus", "8"),
                 ("estimate", "--config", str(tmp_path / "nope"), "--gpus", "8"),
                 ("plan", "--config", str(tmp_path), "--gpus", "8", "--gpus-per-node", "8",
                  "--device", "h100-80gb", "--seq", "2048", "--global-batch", "64")):
        status, out, err = run(capsys, *argv)
        assert status == 2 and out == "", argv
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    _, _, err = run(capsys, "models", "--config", str(bad))
    assert f"{bad}: missing field num_attention_heads" in err


def test_config_and_model_are_exclusive(capsys):
    status, _, err = run(capsys, "estimate", "--config", MIXTRAL, "--model", "gpt2", "--gpus", "8")
    assert status == 2 and "not allowed with" in err


GPT3 = ("--num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048 "
        "--max-position-embeddings 2048 --vocab-size 50257")


def test_models_megatron_args(capsys):
    status, out, err = run(capsys, "models", "--megatron-args", GPT3)
    assert status == 0 and err == ""
    # 96 (12h^2 + 13h) + (50,304 + 2,048 + 2) h with h = 12,288 (tests/core/catalogue/test_megatron_args.py).
    assert "parameters: 174,604,836,864" in out.splitlines()


def test_estimate_megatron_args_and_its_errors(capsys):
    own = estimate_json(capsys, "--megatron-args", GPT3, "--gpus", "64")
    assert own["params"] == 174_604_836_864
    status, out, err = run(capsys, "estimate", "--megatron-args", GPT3 + " --num-experts 8", "--gpus", "8")
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "--num-experts" in err


def test_deepseek_is_counted_estimated_and_planned(capsys):
    config = str(DATA / "deepseek-v2-lite.json")
    status, out, _ = run(capsys, "models", "--config", config)
    assert status == 0 and "parameters: 15,748,993,024" in out.splitlines()
    own = estimate_json(capsys, "--config", config, "--gpus", "8", "--stage", "0")
    assert own["stages"][0]["parameters"] == 2 * 15_748_993_024      # 16-bit, whole on each GPU
    # Three pipeline stages of 9 layers: the first holds the embedding and the one dense layer.
    own = estimate_json(capsys, "--config", config, "--gpus", "3", "--stage", "0",
                        "--pipeline-parallel", "3")
    row = own["stages"][0]
    attention = (2048 + 2048 * 1536 + 1536 + 2048 * 576 + 512 + 2048
                 + 1536 * 16 * 192 + 512 * 16 * 256 + 16 * 128 * 2048)
    experts = 2048 * 64 + 64 * 3 * 2048 * 1408 + 3 * 2048 * 2816
    by_stage = {0: 102400 * 2048 + 9 * attention + 3 * 2048 * 10944 + 8 * experts,
                2: 9 * attention + 9 * experts + 2048 + 102400 * 2048}
    assert row["parameters"] == 2 * by_stage[row["pipeline_stage"]]
    status, out, err = run(capsys, "plan", "--config", config, "--gpus", "16", "--gpus-per-node", "8",
                           "--device", "h100-80gb", "--seq", "4096", "--global-batch", "64",
                           "--format", "json")
    assert status == 0 and err == ""
    plan = json.loads(out)
    assert plan["counts"]["fit"] > 0 and plan["settings"]["capacity_factor"] is None   # dropless


@pytest.mark.torch
def test_a_decoder_zerolib_does_not_read_itself_is_built_by_transformers(capsys):
    # OLMoE (model_type olmoe): built on the meta device, transformers' own count to the parameter
    # (tests/crosscheck/test_transformers_model.py holds it), estimated like any model.
    optional_import("transformers", "pip install -e '.[validate]'")
    status, out, err = run(capsys, "models", "--config", str(DATA / "olmoe-1b-7b.json"), "--format", "json")
    assert status == 0 and err == ""
    assert json.loads(out)["parameters"] == 6_919_161_856


def test_hybrids_and_encoders_are_one_line_saying_what_they_are(capsys):
    status, out, err = run(capsys, "estimate", "--config", str(DATA / "jamba-v0.1.json"), "--gpus", "8")
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "'jamba' is a hybrid" in err and "Mamba" in err
