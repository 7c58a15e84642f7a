"""``zerolib validate``: real PyTorch runs against zerolib's arithmetic.

Without torch: the expected-value arithmetic is checked against numbers worked out by hand,
the recorded files in data/ are checked for shape and for explaining every difference, and the
command says how to install torch. With torch: the measurement is re-run and must still match
the recorded files.
"""
from __future__ import annotations

import json
import sys

import pandas as pd
import pytest
from cli_support import run
from conftest import REPO, optional_import

from zerolib.core.memory.activations import layer_activation_bytes
from zerolib.crosscheck.validation.effects import MECHANISMS
from zerolib.crosscheck.validation.explain_activations import (
    CASES,
    SHAPE,
    compare_activations,
    totals,
)
from zerolib.crosscheck.validation.explain_sharded import (
    compare_sharded,
    expected_effects,
)
from zerolib.crosscheck.validation.explain_tensor_parallel import (
    MEASURED_COLUMNS as PARALLEL_MEASURED_COLUMNS,
)
from zerolib.crosscheck.validation.explain_tensor_parallel import (
    compare_tensor_parallel,
)
from zerolib.crosscheck.validation.explain_tensor_parallel import (
    totals as parallel_totals,
)
from zerolib.crosscheck.validation.records import (
    ACTIVATIONS_FILE,
    SHARDED_FILE,
    SHIPPED_FILE,
    TENSOR_PARALLEL_FILE,
    VERSION_COLUMNS,
    differences,
    read_csv,
    to_csv_text,
    write_csv,
)
from zerolib.crosscheck.validation.setups import (
    STRATEGIES,
    TINY_MODELS,
    check_workers,
    fsdp_rows,
    zero1_partition,
)

DATA = REPO / "data"
TORCH_HINT = "pip install torch==2.13.0"
MEASURED_COLUMNS = ["strategy", "model", "workers", "rank", "phase", "category",
                    "measured_bytes", "storages", "sampled_at"]


@pytest.fixture(scope="module")
def sharded():
    return read_csv(DATA / SHARDED_FILE)


@pytest.fixture(scope="module")
def activations():
    return read_csv(DATA / ACTIVATIONS_FILE)


@pytest.fixture(scope="module")
def parallel():
    return read_csv(DATA / TENSOR_PARALLEL_FILE)


def rows(frame, **where):
    mask = pd.Series(True, index=frame.index)
    for column, value in where.items():
        mask &= frame[column] == value
    return frame[mask]


def one(frame, **where) -> dict:
    found = rows(frame, **where)
    assert len(found) == 1, where
    return found.iloc[0].to_dict()


# --- the arithmetic, by hand -------------------------------------------------------------------

def test_model_sizes_by_hand():
    assert TINY_MODELS["even"].numel == 4 * (64 * 64 + 64) == 16_640
    # Linear(33, 45) + Linear(45, 21) + Linear(21, 5)
    assert TINY_MODELS["uneven"].numel == (45 * 33 + 45) + (21 * 45 + 21) + (5 * 21 + 5) == 2_606
    assert TINY_MODELS["uneven"].tensor_count == 6
    assert TINY_MODELS["uneven"].largest_layer_params == 45 * 33 + 45 == 1_530


def test_fsdp_chunks_like_torch_chunk():
    # 45 rows on 4 ranks: chunks of ceil(45/4) = 12 rows -> 12, 12, 12, 9; all padded to 12.
    assert [fsdp_rows(45, 4, r) for r in range(4)] == [(12, 12), (12, 12), (12, 12), (9, 12)]
    # 5 rows on 4 ranks: chunks of 2 -> 2, 2, 1 and an empty fourth shard.
    assert [fsdp_rows(5, 4, r) for r in range(4)] == [(2, 2), (2, 2), (1, 2), (0, 2)]
    assert [fsdp_rows(64, 4, r) for r in range(4)] == [(16, 16)] * 4


