"""Careless and hostile input, and interrupted writes: each case that once gave a wrong number,
froze an explorer, printed a traceback or left debris, reproduced and held to its fix.

Expected values are whole-number arithmetic done here with Python ints, independently of the
int64 code under test.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerolib import _io
from zerolib.cli import main as cli_main
from zerolib.core.inputs import MAX_BYTES, MAX_GPUS, MAX_PARAMS
from zerolib.core.memory.accounting import Layout, model_state
from zerolib.core.memory.feasibility import fewest_gpus, largest_model, model_state_fits
from zerolib.core.memory.tables import MAX_ROWS, memory_table
from zerolib.core.memory.working_set import MAX_MICRO_BATCH, MAX_SEQ_LEN, WorkingSetSettings, peak
from zerolib.core.parse import parse_count, parse_size, parse_whole

REPO = Path(__file__).resolve().parents[1]
ZEROLIB = Path(sys.executable).parent / "zerolib"
INT64_MAX = 2**63 - 1


def run(*argv: str) -> tuple[int, str, str]:
    """The command line in this process: (exit status, stdout, stderr); a traceback fails the test."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli_main(list(argv))
        except SystemExit as leaving:   # argparse's own usage errors
            status = leaving.code
    return status, out.getvalue(), err.getvalue()


def refused(argv, *phrases: str) -> str:
    status, out, err = run(*argv)
    assert status == 2 and out == "", (argv, status, out, err)
    assert err.count("\n") == 1 and err.startswith("zerolib"), err
    for phrase in phrases:
        assert phrase in err, (phrase, err)
    return err


# --- 1. totals over all GPUs are exact, however large -------------------------------------------

def test_cluster_total_at_the_limits_is_exact_not_wrapped():
    # 10**12 parameters x 16 bytes on 2**20 GPUs: 1.6777216e19 bytes, beyond int64 (9.22e18).
    status, out, _ = run("estimate", "--params", "1T", "--gpus", "1048576", "--stage", "0",
                         "--format", "json")
    assert status == 0
    (row,) = json.loads(out)["stages"]
    assert row["total"] == 10**12 * 16
    assert row["cluster_total"] == 10**12 * 16 * 2**20 == 16_777_216_000_000_000_000
    status, out, _ = run("estimate", "--params", "1T", "--gpus", "1048576", "--stage", "0")
    assert out.strip().split("\n")[-1].split()[-1] == "16,777,216,000.00"   # all GPUs, in GB
    # 70B on 2**24 GPUs, stage 0: 70e9 x 16 x 16,777,216 = 1.8790e22 bytes.
    state = model_state(70 * 10**9, 2**24, 0)
    assert int(state.cluster_total) == 70 * 10**9 * 16 * 2**24
    table = memory_table(70 * 10**9, [1, 2**24], [0])
    assert table["cluster_total"].tolist() == [70 * 10**9 * 16, 70 * 10**9 * 16 * 2**24]
    assert f",{70 * 10**9 * 16 * 2**24}\n" in table.to_csv(index=False)   # exact in the CSV


@settings(max_examples=300, deadline=None)
@given(params=st.integers(1, MAX_PARAMS), gpus=st.integers(1, MAX_GPUS), stage=st.integers(0, 3),
       bits=st.tuples(*[st.integers(0, 8 * 64)] * 3))
