"""Megatron-LM's memory convention (engine ``megatron``), each term worked by hand from
Megatron-LM's code at d98e8a64: one contiguous gradient buffer, fp32 under --bf16
(megatron/training/arguments.py 1205-1216; param_and_grad_buffer.py grad_dtype), a bf16
parameter buffer, the distributed optimizer's fp32 main parameters and two moments sharded over
data parallelism (distrib_optimizer.py), and no bucket beside the buffer: the reduce-scatter and
the all-gather run in place."""
from __future__ import annotations

import pytest

from zerolib.core.estimate import estimate
from zerolib.core.megatron_launch import run_from_megatron_args

# The Megatron-LM CI's GPT 7B test model (tests/functional_tests/test_cases/gpt/
# gpt3_7b_tp1_pp4_memory_speed/model_config.yaml), the flags that shape it and its run.
MODEL = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --group-query-attention "
         "--num-query-groups 8 --untie-embeddings-and-output-weights --seq-length 8192 "
         "--max-position-embeddings 8192 --vocab-size 131073 --micro-batch-size 1 "
         "--global-batch-size 8")
PP4 = MODEL + (" --tensor-model-parallel-size 1 --pipeline-model-parallel-size 4 "
               "--num-layers-per-virtual-pipeline-stage 1 --use-distributed-optimizer --bf16")

# By hand. One layer: QKV 4096 x (4096 + 2 x 8 x 128) + bias 6,144 = 25,171,968; the projection
# 4096^2 + 4096 = 16,781,312; fc1 4096 x 16384 + 16384 = 67,125,248; fc2 16384 x 4096 + 4096 =
# 67,112,960; two LayerNorms 4 x 4096 = 16,384: 176,207,872. The last of 4 stages holds 8
# layers, the untied output layer (131073 padded to 131,200 rows x 4096 = 537,395,200) and the
# final LayerNorm (8,192): 1,947,066,368 parameters.
LAYER = 25_171_968 + 16_781_312 + 67_125_248 + 67_112_960 + 16_384
LAST_STAGE = 8 * LAYER + 131_200 * 4096 + 2 * 4096


def test_the_hand_count_of_the_last_stage():
    assert LAYER == 176_207_872 and LAST_STAGE == 1_947_066_368


def test_bf16_distributed_optimizer_keeps_18_bytes_with_12_sharded():
    run = run_from_megatron_args(PP4, gpus=8)
    assert run.trainer.layout_name == "bf16-fp32-grads"
    row = estimate(run).as_dict()["stages"][0]
    assert row["pipeline_stage"] == 3
    assert row["parameters"] == 2 * LAST_STAGE == 3_894_132_736       # the bf16 parameter buffer
    assert row["gradients"] == 4 * LAST_STAGE == 7_788_265_472        # the fp32 gradient buffer
    assert row["optimizer"] == 12 * LAST_STAGE // 2 == 11_682_398_208  # fp32 main + m + v over d=2
    # reduce-scattered and all-gathered in place: no bucket beside the buffers
    for term in ("ddp_buckets", "reduce_bucket", "allgather_bucket", "gathered_parameters"):
        assert row["working_set"][term] == 0, term


@pytest.mark.parametrize("flags, layout", [
    ("--bf16", "bf16-fp32-grads"),                    # fp32 accumulation forced for bf16
    ("--bf16 --grad-reduce-in-bf16", "mixed-adam"),   # unless reduced in bf16
    ("--fp16", "mixed-adam"),                         # fp16: the parameters' own dtype
    ("--fp16 --accumulate-allreduce-grads-in-fp32", "bf16-fp32-grads"),
    ("", "fp32-adam"),                                # fp32 training
])
def test_the_gradient_buffer_dtype_follows_validate_args(flags, layout):
    run = run_from_megatron_args(f"{MODEL} {flags}", gpus=8)
    assert run.trainer.layout_name == layout


def test_plain_data_parallel_keeps_no_second_copy_of_the_gradients():
    # Megatron-LM's DDP: param.main_grad is a view into the buffer it all-reduces; DeepSpeed's
    # stage 0 and torch DDP keep buckets beside the gradients (the chapter's ddp_buckets).
    run = run_from_megatron_args(MODEL.replace("--global-batch-size 8", "") + " --fp16", gpus=8)
    megatron = estimate(run).as_dict()["stages"][0]
    deepspeed = estimate(run.replace(engine="deepspeed")).as_dict()["stages"][0]
    assert megatron["stage"] == 0 and megatron["working_set"]["ddp_buckets"] == 0
    # the whole model's fp16 gradients: 32 layers, embedding and output (131,200 x 4096 each),
    # positions 8192 x 4096, final LayerNorm
    whole = 32 * LAYER + 2 * 131_200 * 4096 + 8192 * 4096 + 2 * 4096
    assert deepspeed["working_set"]["ddp_buckets"] == 2 * whole
    assert megatron["max_memory_allocated"] == deepspeed["max_memory_allocated"] - 2 * whole
