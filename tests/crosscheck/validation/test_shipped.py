"""Shipped transformers blocks (GPT-2, Llama) measured against the formula, every byte explained.

Without torch: the expected sizes are checked against numbers worked out by hand from the block
shapes, the recorded file in data/ is checked for shape and for explaining every byte, and the
comparison is shown to flag storages it does not expect. With torch and transformers: the
measurement is re-run and must reproduce the recorded file row for row.
"""
from __future__ import annotations

import json
import sys

import pandas as pd
import pytest
from cli_support import run
from conftest import REPO, optional_import

from zerolib.chapter.figures import OTHER_DATA_FILES
from zerolib.core.memory.activations import layer_activation_bytes
from zerolib.crosscheck.validation import report
from zerolib.crosscheck.validation.effects import MECHANISMS
from zerolib.crosscheck.validation.explain_shipped import (
    BLOCKS,
    CASES,
    NOT_SAVED,
    UNEXPECTED,
    case_name,
    compare_shipped,
    expected_items,
    mechanism_bytes,
    totals,
)
from zerolib.crosscheck.validation.records import (
    SHIPPED_FILE,
    SHIPPED_VERSION_COLUMNS,
    differences,
    read_csv,
    to_csv_text,
)

DATA = REPO / "data"
HINT = "install the validate extra: pip install -e '.[validate]' (torch==2.13.0 first on this project's machines)"
MEASURED_COLUMNS = ["block", "micro_batch", "module", "saved_by", "saved_dtype", "saved_shape",
                    "measured_bytes"]
S, H, A = 64, 64, 4   # both blocks: 64 tokens, hidden 64, 4 heads


@pytest.fixture(scope="module")
def shipped():
    return read_csv(DATA / SHIPPED_FILE)


def by_case(frame) -> dict:
    return totals(frame).set_index("case").to_dict("index")


# --- the expected sizes, by hand ---------------------------------------------------------------

def gpt2_formula(b):
    # Table 2 with no parallelism: sbh(34 + 5as/h) in bytes; GPT-2's f = 4h.
    return 34 * S * b * H + 5 * A * S * S * b


def llama_formula(b, flash):
    # 2-byte tensors of Sec. 4.1's list for a gated block without dropout: two norm inputs, the
    # QKV input and the MLP input (s x b x 64 each), Q and the output projection's input
    # (4 heads x 32 = 128 wide), K and V (2 heads x 32 = 64 wide), four 160-wide MLP tensors; then
    # the softmax output (2as^2b) or the flash log-sum-exp (4 bytes per head and token).
    sb = S * b
    core = 2 * (4 * sb * 64 + 2 * sb * 128 + 2 * sb * 64 + 4 * sb * 160)
    return core + (4 * A * sb if flash else 2 * A * S * S * b)


def test_formula_totals_by_hand():
    assert gpt2_formula(1) == 221_184
    assert llama_formula(1, flash=False) == 196_608 and llama_formula(1, flash=True) == 164_864
    for name, b in CASES:
        block = BLOCKS[name]
        expected = gpt2_formula(b) if block.model == "gpt2" else llama_formula(b, block.flash_attention)
        assert sum(block.formula_terms(b).values()) == expected
        assert expected == layer_activation_bytes(
            S, b, H, A, ffn_hidden=block.ffn_hidden, gated_mlp=block.gated_mlp, kv_heads=block.kv_heads,
            head_dim=block.head_dim, flash_attention=block.flash_attention, dropout=block.dropout)


def test_mechanism_sizes_by_hand():
    gpt2, gpt2_off, llama = BLOCKS["gpt2"], BLOCKS["gpt2-no-cache"], BLOCKS["llama-eager"]
    # gelu_new keeps three more 256-wide bf16 tensors per token.
    assert mechanism_bytes("python-gelu", gpt2, 1, 0) == 2 * 64 * 256
    # The K and V thirds of c_attn's 192-wide output, at micro-batch 1 with the KV cache only.
    assert mechanism_bytes("fused-qkv-view", gpt2, 1, 0) == 2 * 2 * 64 * 64
    assert mechanism_bytes("fused-qkv-view", gpt2, 2, 0) == 0
    assert mechanism_bytes("fused-qkv-view", gpt2_off, 1, 0) == 0
    # CPU dropout noise: 2 bytes where the formula counts a 1-byte mask (formula bytes = elements).
    assert mechanism_bytes("dropout-noise", gpt2, 1, 16_384) == 16_384
    # RMSNorm: fp32 input copy (2 more bytes per element), 4-byte 1/rms per token, bf16 x_hat.
    assert mechanism_bytes("rmsnorm-fp32-input", llama, 2, 0) == 2 * 2 * 64 * 64
    assert mechanism_bytes("rmsnorm-statistics", llama, 2, 0) == 4 * 2 * 64
    # cos/sin: 64 positions x head_dim 32, bf16, the same for any micro-batch.
    assert mechanism_bytes("rotary-cos-sin", llama, 1, 0) == mechanism_bytes("rotary-cos-sin", llama, 2, 0) \
        == 2 * 64 * 32
    # K and V repeated from 2 to 4 heads of 32; softmax in fp32 (2 more bytes) and its bf16 copy.
    assert mechanism_bytes("repeat-kv", llama, 1, 0) == 2 * 64 * 2 * 32
    assert mechanism_bytes("softmax-fp32", llama, 1, 0) == mechanism_bytes("softmax-downcast-copy", llama, 1, 0) \
        == 2 * 4 * 64 * 64


