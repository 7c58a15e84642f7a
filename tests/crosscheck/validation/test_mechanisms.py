"""Trainers' memory mechanisms measured with the real PyTorch code, against counts by hand.

The counts here are worked out in the test from the operators each case runs (which tensor
autograd, the checkpoint or the loss keeps, and its shape), not taken from
``explain_mechanisms``. Without torch: the recorded file is checked against them. With torch:
small cases are measured again (each well under a second after the imports).
"""
from __future__ import annotations

import sys
import warnings

import pytest
from cli_support import run
from conftest import REPO, optional_import

from zerolib.crosscheck.validation.records import MECHANISMS_FILE, read_csv, to_csv_text

DATA = REPO / "data"
HINT = "install the validate extra: pip install -e '.[validate]' (torch==2.13.0 first on this project's machines)"

# The measured Llama layers: s=64, b=2 (T=128 tokens), h=64, 4 query heads and 2 key/value heads
# of d=16, MLP f=160, 4 layers.
T, L, H, A, K, D, F = 128, 4, 64, 4, 2, 16, 160


def llama_none_per_token(dropout=False):
    tensors = [
        4 * H, 4, 2 * H, 2 * H,         # input RMSNorm: fp32 copy, 1/rms, x_hat (bf16), output
        2 * A * D, 2 * K * D, 2 * K * D,  # rotated Q, rotated K, V (sdpa with grouped heads)
        2 * A * D, 4 * A,               # attention output (= o_proj's input), fp32 log-sum-exp
        4 * H, 4, 2 * H, 2 * H,         # post-attention RMSNorm, as above
        2 * F, 2 * F, 2 * F, 2 * F,     # gate (SiLU input), SiLU output, up, product
    ]
    return sum(tensors) + (2 * H if dropout else 0)   # two 1-byte dropout masks of h


def op_sac_per_token(attention=True):
    # input; mm outputs 1, 3, 5, 7 of q, k, v, o, gate, up, down; the attention kernel's outputs
    return 2 * H + 2 * A * D + 2 * K * D + 2 * F + 2 * H + ((2 * A * D + 4 * A) if attention else 0)


def test_hand_counts_are_what_the_record_shows():
    assert llama_none_per_token() == 2712 and op_sac_per_token() == 912
    recorded = read_csv(DATA / MECHANISMS_FILE)
    saved = recorded[recorded["mechanism"] == "saved activations"].set_index("case")
    expected = {
        "none": L * T * llama_none_per_token(),
        "none-dropout": L * T * llama_none_per_token(dropout=True),
        "op-sac": L * T * op_sac_per_token(),
        "op-sac-cpu-list": L * T * op_sac_per_token(attention=False),
        "selective": L * T * (llama_none_per_token() - 4 * A),   # only the log-sum-exp dropped
        "selective-dropout": L * T * (llama_none_per_token(True) - 4 * A),
        "full": L * T * 2 * H,
        "uniform-2": 2 * T * 2 * H,                                 # two chunks of two layers
        "block-2": 2 * T * 2 * H + 2 * T * llama_none_per_token(),
        # Float8Linear saves its bf16 input as nn.Linear does; under the op-level policy the
        # saved max ops add the amax (a bf16 scalar) of the input and of the weight of each of
        # the 7 Linear layers
        "float8-none": L * T * llama_none_per_token(),
        "float8-op-sac": L * (T * op_sac_per_token() + 7 * 2 * 2),
    }
    assert saved["measured_bytes"].to_dict() == expected
    assert (saved["hand_bytes"] == saved["measured_bytes"]).all()
    # The allocator also holds the CPU RNG state (5,056 B) of every checkpoint call.
    calls = {"none": 0, "none-dropout": 0, "op-sac": 4, "op-sac-cpu-list": 4, "selective": 4,
             "selective-dropout": 4, "full": 4, "uniform-2": 2, "block-2": 2, "float8-none": 0,
             "float8-op-sac": 4}
    for case, count in calls.items():
        assert int(saved.at[case, "allocator_bytes"]) == expected[case] + 5056 * count, case


