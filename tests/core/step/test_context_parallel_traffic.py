"""Ring attention's sends and ZeRO-R P_a's all-gathers per step, worked by hand from
TransformerEngine's p2p loops and DeepSpeed's checkpointing (the module doc)."""
from __future__ import annotations

from pathlib import Path

import pytest

import zerolib as zl
from zerolib.core.memory.activations import ActivationOptions
from zerolib.core.memory.model_parallel import Pipeline
from zerolib.core.step.context_parallel_traffic import (
    checkpoint_host_bytes,
    context_parallel_traffic,
    kv_block_bytes,
    partitioned_checkpoint_traffic,
)

DATA = Path(__file__).resolve().parents[2] / "data"


def test_llama_2_70b_ring_by_hand():
    # s = 32,768 over C = 4: 8,192 tokens per rank. t = 8 leaves one of the 8 key/value heads
    # (128 wide) per rank: a K,V block is 2 x 8192 x 128 x 2 bytes = 4 MiB. Per layer: C - 1 = 3
    # sends forward, 3 of K,V and 3 of dK,dV backward; 80 layers, one micro-batch.
    rows = context_parallel_traffic("llama-2-70b", 32_768, 1, 4, 8)
    assert {row.tensor_bytes for row in rows} == {4 * 2**20}
    assert [(row.phase, row.calls) for row in rows] == [("forward", 240), ("backward", 240),
                                                        ("backward", 240)]
    assert all(row.group == "context" and row.collective == "send" and row.group_size == 4
               for row in rows)
    assert sum(row.total_bytes for row in rows) == 720 * 4 * 2**20 == 3_019_898_880


def test_recomputation_runs_the_forward_ring_again():
    for recompute in ("selective", "full"):
        rows = context_parallel_traffic("llama-2-70b", 32_768, 1, 4, 8, options=ActivationOptions(recompute=recompute))
        assert sum(row.calls for row in rows) == 4 * 240


def test_micro_batches_stages_and_the_micro_batch_scale_it():
    # p = 4: 20 layers on each stage; 8 micro-batches; micro-batch 2 doubles each block.
    rows = context_parallel_traffic("llama-2-70b", 32_768, 2, 4, 8, Pipeline(4, micro_batches=8), 3)
    assert [row.calls for row in rows] == [3 * 20 * 8] * 3
    assert rows[0].tensor_bytes == 8 * 2**20


def test_fewer_key_value_heads_than_ranks_still_send_one():
    # t = 16 over 8 key/value heads: each rank keeps (and sends) one whole head, as at t = 8.
    assert kv_block_bytes(zl.get_model("llama-2-70b"), 8192, 1, 16, 2) == 4 * 2**20
    # Llama-2-7B has no GQA: 32 heads of 128 over t = 4 leave 8 heads per rank.
    assert kv_block_bytes(zl.get_model("llama-2-7b"), 1024, 1, 4, 2) == 2 * 2 * 1024 * 8 * 128


def test_latent_attention_sends_its_wider_keys():
    # DeepSeek-V2-Lite: 16 heads, keys of 128 + 64 rope, values of 128; 1,024 tokens, t = 1:
    # 2 bytes x 1024 x 16 x (192 + 128).
    config = zl.model_from_config(DATA / "deepseek-v2-lite.json")
    assert kv_block_bytes(config, 1024, 1, 1, 2) == 2 * 1024 * 16 * 320 == 10_485_760


def test_no_ring_without_context_parallelism():
    assert context_parallel_traffic("llama-2-70b", 4096, 1, 1, 8) == ()


def test_bad_arguments():
    with pytest.raises(ValueError, match="multiple of 2 x context_parallel"):
        context_parallel_traffic("llama-2-70b", 4100, 1, 4)
    with pytest.raises(ValueError, match="recompute must be one of"):
        context_parallel_traffic("llama-2-70b", 4096, 1, 2, options=ActivationOptions(recompute="some"))
    with pytest.raises(ValueError, match="pipeline_stage must be a whole number from 0 to 1"):
        context_parallel_traffic("llama-2-70b", 4096, 1, 2, 1, 2, 2)
    with pytest.raises(ValueError, match=r"tensor_parallel \(3\) must divide heads"):
        context_parallel_traffic("llama-2-70b", 4096, 1, 2, 3)


def test_partitioned_checkpoints_gather_once_per_layer():
    # P_a at t = 8: one all-gather per layer and micro-batch of the whole checkpoint,
    # s b h x 2 bytes = 4096 x 8192 x 2 = 64 MiB, over the 8 tensor-parallel GPUs; 80 layers.
    (row,) = partitioned_checkpoint_traffic("llama-2-70b", 4096, 1, 8)
    assert (row.group, row.collective, row.phase) == ("tensor", "all-gather", "backward")
    assert (row.calls, row.tensor_bytes, row.group_size) == (80, 64 * 2**20, 8)
    # Under CP each rank gathers its own tokens' checkpoint: a quarter at C = 4.
    (row,) = partitioned_checkpoint_traffic("llama-2-70b", 4096, 1, 8, context_parallel=4)
    assert row.tensor_bytes == 16 * 2**20
    assert partitioned_checkpoint_traffic("llama-2-70b", 4096, 1, 1) == ()
    assert partitioned_checkpoint_traffic("llama-2-70b", 4096, 1, 8,
                                          options=ActivationOptions(sequence_parallel=True)) == ()


