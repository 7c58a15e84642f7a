"""The will-it-fit layer with tensor and pipeline parallelism: exact per-GPU parameters, the
activations a pipeline stage keeps in flight, the most-loaded stage, and the CLI flags."""
from __future__ import annotations

import json

import pytest
from cli_support import run

from zerolib.core.catalogue.devices import get_device
from zerolib.core.memory.accounting import model_state
from zerolib.core.memory.working_set import (
    WorkingSetSettings,
    fewest_gpus_for_peak,
    peak,
    peaks,
    working_set,
)

# Llama-2-70B on 8 x 4 x 2 = 64 GPUs, sequence parallel, selective recomputation, flash.
SETTINGS = WorkingSetSettings(seq_len=4096, tensor_parallel=8, pipeline_parallel=4,
                              sequence_parallel=True, recompute="selective")
SBH_T = 4096 * 8192 // 8          # s b h / t, b = 1
FIRST_PARAMS = 2_172_190_720      # 20 x 106,971,136 + 32,768,000 (see test_model_parallel)
LAST_PARAMS = FIRST_PARAMS + 8192  # the output layer instead of the embedding, plus the final norm


def test_first_stage_decides_and_holds_p_micro_batches():
    result = peak("llama-2-70b", 64, 1, SETTINGS)
    assert result.pipeline_stage == 0
    assert result.persistent["total"] == int(model_state(FIRST_PARAMS, 2, 1).total)
    # Per layer 40.5 sbh/t (the Llama block under SP + selective: test_megatron_theoretical_memory), 4
    # micro-batches x 20 layers in flight, plus one layer's fp32 log-sum-exp recomputed.
    assert result.working_set["activations"] == 80 * 81 * SBH_T // 2 + 4 * 64 * 4096 // 8
    assert result.working_set["logits_loss"] == 0           # the logits are on the last stage
    # DDP buckets and the gradient width follow this GPU's own parameters.
    assert peak("llama-2-70b", 64, 0, SETTINGS).working_set["ddp_buckets"] == 2 * FIRST_PARAMS


def test_the_last_stage_holds_the_logits_and_one_micro_batch():
    last = working_set("llama-2-70b", 1, SETTINGS, pipeline_stage=3)
    # 20 layers of one micro-batch; logits 2 + 4 bytes x 4096 tokens x 32000 / 8 vocabulary rows.
    assert last["logits_loss"] == 6 * 4096 * 4000
    assert last["activations"] == 20 * 81 * SBH_T // 2 + 4 * 64 * 4096 // 8 + 2 * 2 * SBH_T
    assert working_set("llama-2-70b", 1, SETTINGS) == working_set("llama-2-70b", 1, SETTINGS,
                                                                  pipeline_stage=0)


def test_with_few_micro_batches_the_first_stage_holds_fewer():
    few = peak("llama-2-70b", 64, 1, WorkingSetSettings(**{**SETTINGS.as_dict(), "micro_batches": 2}))
    assert few.working_set["activations"] == 2 * 20 * 81 * SBH_T // 2 + 4 * 64 * 4096 // 8


def test_interleaved_schedule_holds_the_korthikanti_factor():
    settings = WorkingSetSettings(**{**SETTINGS.as_dict(), "pipeline_schedule": "interleaved",
                                     "pipeline_chunks": 2})
    # 80 layers x (1 + 3/8) = 110 layers' worth on the first stage.
    assert peak("llama-2-70b", 64, 1, settings).working_set["activations"] == \
        110 * 81 * SBH_T // 2 + 4 * 64 * 4096 // 8


def test_fewest_gpus_counts_in_multiples_of_t_times_p():
    device = get_device("a100-80gb")
    fewest = fewest_gpus_for_peak("llama-2-70b", 1, SETTINGS, device=device, max_gpus=4096)
    assert fewest % 32 == 0
    assert peak("llama-2-70b", fewest, 1, SETTINGS).total <= device.capacity
    if fewest > 32:
        assert peak("llama-2-70b", fewest - 32, 1, SETTINGS).total > device.capacity
    stages = fewest_gpus_for_peak("llama-2-70b", [0, 1, 2, 3], SETTINGS, device=device, max_gpus=4096)
    assert stages[1] == fewest and all(n % 32 == 0 for n in stages)
    assert fewest_gpus_for_peak("llama-2-70b", 1, SETTINGS, device=device, max_gpus=16) is None