def test_zero1_partition_by_hand():
    shapes = TINY_MODELS["uneven"].shapes  # sizes 1485, 45, 945, 21, 105, 5
    # Largest first to the least-loaded rank: 1485->0, 945->1, 105->2, 45->3, 21->3, 5->3.
    assert zero1_partition(shapes, 4) == ((0,), (2,), (4,), (1, 3, 5))
    # Two ranks: 1485->0, then everything else to rank 1 (945+105+45+21+5 = 1121 < 1485).
    assert zero1_partition(shapes, 2) == ((0,), (1, 2, 3, 4, 5))
    # Even model: 4 weights of 4096 and 4 biases of 64 split evenly.
    assert zero1_partition(TINY_MODELS["even"].shapes, 4) == ((0, 1), (2, 3), (4, 5), (6, 7))


def test_effects_by_hand_fsdp_uneven_last_rank():
    spec, strategy = TINY_MODELS["uneven"], STRATEGIES["fsdp2-reshard"]
    # Rank 3 of 4 holds 9 + 3 + 0 rows: 9*33 + 9 + 3*45 + 3 = 444 elements; ceil(2606/4) = 652.
    effects = {e.key: e.bytes for e in expected_effects(strategy, spec, 4, 3, "rest", "optimizer")}
    assert effects == {"uneven-shards": 8 * (444 - 652), "step-counters": 6 * 4}
    # Padded shards: 12*33 + 12 + 6*45 + 6 + 2*21 + 2 = 728 elements on every rank.
    effects = {e.key: e.bytes for e in expected_effects(strategy, spec, 4, 3, "peak", "parameters")}
    # Layer 0 gathered: 4 ranks x (12*33 + 12) = 1632 fp32 elements.
    assert effects == {"shard-padding": 4 * (728 - 652), "gathered-layer": 4 * 1632}


def test_effects_by_hand_stage2_analogue_at_rest():
    spec = TINY_MODELS["even"]
    effects = {e.key: e.bytes for e in
               expected_effects(STRATEGIES["fsdp2-keep"], spec, 4, 0, "rest", "parameters")}
    # ZeRO-2 would keep all 16,640 parameters; FSDP2 keeps a 4,160-element shard.
    assert effects == {"resharded-after-backward": 4 * (4_160 - 16_640)}


def test_hsdp_effects_by_hand():
    spec, hsdp = TINY_MODELS["uneven"], STRATEGIES["hsdp"]
    # Shard group of 2 inside 4 ranks: rank 3 is place 1 of its pair. Rows 45, 21, 5 in chunks of
    # 23, 11, 3: place 1 holds 22, 10, 2 rows = 22*34 + 10*46 + 2*22 = 1,252 elements, padded to
    # 23*34 + 11*46 + 3*22 = 1,354; ceil(2,606 / 2) = 1,303.
    assert (hsdp.shards(4), hsdp.shard_rank(3)) == (2, 1)
    effects = {e.key: e.bytes for e in expected_effects(hsdp, spec, 4, 3, "rest", "optimizer")}
    assert effects == {"uneven-shards": 8 * (1_252 - 1_303), "step-counters": 6 * 4}
    effects = {e.key: e.bytes for e in expected_effects(hsdp, spec, 4, 3, "rest", "parameters")}
    assert effects == {"shard-padding": 4 * (1_354 - 1_303)}
    # Peak: layer 0 gathered within the pair, 2 x (23*33 + 23) = 1,564 fp32 elements.
    effects = {e.key: e.bytes for e in expected_effects(hsdp, spec, 4, 3, "peak", "parameters")}
    assert effects == {"shard-padding": 4 * (1_354 - 1_303), "gathered-layer": 4 * 1_564}
    assert [s.runs_on(w) for s in [hsdp] for w in (2, 3, 4, 6, 8)] == [False, False, True, True, True]


