"""``zerolib figures``: the published figures' data, determinism, --check, and atomic writes.

The expected numbers are the seed's claims, worked out by hand for mixed-precision Adam
(2 + 2 + 12 = 16 bytes per parameter): 7B unpartitioned = 112 GB at any GPU count; at 2 GPUs
stage 1 holds (4 + 6) x 7 = 70 GB, under the A100's 80 GiB = 85,899,345,920 bytes; 70B at
64 GPUs: stage 0 1,120 GB, stage 1 (4 + 12/64) x 70 = 293.125 GB, stage 3 16/64 x 70 = 17.5 GB.
"""
import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from zerolib.chapter import figures
from zerolib.cli import main

REPO = Path(__file__).resolve().parents[2]
A100 = 80 * 2**30
COLUMNS = ["params", "gpus", "stage", "strategy", "parameters", "gradients", "optimizer", "total",
           "cluster_total"]
FILES = sorted([
    "figures/memory-vs-gpu-count.png", "figures/memory-vs-gpu-count.svg",
    "figures/memory-vs-model-size.png", "figures/memory-vs-model-size.svg", "figures/VERSIONS",
    "figures/step-timeline.png", "figures/step-timeline.svg",
    "figures/memory-vs-step-time.png", "figures/memory-vs-step-time.svg",
    "data/memory-vs-gpu-count.csv", "data/memory-vs-model-size.csv", "data/README.md",
    "data/step-timeline.csv", "data/memory-vs-step-time.csv",
    "figures/shards-by-stage.png", "figures/shards-by-stage.svg", "data/shards-by-stage.csv",
    "figures/shards-through-a-step.png", "figures/shards-through-a-step.svg",
    "data/shards-through-a-step.csv",
])


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def rows(path: Path) -> list[dict]:
    with open(path, newline="") as stream:
        reader = csv.DictReader(stream)
        assert reader.fieldnames == COLUMNS
        return [{k: (v if k == "strategy" else int(v)) for k, v in row.items()} for row in reader]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("figures")
    assert main(["figures", "--out", str(out)]) == 0
    return out


# --- what the command writes --------------------------------------------------------------------

def test_writes_exactly_the_figures_their_data_and_the_readme(built):
    assert sorted(tree(built)) == FILES


def test_gpu_count_csv_holds_the_seed_claims(built):
    data = rows(built / "data" / "memory-vs-gpu-count.csv")
    assert len(data) == 64 * 4
    assert {r["params"] for r in data} == {7_000_000_000}
    assert sorted({r["gpus"] for r in data}) == list(range(1, 65))
    baseline = [r for r in data if r["stage"] == 0]
    assert all(r["total"] == 112_000_000_000 for r in baseline)          # flat at 112 GB
    at_two = {r["stage"]: r["total"] for r in data if r["gpus"] == 2}
    assert at_two == {0: 112 * 10**9, 1: 70 * 10**9, 2: 63 * 10**9, 3: 56 * 10**9}
    assert all(at_two[s] < A100 for s in (1, 2, 3)) and at_two[0] > A100
    at_64 = {r["stage"]: r for r in data if r["gpus"] == 64}
    assert at_64[3]["total"] == 1_750_000_000
    # Stage 1 at 64 GPUs: 14 + 14 GB replicated, 84 GB / 64 = 1.3125 GB of optimizer state.
    assert (at_64[1]["parameters"], at_64[1]["gradients"], at_64[1]["optimizer"]) == (
        14 * 10**9, 14 * 10**9, 1_312_500_000)
    for r in data:
        assert r["total"] == r["parameters"] + r["gradients"] + r["optimizer"]
        assert r["cluster_total"] == r["total"] * r["gpus"]


