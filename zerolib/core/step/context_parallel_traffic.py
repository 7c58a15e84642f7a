"""What context parallelism and ZeRO-R's partitioned checkpoints send per training step, one GPU.

Pure counting, no time, in :mod:`zerolib.core.step.model_parallel_traffic`'s rows
(:class:`~zerolib.core.step.model_parallel_traffic.ParallelTraffic`: calls per step and the
bytes of one call's tensor).

**Ring attention** (context parallelism over C GPUs; Liu et al., arXiv 2310.01889; Megatron-LM's
``--context-parallel-size`` with TransformerEngine's ``AttnFuncWithCPAndKVP2P``, the "p2p"
communication type). Each CP rank holds s / C tokens of every sequence (the causal load
balancing, :func:`zerolib.core.memory.activations.context_parallel_tokens`) and so its own K,V
block of s / C tokens: on one tensor-parallel rank, K and V of its key/value heads (grouped-query
attention shrinks them; multi-head latent attention sends its wider keys and values, as
TransformerEngine flattens them into one buffer). Per layer and micro-batch, in
TransformerEngine's loops:

- forward: C steps, each computing with one K,V block while the next travels; the first C - 1
  send the block just used to the next rank of the ring and receive the previous rank's
  (``for i in range(cp_size + 1)``, ``if i < (cp_size - 1)``): C - 1 sends of a K,V block;
- backward: C steps again; step 0 sends the K,V block only, steps 1 to C - 2 send the K,V block
  and the dK,dV accumulated so far for the block it came with, the last step sends dK,dV only,
  home to its owner (``send_tensor[0]`` at ``i == 0``, ``send_tensor[1]`` at
  ``i == cp_size - 1``): C - 1 sends of a K,V block and C - 1 of its gradient, in the same width;
- recomputation: full recomputation re-runs the forward during the backward, and selective
  recomputation re-runs the attention core (Megatron-LM's ``core_attn``), the ring with it: one
  more forward's C - 1 sends.

Every send is a point-to-point message to the next rank of the ring, all C ranks at once, so a
ring step moves one block over every link of the ring (each GPU sends one and receives one).
The causal mask lets a rank skip half of some blocks' compute but it still sends whole blocks.
Left out: the all-reduce of the loss over the CP group (two numbers per micro-batch) and the
gradient reduction over the d x C data- and context-parallel group, which is ZeRO's schedule
(:mod:`zerolib.core.step.traffic`) over that group.

**In the step** (:func:`zerolib.core.step.parallel.parallel_step_time`, ``context_parallel`` =
C): ranks in Megatron-LM's order tp-cp-ep-dp-pp, so a CP ring is C GPUs t apart, inside a node
while t x C <= GPUs per node. ``data_parallel`` is then the d x C GPUs of the data- and
context-parallel group that ZeRO shards over and reduces gradients across
(:mod:`zerolib.core.memory.working_set` says why), so the ZeRO slots, the pipeline's hops
(t x d x C GPUs apart) and ``micro_batches`` keep their meaning; each GPU computes, and runs its
tensor-parallel collectives and pipeline messages on, its s / C tokens of each sequence. The
ring's sends are the step's ``context`` part: each a point-to-point message
(:func:`zerolib.core.step.time.send_seconds`, across nodes at each GPU's share of the ports once
the ring leaves its node), not overlapped. TransformerEngine overlaps each ring step with the
attention on the block before, but the compute model counts the attention's s^2 products only
where recomputation repeats them (:mod:`zerolib.core.step.time`), too little to hide the ring
behind: an upper bound on CP's cost. A recomputed attention core is charged for the whole
sequence each of the GPU's s / C tokens attends over.

**ZeRO-R's P_a** (Rajbhandari et al., SC20, Sec. VI-A and the communication analysis of
Sec. VIII-B; DeepSpeed ``runtime/activation_checkpointing/checkpointing.py``
``partition_activations`` and ``gather_partitioned_activations``): each checkpoint is kept as
1 / t of it on each tensor-parallel rank and all-gathered once before its layer is recomputed in
the backward: one all-gather of the whole checkpoint (s / C x b x h elements) per layer and
micro-batch over the t GPUs. Under sequence parallelism the checkpoint is split already and
nothing is gathered. **P_a+cpu** (``cpu_checkpointing``): each checkpoint is copied to host
memory in the forward and back in the backward (:func:`checkpoint_host_bytes`).
"""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import numpy as np

