"""What real runs hand to their collectives (data/communication_*.csv) against zerolib.

Without torch: the predictions and mechanisms are checked against numbers worked out by hand,
the recorded files for shape, versions, determinism and for explaining every byte and call.
With torch (marker ``torch``): the PyTorch part is re-run and must match its record exactly.
The DeepSpeed record is checked here from the file alone.
"""
from __future__ import annotations

import sys
import types

import pytest
from cli_support import run
from conftest import REPO, optional_import

from zerolib.crosscheck.validation.deepspeed_run import DEEPSPEED_MODELS
from zerolib.crosscheck.validation.effects import MECHANISMS
from zerolib.crosscheck.validation.explain_communication import (
    COMPARED_KINDS,
    DEEPSPEED_CONFIGS,
    compare_communication,
    deepspeed_effects,
    predicted,
    pytorch_effects,
)
from zerolib.crosscheck.validation.records import (
    COMMUNICATION_DEEPSPEED_FILE,
    COMMUNICATION_PYTORCH_FILE,
    differences,
    read_csv,
    to_csv_text,
)
from zerolib.crosscheck.validation.setups import COMMUNICATION_STRATEGIES, TINY_MODELS

DATA = REPO / "data"
MEASURED = ["engine", "strategy", "precision", "model", "workers", "rank", "kind",
            "measured_calls", "measured_bytes"]
EVEN_DS, UNEVEN_DS = DEEPSPEED_MODELS


def effects_by(effects) -> dict:
    out = {}
    for e in effects:
        out[(e.key, e.kind)] = (out.get((e.key, e.kind), (0, 0))[0] + e.bytes,
                                out.get((e.key, e.kind), (0, 0))[1] + e.calls)
    return out


@pytest.fixture(scope="module")
def pytorch_record():
    return read_csv(DATA / COMMUNICATION_PYTORCH_FILE)


@pytest.fixture(scope="module")
def deepspeed_record():
    return read_csv(DATA / COMMUNICATION_DEEPSPEED_FILE)


def one(frame, **where) -> dict:
    rows = frame
    for column, value in where.items():
        rows = rows[rows[column] == value]
    assert len(rows) == 1, where
    return rows.iloc[0].to_dict()


# --- by hand ----------------------------------------------------------------------------------

def test_predictions_by_hand():
    spec = TINY_MODELS["uneven"]                    # 2,606 parameters, 3 Linear layers
    # Stage 1, 4 workers, fp32: reduce-scatter of the buffer padded to 4 x ceil(2606/4) = 2,608
    # elements; all-gather of one 652-element chunk.
    assert predicted(spec, 4, 1, "fp32-adam") == {
        "all_reduce": (0, 0), "reduce_scatter": (1, 4 * 2608), "all_gather": (1, 4 * 652),
        "broadcast": (0, 0)}
    # Stage 3: per layer (1,530, 966 and 110 elements): chunks 383 + 242 + 28 = 653 per pass.
    assert predicted(spec, 4, 3, "bf16-fp32-grads") == {
        "all_reduce": (0, 0), "reduce_scatter": (3, 4 * 4 * 653), "all_gather": (6, 2 * 2 * 653),
        "broadcast": (0, 0)}


def test_zero_redundancy_optimizer_by_hand():
    effects = effects_by(pytorch_effects("zero1", TINY_MODELS["uneven"], 4))
    # DDP all-reduces all 2,606 fp32 gradients; every rank hands every tensor to 6 broadcasts.
    assert effects[("ddp-all-reduce", "all_reduce")] == (4 * 2606, 1)
    assert effects[("ddp-all-reduce", "reduce_scatter")] == (-4 * 2608, -1)
    assert effects[("owner-broadcasts", "broadcast")] == (4 * 2606, 6)
    assert effects[("owner-broadcasts", "all_gather")] == (-4 * 652, -1)