def test_recorded_hsdp_is_fsdp2_on_half_the_ranks_replicated(sharded):
    """Each HSDP rank holds, byte for byte, what the same place holds under FSDP2 on 2 ranks;
    the two replicas of a shard (ranks r and r + 2) hold the same."""
    for model in TINY_MODELS:
        for rank in range(4):
            for phase in ("rest", "peak"):
                for category in ("parameters", "gradients", "optimizer"):
                    hsdp = one(sharded, strategy="hsdp", model=model, workers=4, rank=rank,
                               phase=phase, category=category)
                    fsdp = one(sharded, strategy="fsdp2-reshard", model=model, workers=2,
                               rank=rank % 2, phase=phase, category=category)
                    assert hsdp["measured_bytes"] == fsdp["measured_bytes"], (model, rank, phase)
                    assert hsdp["predicted_bytes"] == fsdp["predicted_bytes"]
    # even model: 16,640 / 2 = 8,320 elements per rank at rest, 4 B each.
    row = one(sharded, strategy="hsdp", model="even", workers=4, rank=2, phase="rest",
              category="parameters")
    assert row["measured_bytes"] == row["predicted_bytes"] == 4 * 8_320


def test_bad_effect_arguments_are_named():
    with pytest.raises(ValueError, match="phase"):
        expected_effects(STRATEGIES["ddp"], TINY_MODELS["even"], 2, 0, "during", "optimizer")
    with pytest.raises(ValueError, match="category"):
        expected_effects(STRATEGIES["ddp"], TINY_MODELS["even"], 2, 0, "rest", "activations")


def test_check_workers():
    assert check_workers([4, 2, 4]) == (2, 4)
    for bad in ([1], [9], [], [True], [2.0]):
        with pytest.raises(ValueError, match="workers"):
            check_workers(bad)
    with pytest.raises(TypeError, match="workers"):
        check_workers(4)


def test_table2_case_is_korthikanti_by_hand():
    s, b, h, a = SHAPE.seq_len, SHAPE.micro_batch, SHAPE.hidden, SHAPE.heads
    by_hand = s * b * h * 34 + 5 * a * s * s * b  # Table 2, no parallelism: 2-byte values
    table2 = next(case for case in CASES if case.name == "table2")
    assert sum(table2.formula_terms(SHAPE).values()) == by_hand == 442_368
    for case in CASES:  # the per-term list the comparison uses sums to zerolib's total
        assert sum(case.formula_terms(SHAPE).values()) == layer_activation_bytes(
            s, b, h, a, recompute=case.recompute, flash_attention=case.flash_attention,
            element_bytes=case.element_bytes, mask_bytes=1, dropout=True)


# --- the recorded files (no torch needed) ------------------------------------------------------

def test_recorded_files_are_tidy_and_stamped(sharded, activations, parallel):
    workers = sorted(sharded["workers"].unique())
    assert workers == [2, 4]
    # Per rank: models x phases x categories for each strategy that runs on that many ranks
    # (HSDP's shard group of 2 needs at least two groups: 4 ranks, not 2).
    assert [s.name for s in STRATEGIES.values() if not s.runs_on(2)] == ["hsdp"]
    per_rank_rows = {w: sum(s.runs_on(w) for s in STRATEGIES.values()) * len(TINY_MODELS) * 2 * 3
                     for w in workers}
    assert len(sharded) == sum(per_rank_rows[w] * w for w in workers) == 408
    keys = ["strategy", "model", "workers", "rank", "phase", "category"]
    assert not sharded.duplicated(keys).any()
    for frame in (sharded, activations, parallel):
        for column in VERSION_COLUMNS:
            assert frame[column].nunique() == 1 and frame[column].iloc[0] != ""
    assert set(activations["case"]) == {case.name for case in CASES}
    assert sorted(parallel.groupby("workers")["rank"].nunique().items()) == [(2, 2), (4, 4)]


def test_recorded_files_are_written_deterministically(sharded, activations, parallel):
    for frame, name in ((sharded, SHARDED_FILE), (activations, ACTIVATIONS_FILE),
                        (parallel, TENSOR_PARALLEL_FILE)):
        assert to_csv_text(frame) == (DATA / name).read_text(encoding="utf-8")


