"""DeepSpeed's ds_config.json read as a run: each key carried to its field, "auto" filled as
Hugging Face Trainer fills it or left to the caller, what zerolib does not model yet refused in
one line naming the file and the key.

Expected values by hand: Llama-2-7B's hidden size is 4,096, so Hugging Face Trainer's "auto"
buckets are 4096^2 = 16,777,216, int(0.9 x 4096^2) = 15,099,494 and 10 x 4096 = 40,960;
DeepSpeed's batch rule is train_batch_size = micro-batch x accumulation x GPUs."""
from __future__ import annotations

import json

import pytest

from zerolib.core.deepspeed_config import (
    KEYS,
    MAX_DS_CONFIG_BYTES,
    read_deepspeed_config,
    run_from_deepspeed_config,
)

ZERO3 = {
    "train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
    "bf16": {"enabled": True},
    "zero_optimization": {
        "stage": 3, "overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
        "stage3_max_live_parameters": 1e9, "sub_group_size": 1e9,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "none"}},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}, "gradient_clipping": 1.0,
}


def test_a_zero3_config_is_a_run(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(ZERO3))
    run = run_from_deepspeed_config(path, "llama-2-7b")
    t, k, b = run.trainer, run.trainer.buckets, run.batch
    assert (t.engine, t.stages, t.element_bytes, t.offload_optimizer, t.offload_params) == (
        "deepspeed", (3,), 2, "cpu", "none")
    # overlap_comm: stage 3 keeps one reduce bucket either way (stages 1-2 two)
    assert (k.reduce_bucket_size, k.prefetch_bucket_size, k.max_live_parameters, k.overlap_comm) == (
        16_777_216, 15_099_494, 1_000_000_000, False)
    # 64 / (2 x 4) = 8 GPUs
    assert (run.cluster.gpus, b.micro_batch, b.micro_batches, b.global_batch) == (8, 2, 4, 64)


def test_what_was_carried_is_said_key_by_key():
    read = read_deepspeed_config(ZERO3)
    carried = dict(read.carried)
    assert carried["zero_optimization.stage"] == "stages"
    assert carried["zero_optimization.offload_optimizer.device"] == "offload_optimizer"
    assert carried["train_micro_batch_size_per_gpu"] == "micro_batch"
    # without a model the hidden-size buckets are left "auto", each with where it comes from
    assert [key for key, _, _ in read.auto] == ["zero_optimization.reduce_bucket_size",
                                                "zero_optimization.stage3_prefetch_bucket_size",
                                                "zero_optimization.stage3_param_persistence_threshold"]


def test_defaults_without_sections():
    run = run_from_deepspeed_config({"train_micro_batch_size_per_gpu": 1}, "llama-2-7b", gpus=16)
    # no zero_optimization: stage 0; no bf16/fp16: fp32 training
    assert (run.trainer.stages, run.trainer.element_bytes, run.trainer.layout) == ((0,), 4, "fp32-adam")
    assert run.cluster.gpus == 16


@pytest.mark.parametrize("sizes,gpus,expected", [
    ({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2}, 8, (2, 4)),    # 64 / (2 x 8)
    ({"train_batch_size": 64, "gradient_accumulation_steps": 2}, 8, (4, 2)),       # 64 / (2 x 8)
    ({"train_batch_size": 64}, 16, (4, 1)),                                        # 64 / 16
    ({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 5}, 8, (3, 5)),
])
def test_deepspeeds_batch_rule(sizes, gpus, expected):
    b = run_from_deepspeed_config(sizes, "llama-2-7b", gpus=gpus).batch
    assert (b.micro_batch, b.micro_batches) == expected


def test_batch_sizes_that_disagree_are_refused():
    with pytest.raises(ValueError, match=r"ds_config: train_batch_size 64 is not 2 x 4 x 16 GPUs"):
        run_from_deepspeed_config(ZERO3, "llama-2-7b", gpus=16)
    with pytest.raises(ValueError, match=r"train_batch_size 60 is not a multiple of 7 x 8 GPUs"):
        run_from_deepspeed_config({"train_batch_size": 60, "train_micro_batch_size_per_gpu": 7},
                                  "llama-2-7b", gpus=8)