from zerolib.core.catalogue.models import get_model
from zerolib.core.inputs import check_positive_int
from zerolib.core.intmath import ceil_div
from zerolib.core.memory.activations import (
    DEFAULT_OPTIONS,
    ActivationOptions,
    checkpoint_terms_of,
    context_parallel_tokens,
)
from zerolib.core.memory.model_parallel import ParallelGrid, Pipeline, as_pipeline, stage_layers
from zerolib.core.step.model_parallel_traffic import ParallelTraffic

GROUP = "context"   # the rows' group: the C GPUs of a context-parallel ring


def kv_block_bytes(config, tokens: int, micro_batch: int, tensor_parallel: int,
                   element_bytes: int) -> int:
    """Bytes of one K,V block: the keys and values of ``tokens`` tokens of ``micro_batch``
    sequences on one tensor-parallel rank (its key/value heads, at least one; latent attention's
    keys of head_dim + rope_head_dim and values of v_head_dim per head), as the ``key`` and
    ``value`` terms of :mod:`zerolib.core.memory.activations` count them."""
    s, b, t, e = tokens, micro_batch, tensor_parallel, element_bytes
    d, a = config.head_width, config.heads
    if config.kv_lora_rank:
        return e * (ceil_div(s * b * a * (d + config.rope_head_dim), t)
                    + ceil_div(s * b * a * (config.v_head_dim or d), t))
    return 2 * e * s * b * d * ceil_div(config.kv_heads, t)


def _gpu(model, seq_len, micro_batch, context_parallel, tensor_parallel, pipeline, pipeline_stage,
         options):
    """(the checked grid of one GPU, its tokens of each sequence: s / C): each door's checks
    (the pipeline's micro-batches per step: None is p, the fewest that fill it)."""
    config = get_model(model)
    if not isinstance(options, ActivationOptions):
        raise TypeError(f"options must be an ActivationOptions, got {type(options).__name__}")
    c = check_positive_int(context_parallel, "context_parallel")
    tokens = context_parallel_tokens(seq_len, c)
    check_positive_int(micro_batch, "micro_batch")
    t = check_positive_int(tensor_parallel, "tensor_parallel")
    pipeline = as_pipeline(pipeline)
    if pipeline.stages.ndim or (pipeline.micro_batches is not None and np.ndim(pipeline.micro_batches)):
        raise TypeError("pipeline must be a single setting here, got arrays")
    p = int(pipeline.stages)
    if not isinstance(pipeline_stage, int) or isinstance(pipeline_stage, bool) or not 0 <= pipeline_stage < p:
        raise ValueError(f"pipeline_stage must be a whole number from 0 to {p - 1}, got {pipeline_stage!r}")
    grid = ParallelGrid(config, t, p, pipeline_stage, pipeline.schedule, pipeline.chunks,
                        int(pipeline.micro_batches_or(p)), 1)
    return grid, tokens


def context_parallel_traffic(model, seq_len, micro_batch, context_parallel, tensor_parallel=1,
                             pipeline: Pipeline | int = 1, pipeline_stage=0,
                             options: ActivationOptions = DEFAULT_OPTIONS) -> tuple[ParallelTraffic, ...]:
    """The ring attention's sends of one step on a GPU of ``pipeline_stage``: its layers times
    the pipeline's micro-batches (a :class:`~zerolib.core.memory.model_parallel.Pipeline`, or
    p stages; None micro-batches: p) passes, under ``options``' recomputation and element size
    (see the module doc). Empty for C = 1."""
    grid, tokens = _gpu(model, seq_len, micro_batch, context_parallel, tensor_parallel, pipeline,
                        pipeline_stage, options)
    if grid.config.heads % grid.t:
        raise ValueError(f"tensor_parallel ({grid.t}) must divide heads ({grid.config.heads})")
    return context_rows(grid, tokens, int(micro_batch), int(context_parallel), options.recompute,
                        options.element_bytes)


