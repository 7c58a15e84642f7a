"""``zerolib models``: the preset list as a table and as JSON."""
import json
import subprocess
import sys

from zerolib.cli import main


def run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_json_lists_every_preset_with_exact_counts_and_sources(capsys):
    status, out, err = run(capsys, "models", "--format", "json")
    assert status == 0 and err == ""
    presets = {p["name"]: p for p in json.loads(out)}
    # Published totals (see tests/test_models.py for where each is published).
    assert presets["llama-2-7b"]["parameters"] == 6_738_415_616
    assert presets["llama-3-70b"]["parameters"] == 70_553_706_496
    assert presets["qwen2.5-7b"]["parameters"] == 7_615_616_512
    # DeepSpeed's largest_layer_params: Llama-3-8B's 128,256 x 4,096 embedding.
    assert presets["llama-3-8b"]["largest_layer"] == 128_256 * 4_096
    assert presets["gpt2"]["tied_embeddings"] is True and presets["gpt2"]["heads"] == 12
    assert all("config.json" in p["source"] for p in presets.values())
    assert len(presets) == 8


def test_table_shows_counts_largest_layer_and_sources(capsys):
    status, out, _ = run(capsys, "models")
    assert status == 0
    header = out.splitlines()[0]
    assert "parameters" in header and "largest layer" in header
    assert "68,976,648,192" in out and "124,439,808" in out
    assert "Sources:" in out and "keras-hub" in out


def test_bad_format_is_one_line_exit_2():
    done = subprocess.run([sys.executable, "-m", "zerolib", "models", "--format", "xml"],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
