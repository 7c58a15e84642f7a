"""Issue 24, item 4: one rule set for the working set's peaks and the planner."""
from __future__ import annotations

import pytest

import zerolib as zl
from zerolib.core.memory.model_parallel import RULES as PARALLEL_RULES
from zerolib.core.memory.model_parallel import check_parallel
from zerolib.core.planner import RULES as PLANNER_RULES


def test_the_planner_takes_its_parallel_rules_word_for_word():
    for name in ("heads", "kv_heads", "ffn_hidden", "node", "sequence", "layers",
                 "interleaved_layers", "schedule", "micro_batches", "pipeline_zero"):
        assert PLANNER_RULES[name] == PARALLEL_RULES[name]


def test_peaks_refuse_a_sequence_the_tensor_parallel_degree_does_not_divide():
    settings = zl.WorkingSetSettings(seq_len=4097, tensor_parallel=2, sequence_parallel=True)
    with pytest.raises(ValueError, match="^tensor_parallel must divide seq_len under sequence"):
        zl.peaks("llama-2-7b", 8, [0, 1], settings)
    with pytest.raises(ValueError, match="^tensor_parallel must divide seq_len under sequence"):
        zl.estimate("llama-2-7b", 8, seq_len=4097, tensor_parallel=2, sequence_parallel=True)


def test_estimate_refuses_zero_2_and_3_under_a_pipeline():
    for stage in (2, 3):
        with pytest.raises(ValueError, match=r"^ZeRO stages 2 and 3 do not run with pipeline"):
            zl.estimate("llama-2-7b", 8, pipeline_parallel=2, stages=[stage])
    assert [row["stage"] for row in zl.estimate("llama-2-7b", 8, pipeline_parallel=2,
                                                stages=[0, 1]).stages] == [0, 1]
    # without stages named, those the engine runs beside a pipeline (DeepSpeed's: 0 and 1)
    assert [row["stage"] for row in zl.estimate("llama-2-7b", 8, pipeline_parallel=2).stages] == [0, 1]


def test_check_parallel_names_the_stage():
    with pytest.raises(ValueError, match="got tensor_parallel 1, pipeline_parallel 4, stage 3"):
        check_parallel("llama-2-7b", 1, 4, stage=3)
    check_parallel("llama-2-7b", 1, 4, stage=1)
    check_parallel("llama-2-7b", 1, 1, stage=3)
