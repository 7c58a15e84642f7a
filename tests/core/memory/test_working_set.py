"""The working set on top of persistent model state: terms, peak, feasibility, bad input.

Expected values are derived by hand from the assumptions each term states (DeepSpeed and
PyTorch defaults, Korthikanti's term list), written out below.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from zerolib.core.catalogue.models import MODELS, largest_layer, parameter_count
from zerolib.core.estimate import estimate
from zerolib.core.memory.working_set import (
    TERMS,
    WorkingSetSettings,
    fewest_gpus_for_peak,
    largest_micro_batch,
    peak,
    peak_fits,
    stage_rows,
    working_set,
)
from zerolib.core.units import GiB

LLAMA_2_7B = 6_738_415_616
GPT2 = 124_439_808
DEFAULT = WorkingSetSettings()


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("gpus", [1, 8, 64])
def test_persistent_state_is_unchanged_by_the_working_set(name, gpus):
    params = {"gpt2": GPT2, "llama-2-7b": LLAMA_2_7B}.get(name)
    rows = stage_rows(name, gpus, settings=WorkingSetSettings(seq_len=512))
    plain = estimate(parameter_count(name), gpus).as_dict()["stages"]
    for row, core in zip(rows, plain, strict=True):
        for key in ("stage", "parameters", "gradients", "optimizer", "total", "cluster_total"):
            assert row[key] == core[key]
        assert row["peak"] == core["total"] + sum(row["working_set"].values())
    if params is not None:   # and against the ZeRO arithmetic written out: 16 bytes at stage 0
        assert rows[0]["total"] == 16 * params


def test_every_stage_has_every_term():
    for stage in range(4):
        assert tuple(working_set("gpt2", stage, WorkingSetSettings(seq_len=1024))) == TERMS


def test_stage_terms_follow_the_defaults():
    s = WorkingSetSettings(seq_len=1024)
    ws = [working_set("gpt2", stage, s) for stage in range(4)]
    # Stage 0: PyTorch DDP without bucket views holds a second copy of the 2-byte gradients.
    assert ws[0]["ddp_buckets"] == 2 * GPT2
    assert ws[0]["reduce_bucket"] == ws[0]["gathered_parameters"] == 0
    # Stages 1-3: DeepSpeed allocates the whole 5e8-element, 2-byte reduce bucket, even for a
    # model of 124M parameters.
    for stage in (1, 2, 3):
        assert ws[stage]["reduce_bucket"] == 1_000_000_000
        assert ws[stage]["ddp_buckets"] == 0
    # The all-gather of updated parameters happens in place (DeepSpeed 0.19.8).
    assert ws[1]["allgather_bucket"] == ws[2]["allgather_bucket"] == 0
    # Stage 3 gathers at most the model (124M < max_live_parameters = 1e9), in 2 bytes.
    assert ws[3]["gathered_parameters"] == 2 * GPT2
    assert ws[1]["gathered_parameters"] == ws[2]["gathered_parameters"] == 0
    assert all(w["reserve"] == 2 * GiB for w in ws)
    # Activations and logits do not depend on the stage.
    assert len({(w["activations"], w["logits_loss"]) for w in ws}) == 1


def test_stage3_gathered_parameters_bound():
    # Llama-2-7B: max(max_live 1e9, largest module 131,072,000 + prefetch 5e7) = 1e9 elements.
    assert working_set("llama-2-7b", 3)["gathered_parameters"] == 2 * 1_000_000_000
    # With a small live budget the module being run plus one prefetch bucket remains.
    small = dataclasses.replace(DEFAULT, max_live_parameters=0)
    assert working_set("llama-2-7b", 3, small)["gathered_parameters"] == 2 * (131_072_000 + 50_000_000)
    # fp32 parameters (fp32-adam layout) gather 4 bytes each.
    assert working_set("llama-2-7b", 3, small, "fp32-adam")["gathered_parameters"] == 4 * 181_072_000


def test_bucket_switches():
    overlap = dataclasses.replace(DEFAULT, overlap_comm=True)
    assert working_set("llama-2-7b", 2, overlap)["reduce_bucket"] == 2 * 1_000_000_000
    assert working_set("llama-2-7b", 3, overlap)["reduce_bucket"] == 1_000_000_000  # one buffer
    staged = dataclasses.replace(DEFAULT, allgather_in_place=False)
    assert working_set("llama-2-7b", 1, staged)["allgather_bucket"] == 2 * 500_000_000
    assert working_set("gpt2", 1, dataclasses.replace(staged, seq_len=1024))["allgather_bucket"] == 2 * GPT2
    view = dataclasses.replace(DEFAULT, ddp_gradient_as_bucket_view=True)
    assert working_set("llama-2-7b", 0, view)["ddp_buckets"] == 0
    # The reduce bucket is in the gradient width: 4 bytes with fp32 gradients.
    assert working_set("llama-2-7b", 1, layout="bf16-fp32-grads")["reduce_bucket"] == 4 * 500_000_000
    assert working_set("llama-2-7b", 0, layout="bf16-fp32-grads")["ddp_buckets"] == 4 * LLAMA_2_7B
    assert working_set("llama-2-7b", 2, dataclasses.replace(DEFAULT, reserve_bytes=0))["reserve"] == 0


@pytest.mark.parametrize("stage", range(4))
def test_activations_are_linear_in_micro_batch(stage):
    one = working_set("llama-3-8b", stage, dataclasses.replace(DEFAULT, micro_batch=1))
    four = working_set("llama-3-8b", stage, dataclasses.replace(DEFAULT, micro_batch=4))
    for term in TERMS:
        expected = 4 * one[term] if term in ("activations", "logits_loss") else one[term]
        assert four[term] == expected


def test_flash_and_recomputation_shrink_activations():
    s = dataclasses.replace(DEFAULT, seq_len=4096)
    slow = working_set("llama-2-7b", 3, dataclasses.replace(s, flash_attention=False))["activations"]
    fast = working_set("llama-2-7b", 3, s)["activations"]
    # The s x s softmax output (2 bytes, no dropout): 32 layers x 2 * 32 heads * 4096^2, minus
    # the flash log-sum-exp it replaces (32 layers x 4 * 32 * 4096).
    assert slow - fast == 32 * (2 * 32 * 4096 * 4096 - 4 * 32 * 4096)
    by_mode = {m: working_set("llama-2-7b", 3, dataclasses.replace(s, recompute=m))["activations"]
               for m in ("none", "selective", "full")}
    assert by_mode["full"] < by_mode["selective"] < by_mode["none"]


def test_llama_2_7b_largest_micro_batch_by_hand():
    # Stage 3 on 8 x A100 80GB, 4096 tokens, selective recomputation, flash attention, bf16.
    s, h, f, a, v, L = 4096, 4096, 11008, 32, 32000, 32
    sbh, sbf = s * h, s * f
    per_layer = 16 * sbh + 8 * sbf          # no dropout; selective keeps no attention core
    per_sequence = (L * per_layer + 4 * a * s      # + the recomputed core: flash log-sum-exp
                    + 2 * sbh + 2 * sbh            # final norm input, output projection input
                    + (2 + 4) * s * v)             # bf16 logits + fp32 copy
    persistent = 16 * -(-LLAMA_2_7B // 8)
    constant = 1_000_000_000 + 2 * 1_000_000_000 + 2 * GiB   # reduce bucket, gathered, reserve
    expected = (80 * GiB - persistent - constant) // per_sequence
    settings = WorkingSetSettings(seq_len=4096, recompute="selective")
    assert largest_micro_batch("llama-2-7b", 8, 3, settings, device="a100-80gb") == expected
    assert expected >= 1


@pytest.mark.parametrize("model, stage, device", [
    ("llama-2-7b", 1, "a100-80gb"), ("llama-2-7b", 3, "a100-40gb"), ("llama-3-8b", 2, "h100-80gb"),
    ("gpt2", 0, "rtx4090-24gb"), ("qwen2.5-7b", 3, "v100-32gb"),
])
def test_searches_are_tight(model, stage, device):
    settings = WorkingSetSettings(seq_len=1024, recompute="selective")
    fewest = fewest_gpus_for_peak(model, stage, settings, device=device, max_gpus=4096)
    assert fewest is not None
    assert peak_fits(model, fewest, stage, settings, device=device)
    if fewest > 1:
        assert not peak_fits(model, fewest - 1, stage, settings, device=device)
    batch = largest_micro_batch(model, fewest, stage, settings, device=device)
    assert batch >= 1
    bigger = dataclasses.replace(settings, micro_batch=batch + 1)
    assert peak_fits(model, fewest, stage, dataclasses.replace(settings, micro_batch=batch), device=device)
    assert not peak_fits(model, fewest, stage, bigger, device=device)


def test_searches_report_what_never_fits():
    # Plain data parallelism replicates 16 bytes per parameter: 70B never fits on 80 GB.
    assert fewest_gpus_for_peak("llama-2-70b", 0, device="h100-80gb", max_gpus=1024) is None
    # 7B under stage 0 needs 107.8 GB of state alone: not even one sequence fits.
    assert largest_micro_batch("llama-2-7b", 64, 0, device="a100-80gb") == 0


def test_working_set_makes_stages_need_more_gpus_than_state_alone():
    from zerolib.core.memory.feasibility import fewest_gpus as state_only
    settings = WorkingSetSettings(seq_len=8192, recompute="full")
    # Stage 1 replicates 2 + 2 bytes per parameter: 4 x 8,030,261,248 = 32,121,044,992 B of the
    # 40 GiB = 42,949,672,960 B, leaving 10,828,627,968 B. Part of the working set alone is more:
    # logits 6 B x 8192 x 128,256 = 6,303,842,304, layer inputs 32 x 2 B x 8192 x 4096 =
    # 2,147,483,648, reduce bucket 1e9, reserve 2 GiB: 11,599,006,208 B. It never fits, whereas
    # the state alone fits from 9 GPUs on (12 P / N <= 10,828,627,968 needs N >= 8.9).
    assert fewest_gpus_for_peak("llama-3-8b", 1, settings, device="a100-40gb", max_gpus=4096) is None
    assert state_only(8_030_261_248, 1, device="a100-40gb", max_gpus=4096) == 9
    for stage in (2, 3):
        with_ws = fewest_gpus_for_peak("llama-3-8b", stage, settings, device="a100-40gb", max_gpus=4096)
        alone = state_only(8_030_261_248, stage, device="a100-40gb", max_gpus=4096)
        assert with_ws > alone


def test_tensor_parallel_counts_gpus_in_multiples_and_shares_state():
    settings = WorkingSetSettings(seq_len=4096, tensor_parallel=8, sequence_parallel=True,
                                  recompute="selective")
    fewest = fewest_gpus_for_peak("llama-2-70b", 3, settings, device="h100-80gb", max_gpus=4096)
    assert fewest is not None and fewest % 8 == 0
    result = peak("llama-2-70b", 16, 3, settings)
    # One tensor-parallel rank of 8, by hand: a layer's matrices q, o 8192 x 8192, k, v 8192 x
    # 1024, gate/up/down 3 x 8192 x 28672 = 855,638,016 elements split 8 ways (106,954,752) plus
    # its two RMSNorms whole (16,384): 106,971,136 x 80 = 8,557,690,880; embedding and output
    # layer 32000 x 8192 / 8 = 32,768,000 each; the final norm whole, 8,192. Total
    # 8,623,235,072 (not 68,976,648,192 / 8: the norms are replicated), over 2 data-parallel
    # workers: 16 bytes x 4,311,617,536.
    assert result.persistent["total"] == 16 * 4_311_617_536
    with pytest.raises(ValueError, match="multiple of tensor_parallel"):
        peak("llama-2-70b", 12, 3, settings)


@pytest.mark.parametrize("change, error, name", [
    (dict(seq_len=0), ValueError, "seq_len"), (dict(seq_len=-1), ValueError, "seq_len"),
    (dict(micro_batch=1.5), ValueError, "micro_batch"), (dict(micro_batch=True), TypeError, "micro_batch"),
    (dict(recompute="some"), ValueError, "recompute"), (dict(tensor_parallel=0), ValueError, "tensor_parallel"),
    (dict(flash_attention="yes"), TypeError, "flash_attention"),
    (dict(reserve_bytes=-1), ValueError, "reserve_bytes"),
    (dict(reduce_bucket_size=2.5), ValueError, "reduce_bucket_size"),
    (dict(logits_bytes=(0,)), ValueError, "logits_bytes"),
    (dict(dropout="no"), TypeError, "dropout"),
])
def test_bad_settings_are_rejected(change, error, name):
    with pytest.raises(error, match=name):
        WorkingSetSettings(**change)


def test_bad_calls_are_rejected():
    with pytest.raises(ValueError, match="model must be one of"):
        working_set("llama-4", 3)
    with pytest.raises(ValueError, match="stage"):
        working_set("gpt2", 4, WorkingSetSettings(seq_len=128))
    with pytest.raises(ValueError, match="at most 1024"):
        working_set("gpt2", 3, WorkingSetSettings(seq_len=2048))      # learned positions
    with pytest.raises(ValueError, match="gpus"):
        peak("gpt2", 0, 3, WorkingSetSettings(seq_len=128))
    with pytest.raises(TypeError, match="settings"):
        working_set("gpt2", 3, {"seq_len": 128})
    with pytest.raises(TypeError, match="settings"):
        fewest_gpus_for_peak("gpt2", 3, {"seq_len": 128})
    with pytest.raises(TypeError, match="settings"):
        largest_micro_batch("gpt2", 8, 3, {"seq_len": 128})
    with pytest.raises(TypeError, match="stage"):
        working_set("gpt2", [1, 2], WorkingSetSettings(seq_len=128))
    with pytest.raises(ValueError, match="max_gpus"):
        fewest_gpus_for_peak("gpt2", 3, WorkingSetSettings(seq_len=128), max_gpus=0)
    with pytest.raises(ValueError, match="divide heads"):
        working_set("gpt2", 3, WorkingSetSettings(seq_len=128, tensor_parallel=5))
    with pytest.raises(ValueError, match="device"):
        peak_fits("gpt2", 1, 3, WorkingSetSettings(seq_len=128), device="tpu")


def test_peak_is_persistent_plus_working_set():
    result = peak("mistral-7b-v0.1", 16, 2, WorkingSetSettings(seq_len=8192, recompute="full"))
    # Stage 2, P = 7,241,732,096 = 16 x 452,608,256: 2 B x P + 14 B x P / 16.
    state_total = 2 * 7_241_732_096 + 14 * 452_608_256
    assert result.persistent["total"] == state_total == 20_819_979_776
    assert result.total == state_total + sum(result.working_set.values())
    assert np.all(np.array(list(result.working_set.values())) >= 0)


def test_peak_frame_is_tidy_and_adds_up_to_the_peak():
    from zerolib.core.memory.tables import peak_frame
    settings = WorkingSetSettings(seq_len=2048, recompute="selective")
    frame = peak_frame("llama-2-13b", 16, settings=settings)
    assert list(frame.columns) == ["model", "gpus", "stage", "strategy", "layer", "component", "bytes"]
    assert len(frame) == 4 * (3 + len(TERMS)) and str(frame["bytes"].dtype) == "int64"
    for stage, group in frame.groupby("stage"):
        assert group["bytes"].sum() == peak("llama-2-13b", 16, stage, settings).total
    # Persistent rows are the core's model state: 16 bytes per parameter at stage 0.
    stage0 = frame[(frame.stage == 0) & (frame.layer == "persistent")]["bytes"].sum()
    assert stage0 == 16 * 13_015_864_320


def test_fewest_gpus_over_several_stages_is_one_search():
    settings = WorkingSetSettings(seq_len=4096, recompute="selective")
    together = fewest_gpus_for_peak("llama-2-13b", [0, 1, 2, 3], settings, device="a100-80gb", max_gpus=4096)
    alone = [fewest_gpus_for_peak("llama-2-13b", s, settings, device="a100-80gb", max_gpus=4096) for s in range(4)]
    assert list(together) == [n or 0 for n in alone]


def test_largest_micro_batch_respects_its_cap():
    # GPT-2 small with 128 tokens on 1024 H200s: far more than 7 sequences fit; the cap answers.
    settings = WorkingSetSettings(seq_len=128)
    assert largest_micro_batch("gpt2", 1024, 3, settings, device="h200-141gb", max_micro_batch=7) == 7
    assert largest_micro_batch("gpt2", 1024, 3, settings, device="h200-141gb", max_micro_batch=1) == 1


def test_term_arrays_are_the_scalar_terms_everywhere():
    """The vectorised buffer terms (the planner's) equal working_set() setting by setting."""
    from dataclasses import replace

    from zerolib.core.memory.working_set import term_arrays, working_set
    base = WorkingSetSettings(seq_len=2048, micro_batch=2, recompute="selective")
    for settings in (base, replace(base, overlap_comm=True), replace(base, allgather_in_place=False),
                     replace(base, ddp_gradient_as_bucket_view=True, max_live_parameters=10**6)):
        for stage in range(4):
            want = working_set("llama-2-13b", stage, settings)
            params = parameter_count("llama-2-13b")
            got = term_arrays(np.array([stage, stage]), params, largest_layer("llama-2-13b"),
                              want["activations"], want["logits_loss"], settings, "mixed-adam")
            assert {k: int(v[0]) for k, v in got.items()} == dict(want)