def test_recorded_comparison_follows_from_recorded_measurements(sharded, activations, parallel):
    """Re-deriving predictions and explanations from the measured columns rewrites the files."""
    fresh = compare_sharded(sharded[MEASURED_COLUMNS])
    assert differences(sharded, fresh) == []
    measured = activations[activations["item"] != "(not saved by PyTorch)"]
    fresh = compare_activations(measured[["case", "item", "saved_dtype", "saved_shape",
                                          "measured_bytes"]])
    assert differences(activations, fresh) == []
    measured = parallel[parallel["item"] != "(not saved by PyTorch)"]
    assert differences(parallel, compare_tensor_parallel(measured[PARALLEL_MEASURED_COLUMNS])) == []


def test_every_difference_is_explained(sharded, activations, parallel):
    for frame in (sharded, activations, parallel):
        assert (frame["unexplained_bytes"] == 0).all(), frame[frame["unexplained_bytes"] != 0]
        assert not frame["explanation"].str.contains("UNEXPLAINED").any()
        differing = frame[frame["difference_bytes"] != 0]
        assert (differing["effects"] != "").all()
        used = {key for text in frame["effects"] for key in text.split()}
        assert used <= set(MECHANISMS)


def test_stage3_even_model_at_rest_matches_within_step_counters(sharded):
    rest = rows(sharded, strategy="fsdp2-reshard", model="even", phase="rest")
    assert len(rest) == 3 * (2 + 4)
    for row in rest.to_dict("records"):
        # 4,160 or 8,320 elements per rank: exactly 4 B and 4 B per element, and 8 B of AdamW
        # state plus eight 4-byte step counters.
        share = 16_640 // row["workers"]
        expected = {"parameters": 4 * share, "gradients": 4 * share,
                    "optimizer": 8 * share + 8 * 4}[row["category"]]
        assert row["measured_bytes"] == expected
        assert abs(row["relative_difference"]) < 0.002


def test_uneven_model_shows_padding_and_imbalance(sharded):
    # FSDP2, 4 ranks: every rank holds 728 padded elements, 4 B each, against ceil(2606/4) = 652.
    for rank in range(4):
        row = one(sharded, strategy="fsdp2-reshard", model="uneven", workers=4, rank=rank,
                  phase="rest", category="parameters")
        assert row["measured_bytes"] == 4 * 728 and row["predicted_bytes"] == 4 * 652
        assert row["effects"] == "shard-padding"
    # ZeroRedundancyOptimizer, 4 ranks: rank 0 owns the 1485-element weight alone (+1 counter),
    # rank 3 three small tensors (45 + 21 + 5 elements, 3 counters).
    first = one(sharded, strategy="zero1", model="uneven", workers=4, rank=0, phase="rest",
                category="optimizer")
    last = one(sharded, strategy="zero1", model="uneven", workers=4, rank=3, phase="rest",
               category="optimizer")
    assert first["measured_bytes"] == 8 * 1485 + 4 and last["measured_bytes"] == 8 * 71 + 3 * 4
    assert first["measured_bytes"] > first["predicted_bytes"] > last["measured_bytes"]


def test_rest_and_peak_differ_where_parameters_are_gathered(sharded):
    def params(strategy, phase):
        return one(sharded, strategy=strategy, model="even", workers=4, rank=0, phase=phase,
                   category="parameters")["measured_bytes"]

    # At rest both FSDP2 analogues hold only shards (16,640 / 4 elements x 4 B).
    assert params("fsdp2-keep", "rest") == params("fsdp2-reshard", "rest") == 16_640
    # Peak: all four layers gathered beside the shards, or one layer at a time (in bf16 too).
    assert params("fsdp2-keep", "peak") == 16_640 + 4 * 16_640
    assert params("fsdp2-reshard", "peak") == 16_640 + 4 * 4_160
    assert params("fsdp2-bf16", "peak") == 16_640 + 2 * 4_160
    assert params("ddp", "peak") == params("ddp", "rest") == 4 * 16_640