def test_full_width_by_hand():
    # Llama-3-8B's layer on fake tensors, 4 layers of 8,192 tokens
    h, a, k, d, f, tokens = 4096, 32, 8, 128, 14336, 4 * 8192
    none = 2 * (4 * h + 4 + 2 * h + 2 * h) + 4 * a * d + 4 * k * d + 4 * a + 8 * f
    assert none == 200_840
    recorded = read_csv(DATA / MECHANISMS_FILE)
    wide = recorded[recorded["mechanism"] == "saved activations, full width"].set_index("case")
    assert wide.at["none", "measured_bytes"] == tokens * none
    assert wide.at["op-sac", "measured_bytes"] == tokens * (4 * h + 4 * a * d + 2 * k * d + 4 * a + 2 * f)
    assert wide.at["selective", "measured_bytes"] == tokens * (none - 4 * a)
    assert wide.at["full", "measured_bytes"] == tokens * 2 * h
    assert (wide["measured_bytes"] == wide["hand_bytes"]).all()


def test_loss_per_logit_by_hand():
    recorded = read_csv(DATA / MECHANISMS_FILE)
    loss = recorded[recorded["mechanism"] == "logits and loss"].set_index("case")
    N, V = 256, 2048
    per_logit = {"eager-fp32": 2 + 4 + 4 + 4, "eager-bf16": 2 + 2 + 2 + 2, "chunked-fp32": 2 + 4 + 8 / 8,
                 "compiled-fp32": 2 + 2, "vocab-parallel-2": 2 + 4 + 2, "vocab-parallel-4": 2 + 4 + 2}
    ranks = {"vocab-parallel-2": 2, "vocab-parallel-4": 4}
    for case, per in per_logit.items():
        logits = N * V // ranks.get(case, 1)
        assert loss.at[case, "hand_bytes"] == per * logits, case
        measured = loss.at[case, "measured_bytes"]
        # the rest: scalars (loss, the backward's seed) and a few bytes per token
        assert 0 <= measured - per * logits <= 16 * N, case


def test_fsdp_state_by_hand():
    recorded = read_csv(DATA / MECHANISMS_FILE)
    fsdp = recorded[recorded["mechanism"] == "FSDP2 state"]
    per_layer = H * A * D + 2 * H * K * D + A * D * H + 3 * H * F + 2 * H   # 7 weights, 2 norms
    P, n, W = 2 * per_layer, 2 * 9, 4
    assert P == 86_272
    got = {(r["case"], r["counted"].split(":")[0]): r["measured_bytes"] for r in fsdp.to_dict("records")}
    assert got[("pipeline-after-micro-batch-1", "UNSHARDED_PARAM")] == 2 * P       # bf16, kept
    assert got[("pipeline-after-micro-batch-1", "TEMP")] == 4 * P                  # fp32 accumulated
    assert ("pipeline-after-micro-batch-1", "SHARDED_GRAD") not in got
    assert got[("pipeline-after-micro-batch-2", "SHARDED_GRAD")] == 4 * P // W
    assert ("pipeline-after-micro-batch-2", "UNSHARDED_PARAM") not in got
    for case in ("pipeline-after-micro-batch-1", "default-after-micro-batch-1"):
        assert got[(case, "SHARDED_PARAM")] == 4 * P // W
        assert got[(case, "OPT")] == 8 * P // W + 4 * n
    # fp8 all-gather: the 14 Linear weights in fp8 (1 B) with an fp32 scale each, norms in bf16;
    # after the reshard only the scales stay
    linear = P - 2 * 2 * H
    assert got[("pipeline-fp8-after-micro-batch-1", "UNSHARDED_PARAM")] == linear + 4 * 14 + 2 * (P - linear)
    assert got[("pipeline-fp8-after-micro-batch-1", "TEMP")] == 4 * P
    assert got[("pipeline-fp8-after-micro-batch-2", "UNSHARDED_PARAM")] == 4 * 14
    explained = fsdp[fsdp["hand_bytes"] != 0]
    assert (explained["measured_bytes"] == explained["hand_bytes"]).all()
    # the one row not explained says so
    (left,) = fsdp[fsdp["hand_bytes"] == 0].to_dict("records")
    assert left["measured_bytes"] == 28 and left["note"].startswith("not explained")


def test_recorded_file_is_tidy_and_deterministic():
    recorded = read_csv(DATA / MECHANISMS_FILE)
    assert to_csv_text(recorded) == (DATA / MECHANISMS_FILE).read_text(encoding="utf-8")
    for column in ("torch_version", "transformers_version", "megatron_core_version", "torchao_version"):
        assert recorded[column].nunique() == 1 and recorded[column].iloc[0] != ""
    text = (DATA / "mechanisms_measured.md").read_text(encoding="utf-8")
    for column in recorded.columns:
        assert f"`{column}`" in text, column