def test_per_worker_and_cluster_totals_equal_python_integer_arithmetic(params, gpus, stage, bits):
    layout = Layout.custom(*(b / 8 for b in bits))
    partitioned = {0: (), 1: (2,), 2: (1, 2), 3: (0, 1, 2)}[stage]
    share = -(-params // gpus)
    expected = sum(-(-(share if i in partitioned else params) * b // 8) for i, b in enumerate(bits))
    state = model_state(params, gpus, stage, layout)
    assert int(state.total) == expected
    assert int(state.cluster_total) == expected * gpus


# --- 2. digit groups only where they group thousands --------------------------------------------

@pytest.mark.parametrize("text", ["1,5B", "1,5", ",,7,,B", "1_000_", "7,00,000", "1__000", "_7",
                                  "7,000,000,00", "1,000.5,0"])
def test_separators_outside_thousands_are_refused(text):
    with pytest.raises(ValueError, match="params must be a count like 7B"):
        parse_count(text)


def test_thousands_separators_are_read():
    assert parse_count("7,000,000,000") == parse_count("7_000_000_000") == 7 * 10**9
    assert parse_count("1,500.5K") == 1_500_500
    refused(["estimate", "--params", "1,5B", "--gpus", "8"], "--params", "1,5B")


# --- 3. extra bytes and working-set quantities are bounded and exact ----------------------------

@pytest.mark.parametrize("call", [
    lambda extra: model_state_fits(7e9, 8, 3, extra_bytes=extra),
    lambda extra: fewest_gpus(7e9, 3, extra_bytes=extra),
    lambda extra: largest_model(8, 3, extra_bytes=extra),
])
def test_extra_bytes_near_the_int64_maximum_are_refused_not_wrapped(call):
    with pytest.raises(ValueError, match="extra_bytes must be at most"):
        call(INT64_MAX)
    assert call(MAX_BYTES) in (False, None, 0)   # the largest accepted: nothing fits


@pytest.mark.parametrize("field, value", [("seq_len", MAX_SEQ_LEN + 1), ("micro_batch", MAX_MICRO_BATCH + 1),
                                          ("reserve_bytes", MAX_BYTES + 1), ("reduce_bucket_size", 10**18),
                                          ("mask_bytes", 17), ("seq_len", 10**30)])
def test_every_working_set_quantity_has_an_upper_bound(field, value):
    with pytest.raises(ValueError, match=f"{field} must be at most"):
        WorkingSetSettings(**{field: value})


def test_a_working_set_beyond_the_byte_limit_is_a_value_error():
    # Attention scores without flash: heads x s^2 x b x 2 bytes = 32 x (2**24)**2 x 2**16 x 2 > 2**62.
    settings_ = WorkingSetSettings(seq_len=MAX_SEQ_LEN, micro_batch=MAX_MICRO_BATCH, flash_attention=False)
    with pytest.raises(ValueError, match="activations of llama-2-7b come to more than 4,611,686,018,427,387,904"):
        peak("llama-2-7b", 8, 3, settings_)


def test_seq_on_the_command_line_is_bounded():
    refused(["estimate", "--model", "llama-2-7b", "--gpus", "8", "--seq", "1e30"],
            "--seq must be at most 16,777,216")


def test_sizes_are_parsed_exactly():
    # Every two-decimal size in GB from 0.01 to 49.95: cents x 10**7 bytes, never one byte more.
    wrong = [cents for cents in range(1, 4996)
             if parse_size(f"{cents // 100}.{cents % 100:02d}GB", "--reserve", maximum=MAX_BYTES)
             != cents * 10**7]
    assert wrong == []
    assert parse_size("1.07GB", "--reserve", maximum=MAX_BYTES) == 1_070_000_000
    assert parse_size("0.1KiB", "--reserve", maximum=MAX_BYTES) == 103      # 102.4, rounded up
    with pytest.raises(ValueError, match="--reserve must be at most"):
        parse_size("9999999TiB", "--reserve", maximum=MAX_BYTES)


# --- 4. every public name is the object itself, however it is imported --------------------------

def test_every_public_name_is_the_same_object_in_any_import_order():
    code = (
        "import importlib, zerolib\n"
        "owner = zerolib._OWNER\n"
        "for name in zerolib.__all__:\n"
        "    if name in zerolib._MODULES:\n"
        "        continue\n"
        "    module = importlib.import_module(owner[name])\n"
        "    exec(f'from zerolib import {name} as value', globals())\n"
        "    assert value is getattr(module, name), name\n"
        "    assert getattr(zerolib, name) is value, name\n"
        "from zerolib import estimate\n"
        "assert callable(estimate) and estimate.__module__ == 'zerolib.core.estimate'\n"
    )
    for first in ("", "import zerolib.core.estimate, zerolib.core.memory.tables\n",
                  "from zerolib.core import estimate as m\n"):
        result = subprocess.run([sys.executable, "-c", first + code], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr


# --- 5. explorers accept any value a control can hold -------------------------------------------

def test_widths_typed_off_the_slider_steps_are_rounded_to_whole_bits():
    from zerolib.chapter.explorers import GpuCountExplorer
    explorer = GpuCountExplorer()
    image = bytes(explorer.image.value)
    explorer.controls["optimizer_bytes"].value = 0.3        # ipywidgets clamps, does not round
    assert explorer.layout.widths() == (2.0, 2.0, 0.25)      # 0.3 bytes -> 2 bits
    assert explorer.status.value == "" and bytes(explorer.image.value) != image
    explorer.controls["gradients_bytes"].value = 2.05
    assert explorer.layout.widths() == (2.0, 2.0, 0.25)      # 2.05 -> 16.4 bits -> 16 bits
    explorer.controls["params"].value = 13 * 10**9            # every later change still draws
    assert explorer.status.value == "" and "13B parameters" in explorer.summary.value


# --- 6. bounded sizes, ranges described without being built -------------------------------------

def test_huge_tables_are_refused_at_once():
    start = time.perf_counter()
    with pytest.raises(ValueError, match=f"at most {MAX_ROWS:,} rows"):
        memory_table(7e9, np.arange(1, 2**24 + 1))
    assert time.perf_counter() - start < 5


def test_two_far_apart_gpu_counts_do_not_build_a_range(tmp_path):
    start = time.perf_counter()
    status, out, err = run("figures", "--out", str(tmp_path), "--gpus", "1,16777216")
    assert status == 0, err
    assert time.perf_counter() - start < 30
    assert (tmp_path / "data" / "memory-vs-gpu-count.csv").read_text().count("\n") == 1 + 2 * 4
    refused(["figures", "--out", str(tmp_path), "--gpus", "1-16777216"], "at most 4096 GPU counts")


# --- 7. file-system errors: one line, the path, status 2 ----------------------------------------

def test_file_system_errors_are_one_line_naming_the_path(tmp_path):
    a_file = tmp_path / "plain"
    a_file.write_text("x")
    refused(["figures", "--out", str(a_file / "sub")], str(a_file))
    occupied = tmp_path / "occupied"
    (occupied / "figures" / "memory-vs-gpu-count.svg").mkdir(parents=True)   # a folder where a file goes
    refused(["figures", "--out", str(occupied)], "memory-vs-gpu-count.svg")
    refused(["html", "--out", "/proc/zerolib-cannot-write-here"], "/proc/zerolib-cannot-write-here")
    refused(["figures", "--out", str(a_file)], "must be a folder")


# --- 8. interrupted writes leave nothing that goes unnoticed -------------------------------------

def test_leftover_temporaries_are_reported_by_check_and_removed_by_the_next_write(tmp_path):
    assert run("figures", "--out", str(tmp_path))[0] == 0
    leftover = tmp_path / "figures" / ".memory-vs-gpu-count.png.k1ll3d.zerolib-tmp"
    leftover.write_bytes(b"half a PNG")
    status, out, _ = run("figures", "--check", "--out", str(tmp_path))
    assert status == 1 and "left over from an interrupted write: figures/" in out
    assert run("figures", "--out", str(tmp_path))[0] == 0
    assert not leftover.exists()
    assert run("figures", "--check", "--out", str(tmp_path))[0] == 0


def test_git_ignores_the_temporaries():
    result = subprocess.run(["git", "check-ignore", "-q", "figures/.x.png.abc.zerolib-tmp"], cwd=REPO)
    assert result.returncode == 0


def test_a_set_of_files_is_written_all_or_nothing(tmp_path):
    _io.write_files({"a.txt": "old a", "b.txt": "old b"}, tmp_path)
    (tmp_path / "c.txt").mkdir()                       # the third file cannot be written
    with pytest.raises(OSError):
        _io.write_files({"a.txt": "new a", "b.txt": "new b", "c.txt": "new c"}, tmp_path)
    assert (tmp_path / "a.txt").read_text() == "old a" and (tmp_path / "b.txt").read_text() == "old b"
    assert _io.stale_temporaries(tmp_path) == []


def test_atomic_write_keeps_the_mode_and_leaves_nothing_behind(tmp_path):
    target = tmp_path / "page.html"
    target.write_text("old")
    os.chmod(target, 0o640)
    _io.atomic_write(target, "new")
    assert target.read_text() == "new" and (target.stat().st_mode & 0o777) == 0o640
    _io.atomic_write(tmp_path / "fresh.csv", b"1,2\n")
    assert ((tmp_path / "fresh.csv").stat().st_mode & 0o777) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh.csv", "page.html"]


# --- 9. messages that help ----------------------------------------------------------------------

def test_empty_model_names_the_presets():
    refused(["estimate", "--model", "", "--gpus", "8"], "model must be one of gpt2,", "got ''")


@pytest.mark.parametrize("argv, phrase", [
    (["estimate", "--params", "-inf", "--gpus", "8"], "--params must be"),
    (["estimate", "--params", "7B", "--gpus", "-8"], "--gpus must be a positive whole number"),
    (["estimate", "--params", "7B", "--gpus", "8", "--bytes", "-1,2,3"], "--bytes"),
])
def test_negative_looking_values_are_read_as_values(argv, phrase):
    err = refused(argv, phrase)
    assert "expected one argument" not in err


def test_long_inputs_name_the_flag_and_are_cut_short():
    err = refused(["estimate", "--params", "9" * 5000, "--gpus", "8"], "--params")
    assert "digits" not in err.lower() or "at most 100 characters" in err
    err = refused(["estimate", "--params", "x" * 100_000, "--gpus", "8"], "--params")
    assert len(err) < 300
    err = refused(["estimate", "--params", "7B", "--gpus", "8", "--layout", "y" * 100_000])
    assert len(err) < 800


def test_empty_values_are_refused_not_defaulted(tmp_path):
    refused(["estimate", "--params", "7B", "--gpus", "8", "--bytes", ""], "--bytes must be three numbers")
    refused(["figures", "--out", ""], "--out must name a folder")
    refused(["html", "--out", " "], "--out must name a folder")


@pytest.mark.parametrize("argv", [["estimate", "--params", "7B", "--gpus", "٨"],
                                  ["estimate", "--params", "٧B", "--gpus", "8"],
                                  ["estimate", "--params", "7B", "--gpus", "8", "--bytes", "٢,2,12"],
                                  ["estimate", "--model", "llama-2-7b", "--gpus", "8", "--seq", "٤٠٩٦"]])
def test_one_rule_for_non_ascii_digits_everywhere(argv):
    refused(argv)
    with pytest.raises(ValueError):
        parse_whole("٨", "--gpus", maximum=MAX_GPUS)


# --- the command line never shows a traceback ---------------------------------------------------

TOKENS = st.sampled_from(["--params", "--gpus", "--stage", "--bytes", "--layout", "--device", "--unit",
                          "--format", "--model", "--seq", "--micro-batch", "--recompute", "--reserve",
                          "--tensor-parallel", "--flash", "--no-flash", "--sequence-parallel", "--help"])
VALUES = st.one_of(st.sampled_from(["7B", "1.5T", "8", "0", "-1", "1e30", "nan", "inf", "", " ", "2,2,12",
                                    "mixed-adam", "a100-80gb", "json", "csv", "GiB", "llama-2-7b",
                                    "gpt2", "full", "2GiB", "3", "1,5B", "٨"]),
                   st.text(max_size=12))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(TOKENS, VALUES), max_size=10))
def test_fuzzed_estimate_arguments_exit_0_with_output_or_2_with_one_line(argv):
    status, out, err = run("estimate", *argv)
    if "--help" in argv and status == 0:
        return
    assert status in (0, 2), (argv, status, err)
    if status == 0:
        assert out.strip() and err == ""
    else:
        assert out == "" and err.count("\n") == 1 and "Traceback" not in err, (argv, err)


def test_the_installed_command_agrees_with_the_in_process_one():
    result = subprocess.run([str(ZEROLIB), "estimate", "--params", "-inf", "--gpus", "8"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stdout == "" and result.stderr.count("\n") == 1


# --- 10. the browser tests keep the server's token off the command line -------------------------

def test_the_jupyterlab_token_is_not_on_the_command_line(tmp_path):
    from browser_support import lab_command, write_server_token
    command = lab_command(8888, tmp_path)
    path = write_server_token(tmp_path / "config", "s3cr3t")
    assert not any("s3cr3t" in part or "IdentityProvider" in part for part in command)
    assert json.loads(path.read_text()) == {"IdentityProvider": {"token": "s3cr3t"}}
    assert path.stat().st_mode & 0o777 == 0o600


# --- 11. every reader of user input is bounded: size, depth, values, time -----------------------
# config.json files, the page's uploads and share links, Megatron-LM arguments: a hostile input
# is a ValueError or TypeError of one line (the CLI: exit 2 and that line), never a traceback, a
# RecursionError, a hang on a pipe or seconds of work.

# CPU seconds: far above any refusal here (tens of milliseconds), far below seconds of work. (Wall
# time on a shared machine stalls for reasons of its own; WAIT_SECONDS catches a wait.)
READ_SECONDS = 2.0
WAIT_SECONDS = 30.0


def _bounded(fn, *args):
    """fn(*args), or the ValueError/TypeError it raised; anything else, a line break in the
    message, READ_SECONDS of work or WAIT_SECONDS of waiting fails the test."""
    for _ in range(2):   # a reader over the bound twice is slow; once, the machine stalled
        start, start_cpu = time.perf_counter(), time.process_time()
        try:
            result = fn(*args)
        except (ValueError, TypeError) as error:
            assert "\n" not in str(error) and str(error), repr(error)
            result = error
        worked, took = time.process_time() - start_cpu, time.perf_counter() - start
        if worked < READ_SECONDS and took < WAIT_SECONDS:
            return result
    raise AssertionError((worked, took, fn, str(args)[:200]))


def _nested(depth: int, key: str = "rope_scaling") -> str:
    return f'{{"model_type": "llama", "{key}": ' + "[" * depth + "]" * depth + "}"


MISTRAL = json.loads((REPO / "tests" / "data" / "mistral-7b-v0.3.json").read_text())
JSON_LEAVES = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
               | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12))
JSON_VALUES = st.recursive(JSON_LEAVES, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)
FIELDS_READ = sorted({"model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                      "num_key_value_heads", "intermediate_size", "vocab_size", "head_dim",
                      "max_position_embeddings", "tie_word_embeddings", "is_encoder_decoder",
                      "_name_or_path", "attention_bias", "mlp_bias", "attention_dropout",
                      "num_local_experts", "num_experts_per_tok", "quantization_config",
                      "rope_scaling", "n_embd", "n_layer", "n_head", "add_cross_attention"})
HOSTILE_VALUES = JSON_VALUES | st.sampled_from([
    0, -1, 2**24 + 1, 10**400, 4096.0, "4096", "true", [4096], {"v": 4096}, None, True, ""])
# A real config with one field made hostile, or fields drawn at random around a model type.
MUTATED = st.builds(lambda key, value: {**MISTRAL, key: value}, st.sampled_from(FIELDS_READ),
                    HOSTILE_VALUES)
DRAWN = st.dictionaries(st.sampled_from(FIELDS_READ), HOSTILE_VALUES, max_size=8).map(
    lambda d: {"model_type": "llama", **d})
HOSTILE_TEXTS = st.one_of(
    st.builds(json.dumps, MUTATED), st.builds(json.dumps, DRAWN), st.text(max_size=60),
    st.builds(_nested, st.integers(0, 200_000)),
    st.builds(lambda n: '{"model_type": "llama", "hidden_size": ' + "9" * n + "}",
              st.integers(1, 50_000)),
    st.builds(lambda n: '{"model_type": "llama", "x": "' + "\\u0041" * n, st.integers(1, 100_000)),
    st.builds(lambda n: "{" + ",".join(f'"k{i}": {i}' for i in range(n)) + "}",
              st.integers(9_990, 10_010)),
    st.sampled_from(["NaN", '{"model_type": "llama", "hidden_size": NaN}', "[" * 33 + "]" * 33,
                     '{"model_type": "llama", "hidden_size": Infinity}', "", "{", "\ufeff{}",
                     '{"model_type": ["llama"]}', '{"model_type": {"a": 1}}', "null", "[]"]))


def _every_config_reader(text: str, tmp_path: Path):
    from zerolib.app.answers import read_model
    from zerolib.app.page import read_upload
    from zerolib.app.settings import Settings, from_query, pack_config
    from zerolib.core.catalogue.hf_config import config_from_text, model_from_config
    file = tmp_path / "config.json"
    file.write_text(text, encoding="utf-8")
    upload = ({"name": "upload.json", "content": memoryview(text.encode("utf-8"))},)
    results = [_bounded(config_from_text, text, "config.json"), _bounded(model_from_config, file),
               _bounded(read_upload, upload), _bounded(read_model, Settings(config=text))]
    settings, problems = _bounded(from_query, f"config={pack_config(text)}&gpus=8")
    assert settings.gpus == 8 and all("\n" not in p for p in problems)
    return results


@settings(max_examples=150, deadline=None)
@given(text=HOSTILE_TEXTS)
def test_hostile_json_gets_a_clean_refusal_or_a_right_answer_from_every_reader(text, tmp_path_factory):
    from zerolib.core.catalogue.models import TransformerConfig, parameter_count
    tmp = tmp_path_factory.mktemp("hostile")
    parsed, model, uploaded, answered = _every_config_reader(text, tmp)
    # An answer from one reader is the answer of all (an empty config on the page is the preset).
    answers = [isinstance(r, TransformerConfig) for r in (model, answered if text else model)]
    assert answers in ([True, True], [False, False]), (model, answered)
    assert isinstance(uploaded, tuple) == answers[0], (uploaded, model)
    if answers[0]:
        assert parameter_count(model) == parameter_count(answered)
        assert isinstance(parsed, dict)


@pytest.mark.parametrize("text, says", [
    (_nested(100_000), "field rope_scaling nests more than 32 levels deep"),
    ("[" * 100_000 + "]" * 100_000, "the text nests more than 32 levels deep"),
    ('{"model_type": ["llama"]}', "field model_type must be a string"),
    ('{"model_type": {"a": 1}}', "field model_type must be a string"),
    ('{"model_type": "t5", "is_encoder_decoder": "true"}', "field is_encoder_decoder must be true or false"),
    ('{"model_type": "llama", "hidden_size": NaN}', "NaN is not a JSON number"),
    ("{" + ",".join(f'"k{i}": {i}' for i in range(10_001)) + "}", "more than 10,000 values"),
])
def test_each_hostile_config_is_one_line_naming_the_file_and_the_field(text, says, tmp_path):
    parsed, *read = _every_config_reader(text, tmp_path)
    assert isinstance(parsed, dict) or says in str(parsed)    # JSON well-formed, model refused
    for result in read:
        assert isinstance(result, ValueError) and says in str(result), (says, result)
    file = tmp_path / "config.json"
    err = refused(["estimate", "--config", str(file), "--gpus", "8"], says)
    assert err.startswith(f"zerolib estimate: error: {file}: ")
    refused(["models", "--config", str(file)], says)


def test_a_huge_config_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "config.json"
    with open(big, "wb") as handle:            # 200 MB without writing them: a sparse file
        handle.truncate(200_000_000)
    start, start_cpu = time.perf_counter(), time.process_time()
    refused(["estimate", "--config", str(big), "--gpus", "8"], "200,000,000 bytes",
            "read up to 1,000,000 bytes")
    refused(["estimate", "--megatron-args", str(big), "--gpus", "8"], "200,000,000 bytes")
    assert time.process_time() - start_cpu < READ_SECONDS and time.perf_counter() - start < WAIT_SECONDS


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "folder"])
def test_a_pipe_or_a_device_is_not_read_nor_called_a_folder(kind, tmp_path):
    if kind == "fifo":
        path = tmp_path / "config.json"
        os.mkfifo(path)                  # a reader that opened it blocking would wait forever
        says = "a named pipe (FIFO), not a regular file"
    elif kind == "folder":
        path = tmp_path
        says = "directory without config.json"
    else:
        path, says = Path(kind), "a character device, not a regular file"
    start, start_cpu = time.perf_counter(), time.process_time()
    refused(["estimate", "--config", str(path), "--gpus", "8"], f"{path}: {says}")
    if kind != "folder":
        refused(["estimate", "--megatron-args", str(path), "--gpus", "8"], f"{path}: {says}")
    assert time.process_time() - start_cpu < READ_SECONDS and time.perf_counter() - start < WAIT_SECONDS


