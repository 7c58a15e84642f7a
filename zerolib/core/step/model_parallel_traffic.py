"""What tensor and pipeline parallelism send per training step, one GPU, collective by collective.

Pure counting, no time: each :class:`ParallelTraffic` row is one kind of collective with how
often a GPU calls it per step and how large the tensor is. ``tensor_bytes`` is the whole tensor a call
reduces or produces (an all-reduce's input, an all-gather's output, a reduce-scatter's input, a
point-to-point message); what a ring then puts on each link ((t - 1)/t of it per all-gather or
reduce-scatter, twice that per all-reduce) is the link model's business, not this module's.

Tensor parallelism (Shoeybi et al. 2019, arXiv 1909.08053, Sec. 3 and Fig. 3-4): per layer
and micro-batch, two all-reduces of the b x s x h activations in the forward pass (after the
attention output and MLP down projections, the "g" operators) and two in the backward pass
(before the QKV and MLP up projections, the "f" operators): "only two all-reduces in the
forward path and two in the backward path". Full recomputation re-runs each layer's forward
pass during the backward pass, and with it the two forward all-reduces.

Sequence parallelism (Korthikanti et al., MLSys 2023, arXiv 2205.05198, Sec. 4.2.2, Fig. 5): each
all-reduce becomes an all-gather before the column-parallel projection and a reduce-scatter
after the row-parallel one ("four all-gathers and four reduce-scatters in a single forward and
backward pass"), the same ring bandwidth. Megatron-LM keeps only the sequence shard of the
projections' inputs and gathers it again in the backward pass for the weight gradient ("an
extra all-gather in the backward pass", ``LinearWithGradAccumulationAndAsyncCommunication``):
two more all-gathers per layer, listed on their own.

Mixture-of-experts layers under sequence parallelism (Megatron-LM, which requires sequence
parallelism for MoE training at t > 1): the attention's collectives over t stay, the MLP's do not
run; the layer's routed experts are gathered and reduce-scattered by the token dispatcher over
the expert-tensor-parallel ranks instead (:mod:`zerolib.core.step.expert_parallel_traffic`
counts those), and a shared expert, a dense MLP over t, keeps the MLP's rows
(:func:`moe_mlp_free_layers`).

Around the layers (Megatron-LM): the vocabulary-parallel embedding's output is all-reduced in
the forward pass (reduce-scattered under sequence parallelism, all-gathered back in backward);
the output layer's input is all-reduced in the backward pass (gathered in forward and
reduce-scattered in backward under sequence parallelism); the vocabulary-parallel cross
entropy all-reduces three fp32 values per token in the forward pass (the maximum logit, the
target's logit, the sum of exponentials: ``megatron/core/tensor_parallel/cross_entropy.py``).

Pipeline parallelism (Narayanan et al. 2021, arXiv 2104.04473, Sec. 3.2): "the total amount of
communication that needs to be performed between every pair of consecutive devices (for either
the forward or backward pass) for each microbatch is bsh": each stage but the last sends each
micro-batch's activations forward, each but the first sends its gradient back. Under sequence
parallelism each tensor-parallel rank sends only its sequence shard, bsh/t (Megatron-LM
``schedules.py`` divides the message's sequence length by the tensor-parallel size); without it,
Narayanan et al.'s scatter/gather optimisation (Sec. 4.1, ``scatter_gather=True``) also sends
bsh/t and the receiving group all-gathers the message. The interleaved schedule sends across
every chunk boundary: "the amount of communication also increases by v".
"""
from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from zerolib.core.catalogue.models import get_model
from zerolib.core.inputs import MAX_BYTES, check_flag, check_positive_int, echo
from zerolib.core.memory.activations import DEFAULT_OPTIONS, ActivationOptions
from zerolib.core.memory.expert_parallel import expert_layers_of
from zerolib.core.memory.model_parallel import (
    ParallelGrid,
    Pipeline,
    as_pipeline,
    check_parallel,
    stage_layers,
)

if TYPE_CHECKING:  # pandas is imported where a frame is built: commands that build none start without it
    import pandas as pd

GROUPS = ("tensor", "pipeline")
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "send")
PASSES = ("forward", "backward")   # the passes a model-parallel row runs in
LOSS_BYTES = 4  # the vocabulary-parallel cross entropy reduces fp32 values


@dataclass(frozen=True)
class ParallelTraffic:
    """One kind of collective a GPU calls in one step."""

    group: str          # "tensor" (within the tensor-parallel group) or "pipeline"
    collective: str     # one of COLLECTIVES
    phase: str          # "forward" or "backward" (recomputation runs inside backward)
    what: str           # which tensor, in words
    calls: int          # calls per step on this GPU
    tensor_bytes: int   # bytes of the whole tensor of one call (see the module doc)
    group_size: int     # GPUs taking part (2 for a send)

    @property
    def total_bytes(self) -> int:
        return self.calls * self.tensor_bytes