def test_fsdp2_padding_by_hand():
    effects = effects_by(pytorch_effects("fsdp2-keep", TINY_MODELS["uneven"], 4))
    # Padded shards: ceil(45/4) = 12 rows of 33 + 1, 6 rows of 45 + 1, 2 rows of 21 + 1:
    # 408 + 276 + 44 = 728 elements per rank, against the engine fsdp2's per-layer chunks
    # ceil(1530/4) + ceil(966/4) + ceil(110/4) = 383 + 242 + 28 = 653.
    assert effects[("shard-padding", "all_gather")] == (4 * (728 - 653), 0)
    assert effects[("shard-padding", "reduce_scatter")] == (4 * 4 * (728 - 653), 0)
    assert ("per-layer-calls", "all_gather") not in effects   # fsdp2 predicts 3 calls itself
    assert predicted(TINY_MODELS["uneven"], 4, 2, "fp32-adam", engine="fsdp2") == {
        "all_reduce": (0, 0), "reduce_scatter": (3, 4 * 4 * 653), "all_gather": (3, 4 * 653),
        "broadcast": (0, 0)}
    # gloo runs the three reduce-scatters as all-reduces of 4 x 728 fp32 elements.
    assert effects[("gloo-reduce-scatter", "all_reduce")] == (4 * 4 * 728, 3)


def test_hsdp_by_hand():
    spec = TINY_MODELS["uneven"]
    # A shard group of 2 of 4 ranks: chunks ceil(u / 2) of the 1,530, 966 and 110-element
    # layers, 765 + 483 + 55 = 1,303 per pass; fp32. Each rank all-reduces its 1,303-element
    # shard with the other pair.
    assert predicted(spec, 4, 3, "fp32-adam", 2) == {
        "all_reduce": (3, 4 * 1303), "reduce_scatter": (3, 4 * 2 * 1303),
        "all_gather": (6, 4 * 2 * 1303), "broadcast": (0, 0)}
    effects = effects_by(pytorch_effects("hsdp", spec, 4))
    # FSDP2 pads over the pair: ceil(45/2) = 23 rows of 34, 11 of 46, 3 of 22: 782 + 506 + 66 =
    # 1,354 elements, 51 more than 1,303 in each gather, reduce-scatter half and all-reduce.
    assert effects[("shard-padding", "all_gather")] == (4 * 2 * 51, 0)
    assert effects[("shard-padding", "reduce_scatter")] == (4 * 2 * 51, 0)
    assert effects[("shard-padding", "all_reduce")] == (4 * 51, 0)
    # gloo runs each reduce-scatter as an all-reduce of the pair's 2 x 1,354 fp32 elements.
    assert effects[("gloo-reduce-scatter", "all_reduce")] == (4 * 2 * 1354, 3)
    assert effects[("gloo-reduce-scatter", "reduce_scatter")] == (-4 * 2 * 1354, -3)


def test_deepspeed_stage_1_by_hand():
    effects = effects_by(deepspeed_effects("stage1", "fp32", UNEVEN_DS, 4))
    # 1,838,337 elements padded to a multiple of 8: 1,838,344 = 4 x 459,586, one element per
    # rank more than ceil(1,838,337 / 4) = 459,585.
    assert effects[("alignment-padding", "all_gather")] == (4, 0)
    # The engine deepspeed predicts the bucket all-reduce of the 1,838,337 unpadded fp32
    # gradients (one bucket of 5e8) and one all-gather of the 459,585-element chunk.
    assert ("bucket-all-reduce", "all_reduce") not in effects
    assert predicted(UNEVEN_DS, 4, 1, "fp32-adam", engine="deepspeed") == {
        "all_reduce": (1, 4 * 1_838_337), "reduce_scatter": (0, 0), "all_gather": (1, 4 * 459_585),
        "broadcast": (0, 0)}
    assert effects[("gradient-norm", "all_reduce")] == (4, 1)
    assert ("overflow-flag", "all_reduce") not in effects
    assert effects_by(deepspeed_effects("stage2", "bf16", UNEVEN_DS, 4))[
        ("overflow-flag", "all_reduce")] == (1, 1)


def test_deepspeed_stage_3_by_hand():
    effects = effects_by(deepspeed_effects("stage3", "bf16", UNEVEN_DS, 2))
    # Layers 525,312 + 1,049,600 + 263,425 elements: chunks of one pass 262,656 + 524,800 +
    # 131,713 = 919,169 on 2 ranks, the same as each tensor padded on its own (262,144 + 512 +
    # 524,288 + 512 + 131,584 + 129): no partition padding here, and the backward pass's
    # gathers are gone (the whole model stays gathered).
    assert effects[("kept-gathered", "all_gather")] == (-2 * 919_169, -3)
    assert effects[("partition-padding", "all_gather")] == (0, 0)
    # One coalesced fetch for the three weights, one for each of the three biases: 4 calls.
    assert effects[("coalesced-fetch", "all_gather")] == (0, 1)
    assert effects[("gradient-norm", "all_reduce")] == (8, 1)
    release = effects_by(deepspeed_effects("stage3-release", "bf16", UNEVEN_DS, 2))
    assert ("kept-gathered", "all_gather") not in release