def test_a_share_link_unpacks_at_most_a_config_json():
    import zlib

    from zerolib.app.settings import from_query, pack_config, unpack_config
    bomb = pack_config(" " * 50_000_000)       # 50 MB of JSON whitespace
    assert len(bomb) < 70_000
    start, start_cpu = time.perf_counter(), time.process_time()
    with pytest.raises(ValueError, match="config in the address unpacks to more than 1,000,000"):
        unpack_config(bomb)
    settings_, problems = from_query(f"config={bomb}&gpus=16")
    assert time.process_time() - start_cpu < READ_SECONDS and time.perf_counter() - start < WAIT_SECONDS
    assert settings_.config == "" and settings_.gpus == 16 and len(problems) == 1
    truncated = pack_config('{"model_type": "llama"}')[:-4]
    with pytest.raises(ValueError, match="is not a packed config.json"):
        unpack_config(truncated)
    assert zlib.decompress(__import__("base64").urlsafe_b64decode(bomb + "=" * (-len(bomb) % 4)))[:1] == b" "


def test_a_query_of_many_fields_is_one_line():
    from zerolib.app.settings import DEFAULTS, MAX_QUERY_FIELDS, from_query
    assert from_query("&".join(f"x{i}=1" for i in range(MAX_QUERY_FIELDS + 1)))[0] == DEFAULTS
    settings_, problems = from_query("&".join(f"x{i}=1" for i in range(40)) + "&gpus=8")
    assert settings_.gpus == 8 and len(problems) == 1 and "(and 37 more)" in problems[0]
    assert from_query("gpus=8&config_name=" + "n" * 101)[1][0].startswith("config_name must be")