def test_auto_is_filled_by_the_caller_or_refused_saying_where_it_comes_from():
    config = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
              "train_batch_size": "auto", "bf16": {"enabled": "auto"}}
    with pytest.raises(ValueError, match=r'^ds_config: train_micro_batch_size_per_gpu is "auto": Hugging '
                                         r"Face Trainer fills it at launch from per_device_train_batch_size"):
        run_from_deepspeed_config(config, "llama-2-7b")
    run = run_from_deepspeed_config(config, "llama-2-7b", gpus=8,
                                    auto={"micro_batch": 4, "micro_batches": 2, "element_bytes": 2})
    assert (run.batch.micro_batch, run.batch.micro_batches, run.trainer.element_bytes) == (4, 2, 2)


@pytest.mark.parametrize("change,message", [
    ({"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 10**6}},
     "stage3_param_persistence_threshold 1,000,000: parameters kept whole above .* is not modelled yet"),
    ({"zero_optimization": {"stage": 2, "contiguous_gradients": False}},
     "contiguous_gradients false: .* is not modelled yet"),
    ({"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}},
     "grad_accum_dtype fp32: DeepSpeed refuses bf16 parameters with fp32 gradient accumulation without ZeRO"),
    ({"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}, "zero_optimization": {"stage": 2}},
     "data_types.grad_accum_dtype fp32 with bf16 at ZeRO stage 2: .* not modelled yet"),
    ({"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"},
      "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}},
     "data_types.grad_accum_dtype fp32 with bf16 at ZeRO stage 1: .* not modelled yet"),
    ({"data_types": {"grad_accum_dtype": "int8"}}, "grad_accum_dtype must be fp32, fp16 or bf16, got 'int8'"),
    ({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.3}}},
     "offload_optimizer.ratio 0.3: a partial optimizer offload is not modelled yet"),
    ({"zero_optimization": {"stage": 4}}, "zero_optimization.stage must be a ZeRO stage from 0 to 3, got 4"),
    ({"zero_optimization": {"stage": 2, "reduce_bucket_size": 5.5e8 + 0.5}},
     "reduce_bucket_size must be a whole number"),
    ({"zero_optimization": {"stage": 2, "reduce_bucket_size": -1}}, "reduce_bucket_size must be a whole number from 0"),
    ({"zero_optimization": {"stage": 2, "overlap_comm": "yes"}}, "overlap_comm must be true or false, got 'yes'"),
    ({"zero_optimization": {"stage": 3, "offload_param": {"device": "disk"}}},
     "offload_param.device must be none, cpu or nvme, got 'disk'"),
    ({"zero_optimization": {"stage": 2, "cpu_offload": True}}, "cpu_offload is deprecated in DeepSpeed"),
    ({"zero_optimization": {"stage": 2, "reduce_bucket": 5}}, "zero_optimization.reduce_bucket is not a field"),
    ({"zero_optimization": [3]}, "zero_optimization must be a JSON object"),
    ({"bf16": {"enabled": True}, "fp16": {"enabled": True}}, "bf16.enabled and fp16.enabled: give one"),
    ({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 4}, "train_micro_batch_size_per_gpu": 1},
     None),
])
def test_each_key_refused_in_one_line_naming_the_file_and_the_key(change, message, tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(change))
    if message is None:
        run = run_from_deepspeed_config(path, "llama-2-7b", gpus=16)
        assert run.parallel.hpz and run.cluster.gpus_per_node == 4   # hpZ over 4 GPUs: a node of 4
        return
    with pytest.raises(ValueError, match=f"^{path}: .*{message}") as error:
        run_from_deepspeed_config(path, "llama-2-7b", gpus=16)
    assert "\n" not in str(error.value)


def test_zeropp_and_mics_are_carried():
    run = run_from_deepspeed_config({"zero_optimization": {"stage": 3, "zero_quantized_weights": True,
                                                           "zero_quantized_gradients": True,
                                                           "mics_shard_size": 8}}, "llama-2-7b", gpus=32)
    assert (run.trainer.qwz, run.trainer.qgz, run.parallel.shard_group) == (True, True, 8)
    assert run_from_deepspeed_config({"zero_optimization": {"stage": 3, "mics_shard_size": -1}},
                                     "llama-2-7b").parallel.shard_group is None