def test_recorded_activations(activations):
    summary = totals(activations).set_index("case")
    s, b, h = SHAPE.seq_len, SHAPE.micro_batch, SHAPE.hidden
    norm_stats = 2 * 2 * s * b  # two LayerNorms, mean and 1/std, one value per token
    assert summary.at["table2", "formula_bytes"] == 442_368
    assert summary.at["table2", "measured_bytes"] == 442_368 + 2 * norm_stats
    assert summary.at["full", "measured_bytes"] == 2 * s * b * h  # the block's input only
    assert summary.at["full", "formula_bytes"] == 2 * s * b * h
    # CPU F.dropout keeps 2-byte noise where Table 2 has 1-byte masks: one more byte per element
    # of the attention mask (a s^2 b) and of the two sbh masks.
    extra = SHAPE.heads * s * s * b + 2 * s * b * h
    assert (summary.at["cpu-dropout", "measured_bytes"]
            == summary.at["table2", "measured_bytes"] + extra)
    mask = one(activations, case="table2", item="attention dropout mask")
    assert mask["saved_dtype"] == "bool" and mask["measured_bytes"] == SHAPE.heads * s * s * b


def test_recorded_tensor_parallel_parameters_by_hand(parallel):
    # Tiny Llama, hidden 64, 8 heads (head_dim 8), 4 key/value heads, MLP 160, vocabulary 250,
    # 2 layers, bf16. On 2 ranks a layer holds q and o 64 x 64 / 2 (2,048 each), k and v 64 x 32 / 2
    # (1,024 each), gate/up/down 3 x 64 x 160 / 2 = 15,360, two norms whole (128): 21,632; x 2
    # layers, plus embedding and output layer 125 x 64 each and the final norm (64): 59,328
    # elements, 118,656 bytes. On 4 ranks: 2 x 10,880 + 2 x 63 x 64 + 64 = 29,888 elements.
    totals = parallel_totals(parallel).set_index(["workers", "rank", "kind"])
    assert totals.at[(2, 0, "parameters"), "measured_bytes"] == 2 * 59_328 == 118_656
    for rank in range(4):
        assert totals.at[(4, rank, "parameters"), "measured_bytes"] == 2 * 29_888
    # Rank 3 of 4 holds 61 of the 250 vocabulary rows (chunks of 63), in a 63-row storage.
    row = one(parallel, kind="parameters", workers=4, rank=3, item="embedding")
    assert row["shape"] == "61x64" and row["measured_bytes"] == 2 * 63 * 64
    assert row["effects"] == "uneven-vocabulary-shard padded-shard-storage"


def test_recorded_tensor_parallel_activations_by_hand(parallel):
    # One block on 4 ranks, s = 32, b = 2, bf16: norm inputs and projection inputs whole (4 x 2 x
    # 4,096 = 32,768), Q and the attention output's input split (2 x 2,048), K and V one key/value
    # head each (2 x 1,024), fp32 log-sum-exp 4 x 2 heads x 64 tokens = 512, four SwiGLU tensors
    # 2 x 64 x 40 = 5,120 each: 59,904. PyTorch's rms_norm adds per norm an fp32 input copy
    # (+2 x 4,096), the fp32 normalised values (4 x 4,096) and 64 fp32 1/rms: 2 x 24,832.
    totals = parallel_totals(parallel).set_index(["workers", "rank", "kind"])
    for rank in range(4):
        assert totals.at[(4, rank, "activations"), "formula_bytes"] == 59_904
        assert totals.at[(4, rank, "activations"), "measured_bytes"] == 59_904 + 2 * 24_832
    key = one(parallel, kind="activations", workers=4, rank=0, item="key (rotated)")
    assert key["shape"] == "2x1x32x8" and key["measured_bytes"] == 1_024


# --- records -----------------------------------------------------------------------------------