def test_every_formula_term_is_expected_somewhere():
    for name, b in CASES:
        block = BLOCKS[name]
        covered = {t for item in expected_items(block, b) for t in item.terms}
        assert {t for t, size in block.formula_terms(b).items() if size} == covered, name
        assert {item.mechanism for item in expected_items(block, b)} - {""} <= set(MECHANISMS)


# --- the recorded file (no torch needed) -------------------------------------------------------

def test_recorded_file_is_tidy_stamped_and_deterministic(shipped):
    assert [tuple(k) for k in shipped[["block", "micro_batch"]].drop_duplicates().values] == list(CASES)
    assert set(shipped["case"]) == {case_name(name, b) for name, b in CASES}
    for column in SHIPPED_VERSION_COLUMNS:
        assert shipped[column].nunique() == 1 and shipped[column].iloc[0] != ""
    assert to_csv_text(shipped) == (DATA / SHIPPED_FILE).read_text(encoding="utf-8")


def test_recorded_comparison_follows_from_recorded_measurements(shipped):
    fresh = compare_shipped(shipped[MEASURED_COLUMNS])
    assert differences(shipped, fresh) == []


def test_every_byte_is_explained(shipped):
    assert (shipped["unexplained_bytes"] == 0).all(), shipped[shipped["unexplained_bytes"] != 0]
    assert not shipped["item"].str.startswith((NOT_SAVED, UNEXPECTED)).any()
    differing = shipped[shipped["difference_bytes"] != 0]
    assert (differing["effects"] != "").all()
    assert {k for text in shipped["effects"] for k in text.split()} <= set(MECHANISMS)


def test_recorded_totals_by_hand(shipped):
    found = by_case(shipped)
    sbh, sbf = S * H, S * 256
    # GPT-2, micro-batch b: Table 2 + three gelu_new tensors (3 x 2sbf) + CPU dropout noise
    # (one more byte for a s^2 b and 2 sbh mask elements) + LayerNorm statistics (2 norms x 2 x 2sb).
    for b in (1, 2):
        shipped_gpt2 = gpt2_formula(b) + b * (3 * 2 * sbf + (A * S * S + 2 * sbh) + 2 * 2 * 2 * S)
        assert found[f"gpt2-no-cache-b{b}"]["measured_bytes"] == shipped_gpt2
        # With the KV cache on, micro-batch 1 keeps c_attn's fused output whole: 4sbh more.
        assert found[f"gpt2-b{b}"]["measured_bytes"] == shipped_gpt2 + (4 * sbh if b == 1 else 0)
    assert found["gpt2-b1"]["measured_bytes"] == 360_960 and found["gpt2-b2"]["measured_bytes"] == 689_152
    # Llama: per sequence, 2 RMSNorms x (2sbh more for fp32 + 4sb + 2sbh) + K and V repeated
    # (2 x 2 x s x 2 heads x 32) + fp32 softmax and its bf16 copy (2 x 2as^2) for eager; the
    # rotary tables (2 x 2 x 64 x 32) once, whatever the micro-batch.
    rms = 2 * (2 * sbh + 4 * S + 2 * sbh)
    eager = 2 * 2 * S * 2 * 32 + 2 * 2 * A * S * S
    for b in (1, 2):
        assert found[f"llama-sdpa-b{b}"]["measured_bytes"] == llama_formula(b, True) + b * rms + 2 * 2 * 64 * 32
        assert found[f"llama-eager-b{b}"]["measured_bytes"] == (llama_formula(b, False) + b * (rms + eager)
                                                                + 2 * 2 * 64 * 32)


def test_report_tables(shipped):
    summary = report.shipped_summary(shipped).set_index("case")
    assert summary.at["gpt2-b1", "difference"] == "+63.2%"       # 360,960 / 221,184 - 1
    assert summary.at["llama-sdpa-b2", "difference"] == "+22.7%"  # 404,480 / 329,728 - 1
    assert (summary["unexplained [B]"] == 0).all()
    wide = report.shipped_mechanisms(shipped)
    assert wide.at["python-gelu", "gpt2-b2"] == 3 * 2 * 2 * 64 * 256
    assert wide.at["fused-qkv-view", "gpt2-b1"] == 4 * 64 * 64 and wide.at["fused-qkv-view", "gpt2-b2"] == 0


