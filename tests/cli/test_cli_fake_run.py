"""``zerolib estimate ... --fake-run``: the fake run's peak beside the formula's, one line where
it cannot run. The fake run itself is held to a hand count in tests/crosscheck; here its answer
is replaced by a known one, so what the command does with it is checked exactly."""
import importlib.util
import json

from cli_support import run
from conftest import optional_import

from zerolib.crosscheck import fake_run
from zerolib.crosscheck.fake_run import FakePeak

BASE = ("estimate", "--model", "llama-3-8b", "--gpus", "8", "--seq", "1024", "--engine",
        "torchtitan", "--stage", "3", "--fake-run")


def test_the_fake_run_is_beside_the_formula(monkeypatch, capsys):
    # The answer is replaced by a known one, but the command still names PyTorch's version.
    optional_import("torch", "pip install -e '.[validate]'")
    optional_import("transformers", "pip install -e '.[validate]'")
    asked = []

    def fake(config, step):
        asked.append(step)
        return FakePeak(peak_bytes=21_000_000_000, state_bytes=16_000_000_000, seconds=3.0)

    monkeypatch.setattr(fake_run, "fake_step_peak", fake)
    status, out, err = run(capsys, *BASE, "--format", "json")
    assert status == 0 and err == ""
    result = json.loads(out)
    (row,) = result["stages"]
    found = result["fake_run"]
    assert (asked[0].ranks, asked[0].seq_len, asked[0].recompute) == (8, 1024, "op-sac")
    assert found["peak_bytes"] == 21_000_000_000 and found["ranks"] == 8
    assert found["formula_bytes"] == row["max_memory_allocated"]
    assert found["ratio"] == round(21_000_000_000 / row["max_memory_allocated"], 4)
    status, out, _ = run(capsys, *BASE)
    assert status == 0 and "Fake run (PyTorch" in out and "21.00 GB allocated on rank 0" in out


def test_without_torch_it_says_which_extra_installs_it(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    status, _, err = run(capsys, *BASE)
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert "pip install 'zerolib[validate]'" in err


def test_model_parallelism_is_refused_in_one_line(capsys):
    status, _, err = run(capsys, *BASE, "--tensor-parallel", "2", "--gpus", "8")
    assert status == 2 and "FSDP2 alone" in err and len(err.strip().splitlines()) == 1