MEGATRON_FLAGS = st.sampled_from(["--num-layers", "--hidden-size", "--num-attention-heads",
                                  "--max-position-embeddings", "--vocab-size", "--ffn-hidden-size",
                                  "--num-query-groups", "--group-query-attention", "--swiglu",
                                  "--position-embedding-type", "--use-rotary-position-embeddings",
                                  "--no-position-embedding", "--kv-channels", "--normalization",
                                  "--tensor-model-parallel-size", "--batch-size", "--lr", "--bf16"])
MEGATRON_VALUES = st.one_of(
    st.sampled_from(["32", "4096", "0", "-1", "٣٢", "3_2", "1e3", "9" * 40, "rope", "learned_absolute",
                     "RMSNorm", "'", '"', "\\", "#", "\n", "$X", "=", "--", ""]),
    st.integers(1, 2**30).map(str), st.text(max_size=10))
GPT_SMALL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
             "--max-position-embeddings", "32", "--vocab-size", "100"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(MEGATRON_FLAGS, MEGATRON_VALUES), max_size=12), st.booleans())
def test_hostile_megatron_arguments_get_a_clean_refusal_or_a_model(words, complete):
    from zerolib.core.catalogue.megatron_args import model_from_megatron_args
    argv = (GPT_SMALL if complete else []) + words
    as_list = _bounded(model_from_megatron_args, argv)
    text = " ".join(argv)
    if text.lstrip().startswith("-"):           # as one string: shell quoting may now apply
        _bounded(model_from_megatron_args, text)
    if not isinstance(as_list, Exception):
        assert as_list.layers >= 1