def test_write_csv_is_atomic_and_deterministic(tmp_path):
    frame = pd.DataFrame({"b": [2, 1], "relative_difference": [1 / 3, -0.5]})
    path = write_csv(frame, tmp_path / "out" / "x.csv")
    first = path.read_bytes()
    assert first == b"b,relative_difference\n2,0.333333\n1,-0.500000\n"
    write_csv(frame, path)
    assert path.read_bytes() == first
    assert [p.name for p in path.parent.iterdir()] == ["x.csv"]  # no temporary left behind


def test_differences_name_the_changed_row():
    old = pd.DataFrame({"a": [1, 2], "torch_version": ["1", "1"]})
    assert differences(old, old.assign(torch_version="2")) == []  # versions aside
    found = differences(old, pd.DataFrame({"a": [1, 3], "torch_version": ["1", "1"]}))
    assert len(found) == 1 and "2" in found[0] and "3" in found[0]


# --- the command -------------------------------------------------------------------------------

def test_without_torch_says_how_to_install(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    status, out, err = run(capsys, "validate")
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert "pip install -e '.[validate]'" in err and "torch==2.13.0" in err


@pytest.mark.parametrize("argv", [["--workers", "1"], ["--workers", "9"], ["--workers", "two"],
                                  ["--format", "xml"]])
def test_bad_options_are_one_line(capsys, argv):
    status, out, err = run(capsys, "validate", *argv)
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


# --- with torch: the run itself ----------------------------------------------------------------

@pytest.fixture(scope="module")
def fresh_run(sharded):
    optional_import("torch", TORCH_HINT)
    optional_import("transformers", "install the validate extra: pip install -e '.[validate]'")
    from zerolib.crosscheck.validation.runner import validate

    return validate(tuple(int(w) for w in sorted(sharded["workers"].unique())))


@pytest.mark.torch
@pytest.mark.slow
def test_rerun_matches_recorded_files(fresh_run, sharded, activations, parallel):
    hint = "re-record with `zerolib validate --record` and explain the change"
    found = differences(sharded, fresh_run.sharded)
    assert found == [], f"{SHARDED_FILE} no longer matches ({hint}):\n" + "\n".join(found)
    found = differences(activations, fresh_run.activations)
    assert found == [], f"{ACTIVATIONS_FILE} no longer matches ({hint}):\n" + "\n".join(found)
    found = differences(parallel, fresh_run.tensor_parallel)
    assert found == [], f"{TENSOR_PARALLEL_FILE} no longer matches ({hint}):\n" + "\n".join(found)


@pytest.mark.torch
@pytest.mark.slow
def test_cli_prints_and_records(fresh_run, capsys, monkeypatch, tmp_path):
    import zerolib.crosscheck.validation.runner as runner

    monkeypatch.setattr(runner, "validate", lambda workers: fresh_run)  # measured once above
    status, out, err = run(capsys, "validate", "--record", "--data-dir", str(tmp_path))
    assert status == 0
    assert "Rows with unexplained bytes: 0 of 408" in out and "norm-statistics:" in out
    assert "Rows with unexplained bytes: 0 of 174" in out and "padded-shard-storage:" in out
    assert (tmp_path / SHARDED_FILE).read_text() == to_csv_text(fresh_run.sharded)
    assert (tmp_path / ACTIVATIONS_FILE).read_text() == to_csv_text(fresh_run.activations)
    assert (tmp_path / SHIPPED_FILE).read_text() == to_csv_text(fresh_run.shipped)
    assert (tmp_path / TENSOR_PARALLEL_FILE).read_text() == to_csv_text(fresh_run.tensor_parallel)
    assert err.count("recorded ") == 4
    status, out, _ = run(capsys, "validate", "--format", "json")
    result = json.loads(out)
    assert len(result["sharded"]) == 408
    assert {row["case"] for row in result["activation_totals"]} == {case.name for case in CASES}
    assert len(result["tensor_parallel"]) == 174 and len(result["tensor_parallel_totals"]) == 12