def test_zero_r_checkpoints_mean_full_recomputation():
    run = run_from_deepspeed_config({"activation_checkpointing": {"partition_activations": True,
                                                                  "cpu_checkpointing": True,
                                                                  "number_checkpoints": 4}},
                                    "llama-2-7b")
    assert (run.trainer.recompute, run.trainer.partition_activations, run.trainer.cpu_checkpointing) == (
        "full", True, True)


def test_the_file_is_bounded(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MAX_DS_CONFIG_BYTES + 1))
    with pytest.raises(ValueError, match=f"{big}: .* bytes; a DeepSpeed config is read up to"):
        run_from_deepspeed_config(big, "llama-2-7b")
    deep = tmp_path / "deep.json"
    deep.write_text('{"zero_optimization": ' + "[" * 40 + "]" * 40 + "}")
    with pytest.raises(ValueError, match="nests more than 32 levels deep; a DeepSpeed config nests a few"):
        run_from_deepspeed_config(deep, "llama-2-7b")
    with pytest.raises(ValueError, match="no such file|No such file"):
        run_from_deepspeed_config(tmp_path / "missing.json", "llama-2-7b")
    with pytest.raises(TypeError, match="ds_config must be a path"):
        run_from_deepspeed_config(3, "llama-2-7b")


def test_every_key_names_a_run_field_or_what_is_not_modelled():
    from zerolib.core.run import FIELDS
    own = {"stages", "contiguous_gradients", "persistence_threshold", "bf16", "fp16", "hpz",
           "grad_accum_dtype", "immediate_grad_update"}
    for key, spec in KEYS.items():
        assert (spec.field in FIELDS or spec.field in own) if spec.field else spec.not_modelled, key


# DeepSpeed 0.19.8 picks BF16_Optimizer for bf16 with fp32 gradient accumulation at ZeRO stage 1
# (engine.py _do_optimizer_sanity_check): bf16 parameters (2), the bf16 .grad (2) kept beside
# the full-size fp32 gradient buffer (4) from the backward to the step, fp32 master weights and
# Adam moments (12) sharded over the data-parallel GPUs. By hand, 1,000,000 parameters on 4 GPUs:
# stage 1: 2,000,000 + 6,000,000 + 12 x 250,000 = 11,000,000 bytes per GPU.
BF16_ZERO1 = {"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"},
              "zero_optimization": {"stage": 1}, "train_micro_batch_size_per_gpu": 1}


def test_bf16_optimizer_keeps_bf16_gradients_beside_its_fp32_buffer():
    from zerolib.core.memory.accounting import model_state
    run = run_from_deepspeed_config(BF16_ZERO1, 1_000_000, gpus=4)
    layout = run.trainer.layout_of
    assert (layout.name, layout.widths()) == ("deepspeed-bf16-optimizer", (2, 6, 12))
    state = model_state(1_000_000, 4, 1, layout)
    assert (int(state.parameters), int(state.gradients), int(state.optimizer)) == (
        2_000_000, 6_000_000, 3_000_000)
    assert run.trainer.buckets.reduce_bucket_size == 0   # no ZeRO reduce bucket: the engine's all-reduce


def test_immediate_grad_update_frees_each_bf16_gradient_into_the_buffer():
    config = {**BF16_ZERO1, "bf16": {"enabled": True, "immediate_grad_update": True}}
    run = run_from_deepspeed_config(config, 1_000_000, gpus=4)
    assert run.trainer.layout_of == "bf16-fp32-grads"            # 2 + 4 + 12/4: 9,000,000 bytes


@pytest.mark.parametrize("stage,data_types", [(0, {}), (1, {}), (1, {"grad_accum_dtype": "bf16"}),
                                              (2, {}), (3, {})])
def test_bf16_without_fp32_accumulation_keeps_the_chapters_layout(stage, data_types):
    # stage 0: DDP_BFLOAT16 (FP16_UnfusedOptimizer); stages 1-3: ZeRO's optimizers
    config = {"bf16": {"enabled": True}, "zero_optimization": {"stage": stage},
              "data_types": data_types, "train_micro_batch_size_per_gpu": 1}
    run = run_from_deepspeed_config(config, 1_000_000, gpus=4)
    assert run.trainer.layout_of == "mixed-adam"