@pytest.mark.parametrize("source", [
    "--num-layers " + "7" * 99_990,                        # one long word: shlex's slow case
    "--lr 1 " * 20_000,                                    # more words than a launch script
    " ".join(["--bf16"] * 5_000),
])
def test_long_megatron_arguments_are_refused_quickly(source):
    from zerolib.core.catalogue.megatron_args import model_from_megatron_args
    assert isinstance(_bounded(model_from_megatron_args, source), ValueError)


LAUNCH_FLAGS = st.sampled_from(["--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                                 "--context-parallel-size", "--expert-model-parallel-size",
                                 "--sequence-parallel", "--num-virtual-stages-per-pipeline-rank",
                                 "--num-layers-per-virtual-pipeline-stage", "--micro-batch-size",
                                 "--global-batch-size", "--seq-length", "--recompute-granularity",
                                 "--recompute-method", "--recompute-num-layers", "--recompute-activations",
                                 "--use-distributed-optimizer", "--bf16", "--fp16", "--fp8-format",
                                 "--hidden-dropout", "--attention-dropout",
                                 "--decoder-first-pipeline-num-layers", "--sequence_parallel=1"])
LAUNCH_VALUES = st.one_of(MEGATRON_VALUES, st.sampled_from(
    ["full", "selective", "uniform", "block", "hybrid", "0.1", "nan", "inf", "-0.0", "1e-400", "2"]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(LAUNCH_FLAGS, LAUNCH_VALUES), max_size=12), st.sampled_from([None, 1, 8, 64]))