def test_model_size_csv_holds_the_seed_claims(built):
    data = rows(built / "data" / "memory-vs-model-size.csv")
    assert len(data) == 5 * 4
    assert {r["gpus"] for r in data} == {64}
    total = {(r["params"] // 10**9, r["stage"]): r["total"] for r in data}
    assert total[70, 3] == 17_500_000_000
    assert total[70, 0] == 1_120_000_000_000
    assert total[70, 1] == 293_125_000_000                       # "about 293 GB"
    assert total[1, 3] == 250_000_000 and total[1, 0] == 16 * 10**9
    assert all(total[p, 3] < 20 * 10**9 for p in (1, 7, 13, 30, 70))
    assert [p for p in (1, 7, 13, 30, 70) if total[p, 0] <= A100] == [1]   # baseline: only 1B fits
    strategies = {r["stage"]: r["strategy"] for r in data}
    assert strategies == {0: "Plain data parallelism", 1: "ZeRO stage 1 (optimizer)",
                          2: "ZeRO stage 2 (+ gradients)", 3: "ZeRO stage 3 (+ parameters)"}


def test_csv_formatting_is_plain_integers_with_unix_newlines(built):
    text = (built / "data" / "memory-vs-model-size.csv").read_bytes()
    # 70B / 64 = 1,093,750,000 elements per GPU: x 2 bytes, x 2 bytes, x 12 bytes.
    assert b"\r" not in text and text.endswith(b"\n")
    assert text.splitlines()[-1] == (b"70000000000,64,3,ZeRO stage 3 (+ parameters),"
                                     b"2187500000,2187500000,13125000000,17500000000,1120000000000")


def test_readme_describes_every_csv_column_and_lists_the_other_data_files(built):
    readme = (built / "data" / "README.md").read_text()
    for name in ("memory-vs-gpu-count.csv", "memory-vs-model-size.csv"):
        assert f"`{name}`" in readme
    for column in COLUMNS:
        assert f"| `{column}` |" in readme
    assert "bytes" in readme and "10^9" in readme
    assert "85,899,345,920 bytes (80 GiB = 85.9 GB" in readme
    for pattern, doc, _ in figures.OTHER_DATA_FILES:
        assert f"`{pattern}`" in readme and f"({doc})" in readme
    assert "zero_paper_*.csv" in readme and "deepspeed_measured*.csv" in readme
    assert "validation_*.csv" in readme


def test_versions_file_records_the_matplotlib_that_wrote_the_pngs(built):
    import matplotlib
    text = (built / "figures" / "VERSIONS").read_text()
    assert f"matplotlib {matplotlib.__version__}\n" in text


def test_the_svgs_show_the_four_strategies_and_the_device_line(built):
    # Text is drawn as outlines, but matplotlib keeps each text as an XML comment.
    for name in ("memory-vs-gpu-count", "memory-vs-model-size"):
        svg = (built / "figures" / f"{name}.svg").read_text()
        for label in ("Plain data parallelism", "ZeRO stage 1 (optimizer)",
                      "ZeRO stage 2 (+ gradients)", "ZeRO stage 3 (+ parameters)",
                      "A100 80GB capacity: 80 GiB = 85.9 GB"):
            assert label in svg, (name, label)


# --- determinism -------------------------------------------------------------------------------

def test_regenerating_gives_identical_bytes(built, tmp_path):
    assert main(["figures", "--out", str(tmp_path)]) == 0
    assert tree(tmp_path) == tree(built)


def test_committed_csv_svg_and_readme_are_current(built):
    fresh = tree(built)
    for relative in FILES:
        if relative.endswith(".png") or relative == "figures/VERSIONS":
            continue
        committed = REPO / relative
        assert committed.is_file(), f"{relative} is not committed: run `zerolib figures`"
        assert committed.read_bytes() == fresh[relative], f"{relative} is stale: run `zerolib figures`"


def test_committed_pngs_are_current_under_the_recorded_versions(built):
    recorded = (REPO / "figures" / "VERSIONS").read_text()
    if recorded != figures.versions_text():
        pytest.skip("the committed PNGs were written with other software versions "
                    "(figures/VERSIONS); PNG bytes are compared only under the same versions")
    fresh = tree(built)
    for name in ("memory-vs-gpu-count", "memory-vs-model-size"):
        relative = f"figures/{name}.png"
        assert (REPO / relative).read_bytes() == fresh[relative], f"{relative} is stale"


# --- --check -----------------------------------------------------------------------------------

def test_check_passes_on_current_files_and_writes_nothing(built, tmp_path, capsys):
    shutil.copytree(built, tmp_path / "copy")
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in (tmp_path / "copy").rglob("*")
              if p.is_file()}
    assert main(["figures", "--check", "--out", str(tmp_path / "copy")]) == 0
    assert "up to date" in capsys.readouterr().out
    after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in (tmp_path / "copy").rglob("*")
             if p.is_file()}
    assert after == before


