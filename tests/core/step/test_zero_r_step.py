"""ZeRO-R in the step time: P_a's all-gather and P_a+cpu's host copies, worked by hand.

Llama-2-7B (h = 4096, 32 layers), s = 4096, b = 1, 2-byte activations, t = 8 on a DGX H100
(NVLink 4 achieved at 370 GB/s, the 8-GPU all-gather's latency 32.2 us), host link PCIe 4 x16
at 31.5 GB/s. One checkpoint is s b h x 2 B = 33,554,432 B.
"""
import numpy as np
import pytest

from zerolib.core.step.parallel import ParallelSettings, parallel_step_time

BASE = dict(seq_len=4096, micro_batch=1, tensor_parallel=8, pipeline_parallel=1,
            data_parallel=1, stage=0, micro_batches=1, recompute="full")
CHECKPOINT = 2 * 4096 * 4096
LAYERS = 32


def _tensor(**extra):
    times = parallel_step_time("llama-2-7b", "dgx-h100", "h100-80gb", **{**BASE, **extra})
    return times, float(times.parts["tensor"])


def test_partitioned_checkpoint_gather_is_timed_per_layer_in_tensor_part():
    plain, before = _tensor()
    with_pa, after = _tensor(partition_activations=True)
    # Ring all-gather: each GPU sends 7 of its 8 shards of 4,194,304 B at 370 GB/s, plus latency.
    per_layer = 32.2e-6 + 7 * (CHECKPOINT // 8) / 370e9
    assert after - before == pytest.approx(LAYERS * per_layer, rel=1e-12)
    assert float(with_pa.parts["compute"]) == float(plain.parts["compute"])
    assert float(with_pa.step_seconds) - float(plain.step_seconds) == pytest.approx(
        LAYERS * per_layer, rel=1e-9)


def test_cpu_checkpointing_copies_the_kept_shard_down_and_back():
    _, with_pa = _tensor(partition_activations=True)
    _, with_cpu = _tensor(partition_activations=True, cpu_checkpointing=True)
    # P_a keeps 1/8 of the checkpoint: 4,194,304 B to the host in the forward, back in the backward.
    assert with_cpu - with_pa == pytest.approx(LAYERS * 2 * (CHECKPOINT // 8) / 31.5e9, rel=1e-12)
    _, plain = _tensor()
    _, cpu_only = _tensor(cpu_checkpointing=True)    # no P_a: the whole checkpoint moves
    assert cpu_only - plain == pytest.approx(LAYERS * 2 * CHECKPOINT / 31.5e9, rel=1e-12)


def test_nothing_to_gather_under_sequence_parallelism_or_one_gpu():
    _, sp = _tensor(sequence_parallel=True)
    _, sp_pa = _tensor(sequence_parallel=True, partition_activations=True)
    assert sp_pa == sp
    one = {**BASE, "tensor_parallel": 1}
    a = parallel_step_time("llama-2-7b", "dgx-h100", "h100-80gb", **one)
    b = parallel_step_time("llama-2-7b", "dgx-h100", "h100-80gb", **one, partition_activations=True)
    assert float(a.step_seconds) == float(b.step_seconds)


def test_a_micro_batch_per_gather_and_the_bubble_sees_it():
    # Two micro-batches over two pipeline stages of 16 layers: the bubble is one micro-batch.
    kw = {**BASE, "pipeline_parallel": 2, "micro_batches": 2}
    a = parallel_step_time("llama-2-7b", "dgx-h100", "h100-80gb", **kw)
    b = parallel_step_time("llama-2-7b", "dgx-h100", "h100-80gb", **kw, partition_activations=True)
    per_layer = 32.2e-6 + 7 * (CHECKPOINT // 8) / 370e9
    assert float(b.parts["tensor"] - a.parts["tensor"]) == pytest.approx(2 * 16 * per_layer, rel=1e-9)
    assert float(b.parts["bubble"] - a.parts["bubble"]) == pytest.approx(16 * per_layer, rel=1e-9)


def test_arrays_broadcast_per_setting():
    times = parallel_step_time("llama-2-7b", "dgx-h100", "h100-80gb", **BASE,
                               partition_activations=np.array([False, True]))
    _, before = _tensor()
    _, after = _tensor(partition_activations=True)
    assert times.parts["tensor"].tolist() == [before, after]


def test_needs_full_recomputation():
    with pytest.raises(ValueError, match="partition_activations applies to activation checkpoints"):
        ParallelSettings(**{**BASE, "recompute": "selective"}, partition_activations=True)
    with pytest.raises(TypeError, match="cpu_checkpointing must be True or False"):
        ParallelSettings(**BASE, cpu_checkpointing=1)