def test_hostile_launch_lines_get_a_clean_refusal_or_a_run(words, gpus):
    from zerolib.core.megatron_launch import run_from_megatron_args
    from zerolib.core.run import Run
    result = _bounded(lambda: run_from_megatron_args(GPT_SMALL + words, gpus=gpus))
    assert isinstance(result, (Run, ValueError, TypeError))
    if isinstance(result, Run):   # a run it answers for: the fields were checked once, when made
        assert result.model.layers == 2 and result.trainer.engine == "megatron"


DS_KEYS = st.sampled_from(["stage", "reduce_bucket_size", "allgather_bucket_size", "overlap_comm",
                           "contiguous_gradients", "stage3_prefetch_bucket_size", "offload_optimizer",
                           "stage3_max_live_parameters", "stage3_param_persistence_threshold",
                           "offload_param", "zero_hpz_partition_size", "zero_quantized_weights",
                           "mics_shard_size", "cpu_offload", "nonsense"])
DS_VALUES = HOSTILE_VALUES | st.sampled_from(["auto", 3, 2, 1e9, 5e8 + 0.5, {"device": "cpu"},
                                              {"device": "nvme", "ratio": 0.5}, -1])
DS_CONFIGS = st.fixed_dictionaries({}, optional={
    "zero_optimization": st.dictionaries(DS_KEYS, DS_VALUES, max_size=5) | HOSTILE_VALUES,
    "bf16": st.fixed_dictionaries({"enabled": DS_VALUES}) | HOSTILE_VALUES,
    "fp16": st.fixed_dictionaries({"enabled": DS_VALUES}),
    "train_micro_batch_size_per_gpu": DS_VALUES, "gradient_accumulation_steps": DS_VALUES,
    "train_batch_size": DS_VALUES,
    "activation_checkpointing": st.dictionaries(st.sampled_from(
        ["partition_activations", "cpu_checkpointing", "profile", "x"]), DS_VALUES, max_size=3)})


