"""``--run FILE`` and ``--save-run FILE``: a run file in, the run an answer was for out, flags
overriding the file's fields; bad files one line and exit 2."""
from __future__ import annotations

import json

from cli_support import estimate_json, run

import zerolib as zl
from zerolib.core.run_file import read_run


def test_save_then_answer_from_the_file(capsys, tmp_path):
    path = tmp_path / "mb2.toml"
    flags = ("--model", "llama-2-13b", "--gpus", "8", "--device", "a100-80gb", "--micro-batch", "2",
             "--recompute", "full")
    direct = estimate_json(capsys, *flags, "--save-run", str(path))
    saved = read_run(path)
    assert (saved.model.name, saved.cluster.gpus, saved.batch.micro_batch,
            saved.trainer.recompute) == ("llama-2-13b", 8, 2, "full")
    assert estimate_json(capsys, "--run", str(path)) == direct
    # the API answers the file alike
    assert zl.estimate(saved).as_dict() == direct


def test_a_flag_beside_the_file_wins(capsys, tmp_path):
    path = tmp_path / "base.toml"
    path.write_text('[model]\npreset = "llama-2-7b"\n[cluster]\ngpus = 8\ndevice = "h100-80gb"\n'
                    '[batch]\nmicro_batch = 1\n')
    one = estimate_json(capsys, "--run", str(path))
    four = estimate_json(capsys, "--run", str(path), "--micro-batch", "4")
    assert four == estimate_json(capsys, "--model", "llama-2-7b", "--gpus", "8", "--device",
                                 "h100-80gb", "--micro-batch", "4")
    assert four["stages"][0]["peak"] > one["stages"][0]["peak"]
    # a model flag replaces the file's model
    assert estimate_json(capsys, "--run", str(path), "--params", "7B")["params"] == 7 * 10**9


def test_a_planner_row_is_a_run_file(capsys, tmp_path):
    path = tmp_path / "best.toml"
    status, out, err = run(capsys, "plan", "--model", "llama-2-7b", "--gpus", "16",
                           "--gpus-per-node", "8", "--device", "h100-80gb", "--seq", "4096",
                           "--global-batch", "64", "--format", "json", "--save-run", str(path))
    assert status == 0, err
    best = json.loads(out)["fits"][0]
    answer = estimate_json(capsys, "--run", str(path))
    (row,) = answer["stages"]
    assert row["stage"] == best["stage"] and row["peak"] == best["peak_bytes"]
    # and the plan reads the file back: the same cluster and batch, the layout searched again
    status, again, err = run(capsys, "plan", "--run", str(path), "--format", "json")
    assert status == 0, err
    assert json.loads(again)["fits"][0] == best


def test_a_bad_file_is_one_line_and_exit_2(capsys, tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[model]\npreset = "llama-2-7b"\n[trainer]\nrecompute = "most"\n')
    status, out, err = run(capsys, "estimate", "--run", str(path))
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and "trainer.recompute must be one of none, selective, full" in err
    status, _, err = run(capsys, "estimate", "--run", str(tmp_path / "missing.toml"))
    assert status == 2 and "is not a file" in err


def test_the_run_file_pages_examples_run_in_order(capsys, tmp_path, monkeypatch):
    # docs/run-file.md's commands, as printed, one after another in a folder of their own
    import re
    import shlex

    from conftest import REPO
    text = (REPO / "docs" / "run-file.md").read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", text, re.S)[1]
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert len(commands) == 4
    monkeypatch.chdir(tmp_path)
    for command in commands:
        words = shlex.split(command)
        assert words[0] == ".venv/bin/zerolib"
        status, out, err = run(capsys, *words[1:])
        assert (status, err) == (0, ""), (command, err)
    assert read_run(tmp_path / "mb2.toml").batch.micro_batch == 2
    assert read_run(tmp_path / "best.toml").batch.global_batch == 512