def test_check_names_each_altered_or_missing_file(built, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(built, copy)
    csv_path = copy / "data" / "memory-vs-model-size.csv"
    csv_path.write_bytes(csv_path.read_bytes().replace(b"17500000000", b"17500000001"))
    svg_path = copy / "figures" / "memory-vs-gpu-count.svg"
    svg_path.write_bytes(svg_path.read_bytes() + b" ")
    (copy / "figures" / "memory-vs-model-size.png").unlink()
    snapshot = tree(copy)
    assert main(["figures", "--check", "--out", str(copy)]) == 1
    output = capsys.readouterr()
    assert sorted(output.out.splitlines()) == [
        "missing: figures/memory-vs-model-size.png",
        "stale: data/memory-vs-model-size.csv",
        "stale: figures/memory-vs-gpu-count.svg",
    ]
    assert "3 file(s) out of date" in output.err
    assert tree(copy) == snapshot                       # --check wrote nothing


def test_check_compares_pngs_only_under_the_recorded_versions(built, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(built, copy)
    png = copy / "figures" / "memory-vs-gpu-count.png"
    png.write_bytes(png.read_bytes() + b"\0")
    assert main(["figures", "--check", "--out", str(copy)]) == 1
    assert "stale: figures/memory-vs-gpu-count.png" in capsys.readouterr().out
    versions = copy / "figures" / "VERSIONS"
    versions.write_text(versions.read_text().replace("matplotlib ", "matplotlib 0.0-"))
    assert main(["figures", "--check", "--out", str(copy)]) == 0
    out = capsys.readouterr().out
    assert "note: PNG files not compared: written with matplotlib 0.0-" in out


def test_check_of_the_repository_from_a_fresh_process():
    result = subprocess.run([sys.executable, "-m", "zerolib", "figures", "--check"],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr


# --- atomic writes, touching nothing else ------------------------------------------------------

def test_second_run_leaves_unchanged_files_and_other_files_alone(built, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(built, out)
    other = out / "data" / "zero_paper.md"
    other.write_text("not ours\n")
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    assert main(["figures", "--out", str(out)]) == 0
    assert all(line.startswith("unchanged") for line in capsys.readouterr().out.splitlines())
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == stamps
    assert other.read_text() == "not ours\n"


def test_writes_go_through_a_temporary_file_in_the_same_folder(built, tmp_path, monkeypatch):
    out = tmp_path / "out"
    shutil.copytree(built, out)
    target = out / "data" / "memory-vs-gpu-count.csv"
    target.write_bytes(b"old\n")
    replaced = []

    def failing_replace(source, destination):
        replaced.append((Path(source), Path(destination)))
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        figures.write({"data/memory-vs-gpu-count.csv": b"new\n"}, out)
    (source, destination), = replaced
    assert destination == target and source.parent == target.parent and source != target
    assert target.read_bytes() == b"old\n"                  # the old file is intact
    assert sorted(p.name for p in target.parent.iterdir()) == sorted(
        f.removeprefix("data/") for f in FILES if f.startswith("data/"))        # no temp left


def test_written_files_are_world_readable(built):
    for path in built.rglob("*"):
        if path.is_file():
            assert path.stat().st_mode & 0o777 == 0o644, path


# --- variants and bad input ---------------------------------------------------------------------

def test_a_variant_needs_out_and_then_draws_what_was_asked(tmp_path, capsys):
    assert main(["figures", "--params", "13B", "--device", "h100-80gb"]) == 2
    assert "need --out" in capsys.readouterr().err
    out = tmp_path / "variant"
    assert main(["figures", "--out", str(out), "--params", "13B", "--gpus", "1-8,16",
                 "--sizes", "7B,70B", "--sizes-gpus", "8", "--bytes", "2,4,12"]) == 0
    data = rows(out / "data" / "memory-vs-gpu-count.csv")
    assert sorted({r["gpus"] for r in data}) == [1, 2, 3, 4, 5, 6, 7, 8, 16]
    # 13B with 2 + 4 + 12 = 18 bytes per parameter: 234 GB unpartitioned.
    assert {r["total"] for r in data if r["stage"] == 0} == {234 * 10**9}
    sizes = rows(out / "data" / "memory-vs-model-size.csv")
    # 70B on 8 GPUs, stage 3: 70e9 x 18 / 8 = 157.5 GB.
    assert [r["total"] for r in sizes if r["params"] == 70 * 10**9 and r["stage"] == 3] == [
        157_500_000_000]


@pytest.mark.parametrize("arguments, message", [
    (["--gpus", "0-4"], "--gpus"),
    (["--gpus", "8-2"], "--gpus"),
    (["--gpus", "a"], "--gpus"),
    (["--params", "7X"], "--params"),
    (["--sizes", "1B,,7B"], "--sizes"),
    (["--sizes-gpus", "1.5"], "--sizes-gpus"),
    (["--sizes-gpus", "0"], "--sizes-gpus must be a positive whole number"),
    (["--sizes", "0B"], "--sizes must be a positive whole number"),
    (["--bytes", "2,2"], "--bytes"),
])
def test_bad_variant_options_give_one_line_and_exit_2(arguments, message, tmp_path, capsys):
    assert main(["figures", "--out", str(tmp_path), *arguments]) == 2
    error = capsys.readouterr().err
    assert error.startswith("zerolib figures: error:") and message in error
    assert error.count("\n") == 1
    assert not any(tmp_path.iterdir())                        # nothing written


def test_out_must_be_a_folder(tmp_path, capsys):
    file = tmp_path / "a-file"
    file.write_text("not a folder\n")
    assert main(["figures", "--out", str(file)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "--out must be a folder" in error
    assert file.read_text() == "not a folder\n"


def test_unknown_device_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["figures", "--device", "tpu-v9"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_default_out_is_the_repository():
    assert figures.repo_root() == REPO


@pytest.mark.parametrize("changes, error, names", [
    ({"params": [7e9, 13e9]}, ValueError, "params must be one model size"),
    ({"params": 0}, ValueError, "params"),
    ({"gpus": 8}, ValueError, "gpus and model_sizes must be lists"),
    ({"gpus": (0, 1)}, ValueError, "gpus"),
    ({"gpus": tuple(range(1, 4098))}, ValueError, "gpus must hold at most 4096"),
    ({"model_sizes": ("7B",)}, TypeError, "model_sizes"),
    ({"model_gpus": 0}, ValueError, "model_gpus"),
    ({"device": "tpu"}, ValueError, "device"),
    ({"layout": "adam-4bit"}, ValueError, "layout"),
    ({"unit": "MB"}, ValueError, "unit"),
    ({"stages": (4,)}, ValueError, "stages"),
])
def test_figure_options_name_the_bad_argument(changes, error, names):
    with pytest.raises(error, match=names):
        figures.FigureOptions(**changes)