# --- the recorded files ------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["pytorch", "deepspeed"])
def test_records_are_tidy_stamped_and_complete(name, pytorch_record, deepspeed_record):
    frame = pytorch_record if name == "pytorch" else deepspeed_record
    assert sorted(frame["workers"].unique()) == [2, 4]
    assert list(frame["kind"].unique()) == list(COMPARED_KINDS)
    keys = ["strategy", "precision", "model", "workers", "rank", "kind"]
    assert not frame.duplicated(keys).any()
    if name == "pytorch":
        # Every strategy on 2 and 4 ranks but HSDP, which needs two shard groups of 2: 4 only.
        ranks = sum(w for s in COMMUNICATION_STRATEGIES.values() for w in (2, 4) if s.runs_on(w))
        assert ranks == 5 * (2 + 4) + 4
        assert len(frame) == len(TINY_MODELS) * ranks * len(COMPARED_KINDS)
    else:
        runs = len(DEEPSPEED_CONFIGS) * 2 * len(DEEPSPEED_MODELS)
        assert len(frame) == runs * (2 + 4) * len(COMPARED_KINDS)
    versions = ["torch_version", "python_version", "platform"]
    if name == "deepspeed":
        versions += ["deepspeed_version", "backend"]
        assert set(frame["deepspeed_version"]) == {"0.19.8"} and set(frame["backend"]) == {"gloo"}
    for column in versions:
        assert frame[column].nunique() == 1 and frame[column].iloc[0] != ""


@pytest.mark.parametrize("name", [COMMUNICATION_PYTORCH_FILE, COMMUNICATION_DEEPSPEED_FILE])
def test_every_byte_and_call_is_explained(name):
    frame = read_csv(DATA / name)
    assert (frame["unexplained_bytes"] == 0).all() and (frame["unexplained_calls"] == 0).all()
    assert not frame["explanation"].str.contains("UNEXPLAINED").any()
    differing = frame[(frame["difference_bytes"] != 0)
                      | (frame["measured_calls"] != frame["predicted_calls"])]
    assert (differing["effects"] != "").all()
    used = {key for text in frame["effects"] for key in text.split()}
    assert used <= set(MECHANISMS)
    # Re-deriving predictions and explanations from the measured columns rewrites the file,
    # and the file is exactly what writing it gives.
    engine_versions = [c for c in ("deepspeed_version", "backend") if c in frame.columns]
    assert differences(frame.drop(columns=engine_versions),
                       compare_communication(frame[MEASURED])) == []
    assert to_csv_text(frame) == (DATA / name).read_text(encoding="utf-8")


def test_what_the_pytorch_runs_show(pytorch_record):
    # DDP hands exactly zerolib's all-reduce: 16,640 fp32 gradients, one call.
    ddp = one(pytorch_record, strategy="ddp", model="even", workers=4, rank=3, kind="all_reduce")
    assert (ddp["measured_bytes"], ddp["measured_calls"], ddp["effects"]) == (4 * 16_640, 1, "")
    # ZeroRedundancyOptimizer: every rank hands every one of the 6 tensors to a broadcast.
    zero1 = one(pytorch_record, strategy="zero1", model="uneven", workers=2, rank=1,
                kind="broadcast")
    assert (zero1["measured_bytes"], zero1["measured_calls"]) == (4 * 2606, 6)
    # FSDP2 under the bf16 policy gathers bf16 shards: 2 x 728 x 2 passes x 2 bytes on 4 ranks.
    bf16 = one(pytorch_record, strategy="fsdp2-bf16", model="uneven", workers=4, rank=0,
               kind="all_gather")
    assert (bf16["measured_bytes"], bf16["measured_calls"]) == (2 * 2 * 728, 6)
    # HSDP on a 2 x 2 mesh, 4 x Linear(64, 64): every rank all-reduces each layer's 4,160
    # gradients in its pair (gloo's reduce-scatter) and then its 2,080-element shard across the
    # pairs: 4 x (4,160 + 2,080) fp32 elements in 8 calls; it gathers 2 x 4 shards of 2,080.
    hsdp = {kind: one(pytorch_record, strategy="hsdp", model="even", workers=4, rank=1, kind=kind)
            for kind in ("all_reduce", "all_gather")}
    assert (hsdp["all_reduce"]["measured_bytes"], hsdp["all_reduce"]["measured_calls"]) == (
        4 * 4 * (4160 + 2080), 8)
    assert (hsdp["all_gather"]["measured_bytes"], hsdp["all_gather"]["measured_calls"]) == (
        4 * 8 * 2080, 8)
    assert set(pytorch_record[pytorch_record["strategy"] == "hsdp"]["workers"]) == {4}