@lru_cache(maxsize=4096)
def _check_setting(config, t, p, schedule, chunks, m) -> None:
    """:func:`check_parallel` of one scalar setting, remembered: a plan asks for the same
    (t, p, schedule) once per recomputation, micro-batch and stage."""
    check_parallel(config, t, Pipeline(p, schedule, chunks, m))


def _common(model, seq_len, micro_batch, tensor_parallel, pipeline, pipeline_stage,
            options: ActivationOptions):
    """The checked grid of one GPU (its pipeline's micro-batches per step: None is p, the fewest
    that fill it) and the bytes of one b x s x h activation."""
    config = get_model(model)
    if not isinstance(options, ActivationOptions):
        raise TypeError(f"options must be an ActivationOptions, got {type(options).__name__}")
    pipeline = as_pipeline(pipeline)
    s = check_positive_int(seq_len, "seq_len")
    b = check_positive_int(micro_batch, "micro_batch")
    t = check_positive_int(tensor_parallel, "tensor_parallel")
    if pipeline.stages.ndim or (pipeline.micro_batches is not None and np.ndim(pipeline.micro_batches)):
        raise TypeError("pipeline must be a single setting here, got arrays")
    p = int(pipeline.stages)
    m = int(pipeline.micro_batches_or(p))
    if (isinstance(pipeline_stage, (bool, np.bool_)) or not isinstance(pipeline_stage, numbers.Integral)
            or not 0 <= pipeline_stage < p):
        raise ValueError(f"pipeline_stage must be a whole number from 0 to {p - 1}, got {echo(pipeline_stage)}")
    _check_setting(config, t, p, pipeline.schedule, pipeline.chunks, m)
    activation = options.element_bytes * s * b * config.hidden
    if activation > MAX_BYTES // (16 * config.layers * m):
        raise ValueError(f"traffic of {config.name} comes to more than {MAX_BYTES:,} bytes per step: "
                         f"lower seq_len, micro_batch or micro_batches")
    grid = ParallelGrid(config, t, p, int(pipeline_stage), pipeline.schedule, pipeline.chunks, m, 1)
    return grid, s * b, activation


def tensor_parallel_traffic(model, seq_len, micro_batch, tensor_parallel,
                            pipeline: Pipeline | int = 1, pipeline_stage=0,
                            options: ActivationOptions = DEFAULT_OPTIONS) -> tuple[ParallelTraffic, ...]:
    """The tensor-parallel collectives of one step on a GPU of ``pipeline_stage``: its layers
    times the pipeline's micro-batches (a :class:`~zerolib.core.memory.model_parallel.Pipeline`,
    or p stages; None micro-batches: p), plus the embedding (first stage) and the output layer
    and loss (last stage), under ``options``' sequence parallelism, recomputation and element
    size. Empty for t = 1."""
    grid, tokens, bsh = _common(model, seq_len, micro_batch, tensor_parallel, pipeline,
                                pipeline_stage, options)
    return tensor_rows(grid, tokens, bsh, options.sequence_parallel, options.recompute)


def moe_mlp_free_layers(config, p: int, r: int, sequence_parallel: bool) -> int:
    """Layers on pipeline stage r whose MLP runs no collective over the t ranks: the MoE layers
    of a mixture without a shared expert, under sequence parallelism (0 otherwise).

    Megatron-LM (d98e8a64) hands a MoE layer its input as the sequence shard and gets its output
    back as one: the routed experts' all-gather and reduce-scatter run in the token dispatcher
    over the expert-tensor-parallel group (``megatron/core/transformer/moe/token_dispatcher.py``
    86: ``self.tp_group = pg_collection.expt_tp``; 741-751 and 829), counted by
    :mod:`zerolib.core.step.expert_parallel_traffic` at any ETP above 1, ETP = t included. A
    shared expert is a dense MLP over t (``SharedExpertMLP``) and keeps its collectives. Without
    sequence parallelism Megatron-LM refuses MoE training at t > 1 (``moe_layer.py`` 636); the
    dense MLP's all-reduces stand in there."""
    if not (sequence_parallel and config.mixture_of_experts) or config.shared_expert_ffn:
        return 0
    return int(expert_layers_of(config, p, r))