def test_the_data_file_is_described():
    assert (SHIPPED_FILE, "shipped_activations.md") in {(p, d) for p, d, _ in OTHER_DATA_FILES}
    text = (DATA / "shipped_activations.md").read_text(encoding="utf-8")
    recorded = read_csv(DATA / SHIPPED_FILE)
    for column in recorded.columns:
        assert f"`{column}`" in text, column
    for key in {k for effects in recorded["effects"] for k in effects.split()}:
        assert f"| `{key}` |" in text, key


# --- the comparison flags what it cannot explain -----------------------------------------------

def test_an_unexpected_or_missing_storage_is_unexplained(shipped):
    measured = shipped[shipped["case"] == "llama-sdpa-b1"][MEASURED_COLUMNS]
    extra = pd.concat([measured, pd.DataFrame([{
        "block": "llama-sdpa", "micro_batch": 1, "module": "mlp", "saved_by": "ExpBackward0.result",
        "saved_dtype": "bfloat16", "saved_shape": "1x64x160", "measured_bytes": 20_480}])])
    compared = compare_shipped(extra)
    assert by_case(compared)["llama-sdpa-b1"]["unexplained_bytes"] == 20_480
    assert (compared["item"] == UNEXPECTED).sum() == 1
    missing = compare_shipped(measured[measured["saved_by"] != "SiluBackward0.self"])
    row = missing[missing["item"].str.startswith(NOT_SAVED)].iloc[0]
    assert row["terms"] == "mlp_gate_projection" and row["unexplained_bytes"] == -2 * 64 * 160


# --- the command -------------------------------------------------------------------------------


def test_without_transformers_says_how_to_install(capsys, monkeypatch):
    optional_import("torch", HINT)
    monkeypatch.setitem(sys.modules, "transformers", None)
    status, out, err = run(capsys, "validate", "--shipped-only")
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "transformers is not installed" in err and "pip install -e '.[validate]'" in err


# --- with torch and transformers: the run itself -----------------------------------------------

@pytest.fixture(scope="module")
def fresh():
    optional_import("torch", HINT)
    optional_import("transformers", HINT)
    from zerolib.crosscheck.validation.runner import validate_shipped

    return validate_shipped()


@pytest.mark.torch
def test_rerun_matches_the_recorded_file(fresh, shipped):
    found = differences(shipped, fresh, limit=10)
    hint = "re-record with `zerolib validate --shipped-only --record` and explain the change"
    assert found == [], f"{SHIPPED_FILE} no longer matches ({hint}):\n" + "\n".join(found)


@pytest.mark.torch
def test_cli_shipped_only_prints_and_records(fresh, capsys, monkeypatch, tmp_path):
    import zerolib.crosscheck.validation.runner as runner

    monkeypatch.setattr(runner, "validate_shipped", lambda: fresh)   # measured once above
    status, out, err = run(capsys, "validate", "--shipped-only", "--record", "--data-dir", str(tmp_path))
    assert status == 0 and err.count("recorded ") == 1
    assert (tmp_path / SHIPPED_FILE).read_text() == to_csv_text(fresh)
    assert "gpt2-b1" in out and "+63.2%" in out and "python-gelu:" in out
    assert "Model state per rank" not in out          # the sharded runs were not started
    status, out, _ = run(capsys, "validate", "--shipped-only", "--format", "json")
    result = json.loads(out)
    assert set(result) == {"shipped", "shipped_totals"}
    assert {row["case"] for row in result["shipped_totals"]} == {case_name(n, b) for n, b in CASES}


def test_extras_at_a_real_shape_and_their_limits():
    from zerolib.crosscheck.validation.explain_shipped import at_shape, extra_bytes

    # GPT-2 small at 1,024 tokens, micro-batch 1, by hand: three 2sbf GELU tensors (f = 3,072),
    # the fused view's 4sbh, CPU dropout noise (12 heads x s^2 + 2 sbh more bytes) and LayerNorm
    # statistics (2 norms x 2 x 2sb).
    s, h, f, a = 1024, 768, 3072, 12
    found = extra_bytes(at_shape(BLOCKS["gpt2"], "gpt2", s), 1)
    assert found == {"norm-statistics": 2 * 2 * 2 * s, "dropout-noise": a * s * s + 2 * s * h,
                     "python-gelu": 3 * 2 * s * f, "fused-qkv-view": 4 * s * h}
    frame = report.shipped_extras("gpt2", "gpt2", s)
    assert frame.attrs["model"] == "gpt2" and set(frame["held"]) == {12}
    with pytest.raises(ValueError, match="model must have the MLP"):
        at_shape(BLOCKS["llama-sdpa"], "mixtral-8x7b", 128)      # experts
    with pytest.raises(ValueError, match="model must have the MLP"):
        at_shape(BLOCKS["gpt2"], "llama-2-7b", 128)              # gated
    with pytest.raises(ValueError, match="seq_len"):
        at_shape(BLOCKS["llama-sdpa"], "llama-2-7b", 0)
    with pytest.raises(ValueError, match="block must be one of"):
        report.shipped_extras("llama", "llama-2-7b", 128)