def test_bad_parallel_settings():
    with pytest.raises(ValueError, match=r"multiple of tensor_parallel x pipeline_parallel \(8 x 4 = 32\)"):
        peak("llama-2-70b", 48, 1, SETTINGS)
    with pytest.raises(ValueError, match="1f1b has chunks = 1"):
        peak("llama-2-70b", 64, 1, WorkingSetSettings(pipeline_parallel=4, pipeline_chunks=2))
    with pytest.raises(ValueError, match="at most layers"):
        peaks("gpt2", 24, settings=WorkingSetSettings(seq_len=128, pipeline_parallel=24))
    for change, name in ((dict(pipeline_parallel=0), "pipeline_parallel"),
                         (dict(pipeline_schedule="gpipe"), "pipeline_schedule"),
                         (dict(pipeline_chunks=0), "pipeline_chunks"),
                         (dict(micro_batches=0), "micro_batches")):
        with pytest.raises(ValueError, match=name):
            WorkingSetSettings(**change)
    with pytest.raises(ValueError, match="pipeline_stage"):
        working_set("llama-2-70b", 1, SETTINGS, pipeline_stage=4)


def test_cli_pipeline_flags(capsys):
    status, out, err = run(capsys, "estimate", "--model", "llama-2-70b", "--gpus", "64", "--seq", "4096",
                           "--tensor-parallel", "8", "--pipeline-parallel", "4", "--sequence-parallel",
                           "--recompute", "selective", "--stage", "1", "--format", "json")
    assert status == 0 and err == ""
    result = json.loads(out)
    (row,) = result["stages"]
    assert result["pipeline_parallel"] == 4 and result["working_set_settings"]["pipeline_schedule"] == "1f1b"
    assert row["pipeline_stage"] == 0 and row["peak"] == peak("llama-2-70b", 64, 1, SETTINGS).total
    _, table, _ = run(capsys, "estimate", "--model", "llama-2-70b", "--gpus", "64", "--seq", "4096",
                      "--tensor-parallel", "8", "--pipeline-parallel", "4", "--pipeline-schedule",
                      "interleaved", "--pipeline-chunks", "2", "--micro-batches", "8")
    assert "pipeline parallel 4 (interleaved, 2 chunks per stage, 8 micro-batches per step; most loaded" in table


@pytest.mark.parametrize("argv, fragment", [
    (["--pipeline-parallel", "0"], "--pipeline-parallel must be a positive whole number"),
    (["--pipeline-parallel", "many"], "--pipeline-parallel"),
    (["--pipeline-parallel", "3"], "multiple of tensor_parallel x pipeline_parallel"),
    (["--pipeline-parallel", "4", "--pipeline-chunks", "2"], "1f1b has chunks = 1"),
    (["--pipeline-parallel", "4", "--pipeline-schedule", "interleaved"], "chunks >= 2"),
    (["--pipeline-schedule", "gpipe"], "--pipeline-schedule"),
    (["--micro-batches", "0"], "--micro-batches"),
    (["--pipeline-parallel", "4", "--pipeline-schedule", "interleaved", "--pipeline-chunks", "2",
      "--micro-batches", "6"], "multiple of pipeline_parallel"),
])
def test_cli_bad_pipeline_flags_are_one_line(capsys, argv, fragment):
    status, out, err = run(capsys, "estimate", "--model", "llama-2-7b", "--gpus", "16", *argv)
    assert status == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], lines


def test_pipeline_flags_need_a_model(capsys):
    status, _, err = run(capsys, "estimate", "--params", "7B", "--gpus", "8", "--pipeline-parallel", "2")
    assert status == 2 and "--pipeline-parallel needs --model" in err


def test_the_will_it_fit_subtitle_names_the_pipeline():
    from zerolib.chapter.charts.will_it_fit import will_it_fit_titles
    from zerolib.core.memory.accounting import get_layout

    _, subtitle = will_it_fit_titles("llama-2-70b", 64, SETTINGS, get_layout("mixed-adam"))
    assert "8-way tensor parallel + sequence parallel · 4 pipeline stages (1f1b)" in subtitle


@pytest.mark.parametrize("name, t, p, stage", [("llama-2-70b", 8, 5, 3), ("gpt2", 2, 3, 0),
                                               ("llama-3-8b", 4, 7, 1), ("qwen2.5-7b", 4, 6, 2)])
def test_the_peak_over_every_pipeline_stage_is_at_the_first_or_the_last(name, t, p, stage):
    from zerolib.core.memory.model_parallel import parameters_per_gpu

    settings = WorkingSetSettings(seq_len=1024, tensor_parallel=t, pipeline_parallel=p,
                                  sequence_parallel=True, micro_batches=3)
    gpus = 2 * t * p
    every = []
    for r in range(p):
        params = int(parameters_per_gpu(name, t, p, pipeline_stage=r))
        every.append(int(model_state(params, 2, stage).total)
                     + sum(working_set(name, stage, settings, pipeline_stage=r).values()))
    assert peak(name, gpus, stage, settings).total == max(every)
