"""``zerolib models``: the preset list as a table and as JSON."""
import json
import subprocess
import sys

from cli_support import run


def test_json_lists_every_preset_with_exact_counts_and_sources(capsys):
    status, out, err = run(capsys, "models", "--format", "json")
    assert status == 0 and err == ""
    presets = {p["name"]: p for p in json.loads(out)}
    # Published totals (see tests/core/catalogue/test_models.py for where each is published).
    assert presets["llama-2-7b"]["parameters"] == 6_738_415_616
    assert presets["llama-3-70b"]["parameters"] == 70_553_706_496
    assert presets["qwen2.5-7b"]["parameters"] == 7_615_616_512
    # DeepSpeed's largest_layer_params: Llama-3-8B's 128,256 x 4,096 embedding.
    assert presets["llama-3-8b"]["largest_layer"] == 128_256 * 4_096
    assert presets["gpt2"]["tied_embeddings"] is True and presets["gpt2"]["heads"] == 12
    assert all("config.json" in p["source"] for p in presets.values())
    assert len(presets) == 11
    # Mixtral-8x7B: 46,702,792,704 in all (keras-hub), 12,879,925,248 active per token
    # (2 of 8 experts; see tests/core/catalogue/test_models.py for the hand count).
    assert presets["mixtral-8x7b"]["parameters"] == 46_702_792_704
    assert presets["mixtral-8x7b"]["active_parameters"] == 12_879_925_248
    assert (presets["mixtral-8x7b"]["experts"], presets["mixtral-8x7b"]["experts_per_token"]) == (8, 2)
    assert presets["llama-3.1-405b"]["active_parameters"] == presets["llama-3.1-405b"]["parameters"]
    # Every preset states its head width: Gemma-2-9B's 256, others hidden / heads.
    assert presets["gemma-2-9b"]["head_dim"] == 256 and presets["llama-2-7b"]["head_dim"] == 128


def test_table_shows_counts_largest_layer_and_sources(capsys):
    status, out, _ = run(capsys, "models")
    assert status == 0
    header = out.splitlines()[0]
    assert "parameters" in header and "largest layer" in header and "active" in header
    assert "68,976,648,192" in out and "124,439,808" in out
    mixtral = next(line for line in out.splitlines() if line.startswith("mixtral-8x7b"))
    assert "46,702,792,704" in mixtral and "12,879,925,248" in mixtral and "2 of 8" in mixtral
    assert "16/8 x 256" in next(line for line in out.splitlines() if line.startswith("gemma-2-9b"))
    assert "Sources:" in out and "keras-hub" in out


def test_bad_format_is_one_line_exit_2():
    done = subprocess.run([sys.executable, "-m", "zerolib", "models", "--format", "xml"],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
