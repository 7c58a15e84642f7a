"""ZeRO-R's time in a training step: P_a's all-gathers and P_a+cpu's host copies, per micro-batch.

ZeRO-R in the step (``partition_activations``, ``cpu_checkpointing``: arrays, full
recomputation only): P_a all-gathers each layer's
checkpoint (s / C x b x h elements) over the t tensor-parallel GPUs before the layer is
recomputed, every micro-batch, and P_a+cpu copies the checkpoint as the GPU keeps it (1 / t of
it with P_a or sequence parallelism) to the host in the forward and back in the backward, on
``host_link``. Both are in the ``tensor`` part and neither is overlapped: DeepSpeed's
``CheckpointFunction.backward`` calls ``gather_partitioned_activations`` (a blocking
``dist.all_gather``; its ``transport_stream`` is commented out) and then reruns the layer, and
the forward's ``partition.cpu()`` and the backward's copy up are blocking too
(``runtime/activation_checkpointing/checkpointing.py``). Under sequence parallelism or at t = 1
nothing is gathered.

:mod:`zerolib.core.step.context_parallel_traffic` counts the same bytes
(``partitioned_checkpoint_traffic``, ``checkpoint_host_bytes``);
:func:`zerolib.core.step.parallel.parallel_step_time` adds these seconds to its ``tensor`` part.
"""
from __future__ import annotations

import numpy as np

from zerolib.core.intmath import ceil_div
from zerolib.core.memory.activations import RECOMPUTE
from zerolib.core.memory.model_parallel import stage_layers
from zerolib.core.step.collectives import CHUNKS_SENT, ring_timing_of


def checkpoint_seconds(config, ic, st, r):
    """ZeRO-R's seconds per micro-batch on stage r of the checked settings ``st`` (a
    :class:`~zerolib.core.step.parallel.ParallelSettings` of one context-parallel degree), in the
    ``tensor`` part (module doc): per layer, P_a's all-gather of the checkpoint's s / C x b x h
    elements over the t GPUs, and P_a+cpu's copy of the checkpoint as this GPU keeps it to the
    host and back, on its ``host_link``; none of it overlapped."""
    s, e, b, t, p = (st.seq_len // st.context_parallel, st.element_bytes, st.micro_batch,
                     st.tensor_parallel, st.pipeline_parallel)
    sp, pa, cpu = st.sequence_parallel, st.partition_activations, st.cpu_checkpointing
    full = st.recompute == RECOMPUTE.index("full")
    gather = pa & full & (t > 1) & ~sp
    copy = cpu & full
    if not (np.any(gather) or np.any(copy)):
        return np.zeros(np.shape(b))
    layers = stage_layers(config.layers, p, r, (st.first_layers, st.last_layers))
    elements = s * b * config.hidden               # one checkpoint, whole (s: this CP rank's)
    latency, bandwidth = ring_timing_of(ic, "all_gather", np.where(gather, t, 2))
    sent = CHUNKS_SENT["all_gather"] * (t - 1) * ceil_div(e * elements, t)
    gathered = np.where(gather, latency + sent / bandwidth, 0.0)
    kept = e * ceil_div(elements, np.where(pa | sp, t, 1))   # P_a or SP: 1 / t of it
    copies = np.where(copy, 2 * kept / float(st.host_link.bandwidth), 0.0)   # down, then back
    return layers * (gathered + copies)