@settings(max_examples=300, deadline=None)
@given(DS_CONFIGS, st.sampled_from([None, 1, 8, 48]))
def test_hostile_deepspeed_configs_get_a_clean_refusal_or_a_run(config, gpus):
    from zerolib.core.deepspeed_config import run_from_deepspeed_config
    from zerolib.core.run import Run
    result = _bounded(lambda: run_from_deepspeed_config(config, "llama-2-7b", gpus=gpus))
    assert isinstance(result, (Run, ValueError, TypeError))
    if isinstance(result, Run):
        assert result.trainer.engine == "deepspeed"


@pytest.mark.parametrize("config", [
    {"zero_optimization": {"stage": 1, "a\nb": 1}},
    {"zero_optimization": {"offload_optimizer": {"device": "cpu", "x\ny": 1}}},
    {"activation_checkpointing": {"\n": True}},
])
def test_a_deepspeed_key_with_a_line_break_is_refused_on_one_line(config):
    from zerolib.core.deepspeed_config import run_from_deepspeed_config
    with pytest.raises(ValueError) as refused:
        run_from_deepspeed_config(config, "llama-2-7b", gpus=8)
    assert "\n" not in str(refused.value) and "\\n" in str(refused.value)


@settings(max_examples=100, deadline=None)
@given(text=HOSTILE_TEXTS)
def test_hostile_json_is_a_clean_refusal_from_the_deepspeed_reader(text, tmp_path_factory):
    from zerolib.core.deepspeed_config import run_from_deepspeed_config
    path = tmp_path_factory.mktemp("ds") / "ds_config.json"
    path.write_text(text, encoding="utf-8")
    result = _bounded(run_from_deepspeed_config, path, "llama-2-7b")
    if isinstance(result, Exception):
        assert str(result).startswith(str(path)), result