def test_without_torch_says_how_to_install(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    status, out, err = run(capsys, "validate-mechanisms")
    assert status == 2 and out == "" and "PyTorch is not installed" in err


# --- with torch: small cases measured again ----------------------------------------------------

@pytest.fixture(scope="module")
def mechanism_run():
    optional_import("torch", HINT)
    optional_import("transformers", HINT)
    from zerolib.crosscheck.validation import mechanism_run

    return mechanism_run


def _case(cases, name):
    return next(case for case in cases if case.name == name)


@pytest.mark.torch
@pytest.mark.parametrize("name, per_token", [
    ("none", llama_none_per_token()), ("op-sac", op_sac_per_token()),
    ("selective", llama_none_per_token() - 4 * A), ("full", 2 * H)])
def test_recompute_policies_measured_again(mechanism_run, name, per_token):
    from zerolib.crosscheck.validation.explain_mechanisms import RECOMPUTE_CASES

    found = mechanism_run.measure_recompute(_case(RECOMPUTE_CASES, name))
    assert found["tracker"] == L * T * per_token
    checkpoints = 0 if name == "none" else L
    assert found["allocator"] == found["tracker"] + 5056 * checkpoints   # the CPU RNG states


@pytest.mark.torch
def test_float8_saves_what_bf16_saves(mechanism_run):
    optional_import("torchao", HINT)
    from zerolib.crosscheck.validation.explain_mechanisms import RECOMPUTE_CASES

    found = mechanism_run.measure_recompute(_case(RECOMPUTE_CASES, "float8-none"))
    assert found["tracker"] == found["allocator"] == L * T * llama_none_per_token()


@pytest.mark.torch
def test_full_width_on_fake_tensors(mechanism_run):
    from zerolib.crosscheck.validation.explain_mechanisms import FULL_WIDTH, RECOMPUTE_CASES

    found = mechanism_run.measure_recompute(_case(RECOMPUTE_CASES, "op-sac"), FULL_WIDTH, fake=True)
    assert found["tracker"] == 4 * 8192 * 63_616 and found["allocator"] is None


@pytest.mark.torch
def test_op_sac_keeps_the_outputs_of_the_odd_mms(mechanism_run):
    from zerolib.crosscheck.validation.explain_mechanisms import RECOMPUTE_CASES

    items = mechanism_run.measure_recompute(_case(RECOMPUTE_CASES, "op-sac"))["items"]
    first_layer = [(i.op, i.shape) for i in items][:7]
    assert first_layer == [("clone.default", (2, 64, 64)), ("mm.default", (T, A * D)),
                           ("mm.default", (T, K * D)),
                           ("_scaled_dot_product_flash_attention_for_cpu.default", (2, A, 64, D)),
                           ("_scaled_dot_product_flash_attention_for_cpu.default", (2, A, 64)),
                           ("mm.default", (T, F)), ("mm.default", (T, H))]


@pytest.mark.torch
@pytest.mark.parametrize("name, per_logit, ranks", [
    ("eager-fp32", 14, 1), ("eager-bf16", 8, 1), ("vocab-parallel-4", 8, 4)])
def test_loss_measured_again(mechanism_run, name, per_logit, ranks):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # megatron-core says TransformerEngine and Apex are absent
        optional_import("megatron.core", HINT)
    from zerolib.crosscheck.validation.explain_mechanisms import LOSS_CASES

    found = mechanism_run.measure_loss(_case(LOSS_CASES, name))
    logits = 256 * 2048 // ranks
    assert found["tracker"] == found["allocator"]          # two counts, one answer
    assert 0 <= found["tracker"] - per_logit * logits <= 16 * 256


@pytest.mark.torch
def test_fsdp_pipeline_measured_again(mechanism_run):
    found = mechanism_run.measure_fsdp_pipeline(True)
    P = found["parameters"]
    first, last = found["snapshots"]
    assert (first["UNSHARDED_PARAM"], first["TEMP"], first["SHARDED_GRAD"]) == (2 * P, 4 * P, 0)
    assert (last["UNSHARDED_PARAM"], last["TEMP"], last["SHARDED_GRAD"]) == (0, 0, 4 * P // 4)