def test_cpu_checkpoints_go_down_and_come_back():
    # P_a+cpu at t = 8: each rank copies its eighth of every checkpoint (8 MiB) to the host in
    # the forward and back in the backward; 80 layers x 4 micro-batches.
    moved = checkpoint_host_bytes("llama-2-70b", 4096, 1, 8, Pipeline(1, micro_batches=4), options=ActivationOptions(
        recompute="full", partition_activations=True))
    assert moved == {"to_host": 80 * 4 * 8 * 2**20, "from_host": 80 * 4 * 8 * 2**20}
    # Without P_a the whole (replicated) checkpoint goes down.
    assert checkpoint_host_bytes("llama-2-70b", 4096, 1, 8)["to_host"] == 80 * 64 * 2**20


# --- the ring in the step model (zerolib.core.step.parallel), by hand ------------------------------

def _step(**kwargs):
    from zerolib.core.step.parallel import cluster_interconnect, parallel_step_time
    base = dict(seq_len=8192, micro_batch=1, tensor_parallel=1, pipeline_parallel=1, data_parallel=2,
                stage=0, micro_batches=1, mfu=0.5)
    base.update(kwargs)
    return parallel_step_time("llama-2-7b", cluster_interconnect("dgx-a100", 8), "a100-80gb", **base)


# Llama-2-7B's matrices: 6,738,415,616 parameters less its 32,000 x 4,096 input embedding, a
# lookup: 6,607,343,616. Its causal attention core per token and layer at s tokens is
# s x 32 heads x (128 + 128) FLOPs forward: over 32 layers 2^31 at 8,192, 2^30 at 4,096, and
# the step runs it three times (forward, and the backward's two products).
M7 = 6_738_415_616 - 32_000 * 4096
CORE_8K, CORE_4K = 32 * 8192 * 32 * 256, 32 * 4096 * 32 * 256


def test_a_ring_inside_a_node_by_hand():
    # s = 8192 over C = 2: each GPU computes 4,096 tokens, each attending over all 8,192:
    # (6 M + 3 A) x 4096 / (0.5 x 312e12) s. Its K,V block is 2 x 4096 x 32 x 128 x 2 bytes =
    # 64 MiB; 32 layers x (1 forward + 2 backward) sends, each on NVLink 3 at the 230 GB/s NCCL
    # reaches (of 300) after 8.4 + 3.4 us (t x C = 2 GPUs: one node).
    assert (CORE_8K, CORE_4K) == (2**31, 2**30)
    result = _step(context_parallel=2)
    expected = 96 * (64 * 2**20 / 230e9 + 11.8e-6)
    assert float(result.parts["context"]) == pytest.approx(expected, rel=1e-12)
    assert float(result.parts["compute"]) == pytest.approx((6 * M7 + 3 * CORE_8K) * 4096 / 156e12,
                                                           rel=1e-12)
    # The same gradients reduce over the d x C = 2 GPUs as over two data-parallel GPUs of 4,096
    # tokens each; those attend over 4,096 tokens, not 8,192.
    plain = _step(seq_len=4096)
    assert float(result.parts["data_parallel"]) == float(plain.parts["data_parallel"])
    assert float(plain.parts["context"]) == 0
    longer = 3 * (CORE_8K - CORE_4K) * 4096 / 156e12
    assert float(result.step_seconds) == pytest.approx(float(plain.step_seconds) + expected + longer,
                                                       rel=1e-12)


def test_a_ring_across_nodes_by_hand():
    # t = 8 fills a DGX A100 node, so C = 2 puts the two ranks of a ring on two nodes: each
    # send on the GPU's own HDR port at the 24 GB/s NCCL reaches (of 25) after 8.4 + 14.0 us. A
    # rank holds 4 of the 32 heads: a block of 2 x 4096 x 4 x 128 x 2 bytes = 8 MiB.
    result = _step(context_parallel=2, tensor_parallel=8)
    assert float(result.parts["context"]) == pytest.approx(96 * (8 * 2**20 / 24e9 + 22.4e-6), rel=1e-12)
    assert float(result.network_wait_fraction) == pytest.approx(
        float((result.parts["tensor"] + result.parts["context"] + result.parts["data_parallel"])
              / result.step_seconds), rel=1e-12)


def test_step_settings_refuse_a_sequence_the_ring_cannot_split():
    with pytest.raises(ValueError, match="multiple of 2 x context_parallel"):
        _step(seq_len=8190, context_parallel=2)


def test_a_cp_rank_recomputes_attention_over_the_whole_sequence():
    # Selective recomputation repeats the attention core of each of the GPU's 4,096 tokens over
    # all 8,192 of the sequence once more: 4 x 2^31 FLOPs per token beside 6 per multiplied
    # parameter, at 0.5 x 312e12 FLOP/s.
    result = _step(context_parallel=2, recompute="selective")
    flops = 6 * M7 * 4096 + 4 * CORE_8K * 4096
    assert float(result.parts["compute"]) == pytest.approx(flops / 156e12, rel=1e-12)