def context_rows(grid: ParallelGrid, tokens: int, b: int, c: int, recompute: str,
                 e: int) -> tuple[ParallelTraffic, ...]:
    """:func:`context_parallel_traffic` of checked inputs (a grid of one GPU: its t, p, stage r
    and micro-batches per step; ``tokens``: s / C)."""
    if c == 1:
        return ()
    config, t = grid.config, int(grid.t)
    passes = int(grid.micro_batches) * int(stage_layers(config.layers, grid.p, grid.pipeline_stage,
                                                        grid.first_last))
    steps = (c - 1) * passes     # layer passes per step on this GPU, C - 1 sends each
    block = kv_block_bytes(config, tokens, b, t, e)

    def row(phase, what, calls):
        return ParallelTraffic(GROUP, "send", phase, what, calls, block, c)

    rows = [row("forward", "K,V block to the next rank of the ring", steps),
            row("backward", "K,V block to the next rank of the ring", steps),
            row("backward", "dK,dV of the block it came with, to the next rank (the last home)", steps)]
    if recompute != "none":
        rows.append(row("backward", "recomputed attention: K,V block to the next rank", steps))
    return tuple(rows)


def partitioned_checkpoint_traffic(model, seq_len, micro_batch, tensor_parallel,
                                   pipeline: Pipeline | int = 1, pipeline_stage=0, *,
                                   context_parallel=1,
                                   options: ActivationOptions = DEFAULT_OPTIONS) -> tuple[ParallelTraffic, ...]:
    """ZeRO-R P_a's all-gathers of one step on a GPU of ``pipeline_stage``: one per layer pass,
    of the whole checkpoint, over the t tensor-parallel GPUs (module doc). Empty for t = 1 or
    under ``options``' sequence parallelism (nothing to gather: the checkpoint is split
    already)."""
    grid, tokens = _gpu(model, seq_len, micro_batch, context_parallel, tensor_parallel, pipeline,
                        pipeline_stage, options)
    return checkpoint_rows(grid, tokens, int(micro_batch), options.sequence_parallel,
                           options.element_bytes)


def checkpoint_rows(grid: ParallelGrid, tokens: int, b: int, sp: bool,
                    e: int) -> tuple[ParallelTraffic, ...]:
    """:func:`partitioned_checkpoint_traffic` of checked inputs (see :func:`context_rows`)."""
    config, t = grid.config, int(grid.t)
    gathered = checkpoint_terms_of(tokens, b, config.hidden, t, e, sp, True, False)["gathered"]
    if not gathered:
        return ()
    passes = int(grid.micro_batches) * int(stage_layers(config.layers, grid.p, grid.pipeline_stage))
    return (ParallelTraffic("tensor", "all-gather", "backward",
                            "partitioned activation checkpoint, gathered before its layer is recomputed (P_a)",
                            passes, gathered, t),)


def checkpoint_host_bytes(model, seq_len, micro_batch, tensor_parallel=1,
                          pipeline: Pipeline | int = 1, pipeline_stage=0, *, context_parallel=1,
                          options: ActivationOptions = DEFAULT_OPTIONS) -> Mapping[str, int]:
    """P_a+cpu's copies per step and GPU, bytes: ``to_host`` in the forward (each layer's
    checkpoint as this GPU keeps it: 1 / t of it with ``options``' P_a or sequence parallelism)
    and ``from_host`` in the backward (the same bytes back before the layer is recomputed)."""
    grid, tokens = _gpu(model, seq_len, micro_batch, context_parallel, tensor_parallel, pipeline,
                        pipeline_stage, options)
    host = checkpoint_terms_of(tokens, int(micro_batch), grid.config.hidden, int(grid.t),
                               options.element_bytes, options.sequence_parallel,
                               options.partition_activations, True)["host"]
    moved = int(grid.micro_batches) * int(stage_layers(grid.config.layers, grid.p, pipeline_stage)) * host
    return MappingProxyType({"to_host": moved, "from_host": moved})