def tensor_rows(grid: ParallelGrid, tokens: int, bsh: int, sp: bool,
                recompute: str) -> tuple[ParallelTraffic, ...]:
    """:func:`tensor_parallel_traffic` of checked inputs (a grid of one GPU: its t, p, stage r
    and micro-batches per step; ``tokens``: s x b of a micro-batch; ``bsh``: bytes of one
    b x s x h activation): the step model's path, whose caller checked them once, and the
    estimate's. The one count of a layer's collectives over t: every layer's attention, and the
    MLP of the layers whose MLP runs over t (all but :func:`moe_mlp_free_layers`)."""
    config, t, p, r, m = grid.config, int(grid.t), int(grid.p), int(grid.pipeline_stage), int(grid.micro_batches)
    if t == 1:
        return ()
    held = int(stage_layers(config.layers, p, r, grid.first_last))
    passes = m * held   # layer passes per step on this GPU
    # Sublayers whose collectives run over t: every layer's attention, and the MLP of every
    # layer but a routed-only MoE layer under sequence parallelism (see moe_mlp_free_layers).
    both = passes + m * (held - moe_mlp_free_layers(config, p, r, sp))
    only = "" if both == 2 * passes else " (the MLP's in the layers that have one over t)"

    def row(collective, phase, what, calls, size=bsh):
        return ParallelTraffic("tensor", collective, phase, what, calls, size, t)

    rows = []
    if sp:
        rows += [row("all-gather", "forward", "layer inputs before the QKV and MLP up projections" + only, both),
                 row("reduce-scatter", "forward", "attention and MLP outputs" + only, both),
                 row("reduce-scatter", "backward", "gradients of the gathered layer inputs" + only, both),
                 row("all-gather", "backward", "gradients of the attention and MLP outputs" + only, both),
                 row("all-gather", "backward", "saved sequence shards of the projections' inputs, "
                                               "gathered again for the weight gradients" + only, both)]
        if recompute == "full":
            rows += [row("all-gather", "backward", "recomputed forward: layer inputs" + only, both),
                     row("reduce-scatter", "backward", "recomputed forward: attention and MLP outputs"
                         + only, both)]
    else:
        rows += [row("all-reduce", "forward", "attention and MLP outputs (g)", 2 * passes),
                 row("all-reduce", "backward", "gradients of the QKV and MLP up projections' inputs (f)",
                     2 * passes)]
        if recompute == "full":
            rows.append(row("all-reduce", "backward", "recomputed forward: attention and MLP outputs",
                            2 * passes))
    if r == 0:
        if sp:
            rows += [row("reduce-scatter", "forward", "vocabulary-parallel embedding output", m),
                     row("all-gather", "backward", "gradient of the embedding output", m)]
        else:
            rows.append(row("all-reduce", "forward", "vocabulary-parallel embedding output", m))
    if r == p - 1:
        if sp:
            rows += [row("all-gather", "forward", "output layer input", m),
                     row("reduce-scatter", "backward", "gradient of the output layer input", m)]
        else:
            rows.append(row("all-reduce", "backward", "gradient of the output layer input", m))
        rows.append(row("all-reduce", "forward", "cross entropy: maximum logit, target logit, sum of "
                                                 "exponentials per token (fp32)", 3 * m,
                        LOSS_BYTES * tokens))
    return tuple(rows)


def pipeline_traffic(model, seq_len, micro_batch, tensor_parallel, pipeline: Pipeline | int,
                     pipeline_stage=0, *, scatter_gather=False,
                     options: ActivationOptions = DEFAULT_OPTIONS) -> tuple[ParallelTraffic, ...]:
    """The point-to-point messages a GPU of ``pipeline_stage`` sends in one step under
    ``pipeline`` (its schedule; None micro-batches: p) (and, with the scatter/gather
    optimisation or ``options``' sequence parallelism, the all-gathers that rebuild what it
    receives). Empty for p = 1."""
    grid, _, bsh = _common(model, seq_len, micro_batch, tensor_parallel, pipeline, pipeline_stage,
                           options)
    sp = options.sequence_parallel
    split = check_flag(scatter_gather, "scatter_gather") or sp
    return pipeline_rows(grid, bsh, sp, split)


def pipeline_rows(grid: ParallelGrid, bsh: int, sp: bool, split: bool) -> tuple[ParallelTraffic, ...]:
    """:func:`pipeline_traffic` of checked inputs (see :func:`tensor_rows`; the grid's config
    unread)."""
    t, p, r, m = int(grid.t), int(grid.p), int(grid.pipeline_stage), int(grid.micro_batches)
    if p == 1:
        return ()
    message = bsh // t if split and t > 1 else bsh
    v = grid.chunks if grid.schedule == "interleaved" else 1
    forward = m * (v - (r == p - 1))     # every chunk boundary but the model's last
    backward = m * (v - (r == 0))        # every chunk boundary but the model's first
    rows = [ParallelTraffic("pipeline", "send", "forward", "activations to the next stage", forward, message, 2),
            ParallelTraffic("pipeline", "send", "backward", "activation gradients to the previous stage",
                    backward, message, 2)]
    if split and not sp and t > 1:
        # Each received bsh/t piece is all-gathered across the tensor-parallel group.
        rows += [ParallelTraffic("tensor", "all-gather", "forward", "received activations (scatter/gather)",
                         m * (v - (r == 0)), bsh, t),
                 ParallelTraffic("tensor", "all-gather", "backward", "received gradients (scatter/gather)",
                         m * (v - (r == p - 1)), bsh, t)]
    return tuple(row for row in rows if row.calls)


def traffic_frame(rows) -> pd.DataFrame:
    """ParallelTraffic rows as a tidy frame with ``total_bytes`` (calls x tensor_bytes)."""
    import pandas as pd
    frame = pd.DataFrame([{**asdict(row), "total_bytes": row.total_bytes} for row in rows],
                         columns=[*ParallelTraffic.__dataclass_fields__, "total_bytes"])
    return frame