def test_what_the_deepspeed_runs_show(deepspeed_record):
    def gathers(strategy):
        row = one(deepspeed_record, strategy=strategy, precision="bf16", model="even",
                  workers=4, rank=2, kind="all_gather")
        return row["measured_calls"], row["measured_bytes"]
    # 1,837,312 bf16 elements on 4 ranks: a pass hands 459,328 elements (918,656 bytes).
    assert gathers("stage1") == (1, 918_656) == gathers("stage2")
    assert gathers("stage3") == (4, 918_656)              # one pass: the model stays gathered
    assert gathers("stage3-release") == (6, 2 * 918_656)  # the paper's two passes, per layer
    stage2 = one(deepspeed_record, strategy="stage2", precision="bf16", model="even", workers=4,
                 rank=0, kind="all_reduce")
    # The whole bf16 gradient all-reduced, plus a 4-byte norm and a 1-byte overflow flag.
    assert (stage2["measured_calls"], stage2["measured_bytes"]) == (3, 2 * 1_837_312 + 4 + 1)


# --- the command -------------------------------------------------------------------------------


def test_without_torch_says_how_to_install_torch(capsys, monkeypatch):
    # torch is checked first, for either engine: hidden here whether or not it is installed.
    monkeypatch.setitem(sys.modules, "torch", None)
    status, out, err = run(capsys, "validate-communication")
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "torch is not installed" in err and "torch==2.13.0" in err
    status, out, err = run(capsys, "validate-communication", "--engine", "deepspeed")
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "torch is not installed" in err and "torch==2.13.0" in err and "DS_BUILD_OPS=0" in err


def test_with_torch_but_without_deepspeed_says_how_to_install_deepspeed(capsys, monkeypatch):
    # A stand-in torch, so the check reaches deepspeed on a machine without torch too.
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    monkeypatch.setitem(sys.modules, "deepspeed", None)
    status, out, err = run(capsys, "validate-communication", "--engine", "deepspeed")
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "deepspeed is not installed" in err and "DS_BUILD_OPS=0" in err


@pytest.mark.parametrize("argv", [["--workers", "1"], ["--engine", "jax"], ["--format", "xml"],
                                  ["--workers", "9"]])
def test_bad_options_are_one_line(capsys, argv):
    status, out, err = run(capsys, "validate-communication", *argv)
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1


@pytest.mark.torch
@pytest.mark.slow
def test_pytorch_rerun_matches_the_record(pytorch_record, capsys, tmp_path, monkeypatch):
    optional_import("torch", "pip install torch==2.13.0")
    from zerolib.crosscheck.validation import comm_run

    workers = tuple(int(w) for w in sorted(pytorch_record["workers"].unique()))
    fresh = comm_run.validate_communication(workers)
    found = differences(pytorch_record, fresh)
    assert found == [], (f"{COMMUNICATION_PYTORCH_FILE} no longer matches (re-record with "
                         "`zerolib validate-communication --record` and explain the change):\n"
                         + "\n".join(found))
    monkeypatch.setattr(comm_run, "validate_communication", lambda workers: fresh)
    status, out, err = run(capsys, "validate-communication", "--record", "--data-dir",
                               str(tmp_path))
    assert status == 0 and "Rows with unexplained bytes or calls: 0 of 272" in out
    assert (tmp_path / COMMUNICATION_PYTORCH_FILE).read_text() == to_csv_text(fresh)