# --- 12. smaller holes, each refused where it came in ------------------------------------------

def test_with_link_a_node_size_that_does_not_tile_the_gpus_is_refused():
    # 12 GPUs on nodes of 8: one and a half nodes, as plan and the placement flags refuse.
    refused(["estimate", "--params", "7B", "--gpus", "12", "--link", "dgx-h100",
             "--gpus-per-node", "8", "--device", "h100-80gb"],
            "gpus (12) must fill whole nodes of gpus_per_node (8)")
    refused(["estimate", "--model", "llama-2-7b", "--gpus", "12", "--link", "dgx-h100",
             "--gpus-per-node", "8", "--device", "h100-80gb", "--tensor-parallel", "2"],
            "must fill whole nodes")
    assert run("estimate", "--params", "7B", "--gpus", "16", "--link", "dgx-h100",
               "--gpus-per-node", "8", "--device", "h100-80gb")[0] == 0
    assert run("estimate", "--params", "7B", "--gpus", "4", "--link", "dgx-h100",
               "--gpus-per-node", "8", "--device", "h100-80gb")[0] == 0   # part of one node


def test_a_config_larger_than_params_accepts_is_refused_like_params(tmp_path):
    # 2**24 layers of h = 2**15 (a dense MLP of 4h): 12 h^2 per layer alone is 2.1e17 parameters,
    # above the 10**15 that --params and the page accept.
    config = {"model_type": "gpt2", "n_embd": 2**15, "n_layer": 2**24, "n_head": 2**5,
              "vocab_size": 50257, "n_positions": 1024}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    refused(["estimate", "--config", str(path), "--gpus", "8"],
            "zerolib sizes models of at most 1,000,000,000,000,000")
    refused(["estimate", "--params", "2e17", "--gpus", "8"], "--params must be at most")


@pytest.mark.parametrize("sent", [-1, -1e9, float("nan"), float("inf"), [1, -1]])
def test_collective_seconds_refuses_negative_bytes(sent):
    from zerolib.core.catalogue.nodes import interconnect
    from zerolib.core.step.collectives import collective_seconds
    with pytest.raises(ValueError, match="sent_bytes must be bytes from 0"):
        collective_seconds("all_gather", sent, 1, 8, interconnect("dgx-h100"))
    with pytest.raises(ValueError, match="calls must be"):
        collective_seconds("all_gather", 8, -1, 8, interconnect("dgx-h100"))


@pytest.mark.parametrize("stages", [(True,), (0, False), [True, 2]])
def test_plan_refuses_booleans_for_stages(stages):
    from zerolib.core.planner import plan
    with pytest.raises(TypeError, match="stages must be from 0, 1, 2, 3, got .* \\(a boolean\\)"):
        plan("llama-2-7b", 8, 8, "h100-80gb", 4096, 8, stages=stages)


def test_an_empty_notebooks_dir_is_not_the_current_folder():
    refused(["notebooks", "--dir", ""], "--dir must name a folder, got an empty path")
    refused(["notebooks", "--check", "--dir", " "], "--dir must name a folder")


def test_a_recorded_run_from_a_given_data_folder_is_read_bounded(tmp_path):
    from zerolib.crosscheck.validation.records import MAX_RECORD_BYTES, read_csv
    big = tmp_path / "validation_sharded.csv"
    with open(big, "wb") as handle:
        handle.truncate(MAX_RECORD_BYTES + 1)
    with pytest.raises(ValueError, match="validation_sharded.csv: 10,000,001 bytes"):
        read_csv(big)
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="a named pipe"):
        read_csv(fifo)
    (tmp_path / "ok.csv").write_text("a,b\n1,\n")
    assert read_csv(tmp_path / "ok.csv").to_dict("records") == [{"a": 1, "b": ""}]