def assumptions(config, gpus: int, settings) -> dict:
    """What an estimate with context parallelism or ZeRO-R assumed, for its JSON (empty when
    neither is asked for): the degrees and groups, one K,V block and the ring's bytes per step,
    one checkpoint's bytes and P_a's and P_a+cpu's per step, on a GPU of the first pipeline
    stage with ``settings.micro_batches`` (default: p) micro-batches. ``settings`` is a checked
    :class:`zerolib.core.memory.working_set.WorkingSetSettings`."""
    s = settings
    c, t, p = s.context_parallel, s.tensor_parallel, s.pipeline_parallel
    tokens = s.seq_len // c
    m = p if s.micro_batches is None else s.micro_batches
    out = {}
    if c > 1:
        grid = ParallelGrid(config, t, p, 0, s.pipeline_schedule, s.pipeline_chunks, m, 1)
        rows = context_rows(grid, tokens, s.micro_batch, c, s.recompute, s.element_bytes)
        out["context_parallel"] = {
            "degree": c, "tokens_per_sequence_per_gpu": tokens,
            "data_parallel": gpus // (t * c * p), "zero_group": gpus // (t * p),
            "ring": {"gpus": c, "stride": t},
            "kv_block_bytes": kv_block_bytes(config, tokens, s.micro_batch, t, s.element_bytes),
            "ring_sends_per_step": sum(row.calls for row in rows),
            "ring_sent_bytes_per_step": sum(row.total_bytes for row in rows),
            "assumed": [
                "each sequence is cut into 2C chunks, rank i keeping chunks i and 2C-1-i "
                "(Megatron-LM's causal load balancing): s/C tokens per GPU",
                "activations are those of s/C tokens (flash attention: every term is "
                "proportional to the tokens); the ring's transient K,V buffers are left out",
                "ranks in Megatron-LM's order tp-cp-ep-dp-pp: a ring is C GPUs t apart",
                "ZeRO shards over the d x C GPUs of the data- and context-parallel group",
                "ring attention as TransformerEngine's p2p: C-1 K,V sends per layer forward, "
                "C-1 K,V and C-1 dK,dV backward, C-1 more when recomputation reruns attention",
                "micro-batches per step: the settings' micro_batches, else the pipeline depth",
            ]}
    if s.partition_activations or s.cpu_checkpointing:
        layers = m * int(stage_layers(config.layers, p, 0))
        one = checkpoint_terms_of(tokens, s.micro_batch, config.hidden, t, s.element_bytes,
                                  s.sequence_parallel, s.partition_activations, s.cpu_checkpointing)
        out["zero_r"] = {
            "partition_activations": s.partition_activations, "cpu_checkpointing": s.cpu_checkpointing,
            "checkpoint_bytes_per_layer": dict(one),
            "all_gather_bytes_per_step": layers * one["gathered"],
            "host_copy_bytes_per_step": {"to_host": layers * one["host"], "from_host": layers * one["host"]},
            "assumed": [
                "P_a (ZeRO Sec. VI-A; DeepSpeed partition_activations): each layer's checkpoint "
                "split over the t tensor-parallel GPUs, all-gathered once before recomputation",
                "P_a+cpu (DeepSpeed cpu_checkpointing): checkpoints in host memory, copied down "
                "in the forward and back in the backward",
                "C_B (Sec. VI-B): the reduce bucket is reduce_bucket_size elements whatever the model",
                "M_D (Sec. VI-C; DeepSpeed contiguous_memory_optimization): no bytes of its own, it "
                "keeps the counted bytes in one piece (the reserve stands in for fragmentation)",
            ]}
    return out
