"""Expert parallelism: what one GPU holds of a mixture of experts' model state, exact to the byte.

Without expert parallelism every GPU of a tensor-parallel group holds every routed expert (each
split over the t ranks as a dense MLP is), and ZeRO shards all of it over the d data-parallel
replicas: to ZeRO's stages an expert is dense model state like any other, whichever tokens it
sees. Expert parallelism (Lepikhin et al. 2020, "GShard"; Megatron-LM's
``--expert-model-parallel-size``, DeepSpeed-MoE's ``ep_size``) gives each of E ranks
``experts / E`` whole experts of every layer with experts instead; expert tensor parallelism
(Megatron-LM's ``--expert-tensor-parallel-size``, ETP, by default equal to t) splits each expert's
projections over ETP ranks as :mod:`zerolib.core.memory.model_parallel` splits a dense MLP.

The two parts are sharded over different groups:

- the **dense part** (embedding, attention, norms, the router, shared experts, the dense first
  layers, the output layer) over the d data-parallel replicas, as before;
- the **routed experts** over the **expert-data-parallel** group, the GPUs holding the same
  experts: Megatron-LM lays the world out twice, t x cp x d x p for the dense part and
  ETP x E x EDP x p for the experts (``megatron/core/parallel_state.py``,
  ``expert_data_parallel_size = world / (ETP x EP x PP)``), so EDP = t x d / (ETP x E) here (no
  context parallelism); DeepSpeed-MoE carves the expert-parallel group out of the data-parallel
  one (``deepspeed/utils/groups.py``: expert data parallel = d / E), which is the same number when
  ETP = t. ZeRO stages 1 and 2 (Megatron-LM's distributed optimizer) shard the experts' state over
  that group (DeepSpeed keeps MoE parameters in their own groups, partitioned over
  ``expert_data_parallel_group``).

Validity (:data:`RULES`): E divides the routed experts; ETP divides the experts' width
(``ffn_hidden``); ETP x E divides t x d (the expert grid tiles the same GPUs as the dense one).

Which GPU is the most loaded: each pipeline stage's dense and expert parts are sharded over
their own groups, so the stage with the most bytes is found by computing every candidate stage
(:func:`zerolib.core.memory.model_parallel.candidate_stages`). Scalar settings, Python ints.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType

import numpy as np

from zerolib.core.catalogue.models import EXPERT_MODULES, TransformerConfig, get_model
from zerolib.core.inputs import MAX_GPUS, check_positive_int, check_stage
from zerolib.core.memory.accounting import Layout, ModelState, get_layout, state_bytes
from zerolib.core.memory.model_parallel import (
    Pipeline,
    as_pipeline,
    candidate_stages,
    module_splits,
    parallel_grid,
    parameters_on,
    rank_elements,
    stage_dense_layers,
    stage_layers,
)

RULES: Mapping[str, str] = MappingProxyType({
    "moe": "expert_parallel and expert_tensor_parallel above 1 need a mixture of experts",
    "experts": "expert_parallel must divide the routed experts",
    "expert_ffn": "expert_tensor_parallel must divide ffn_hidden (each expert's width)",
    "expert_grid": "expert_tensor_parallel x expert_parallel must divide tensor_parallel x data_parallel",
})


@dataclass(frozen=True)
class ExpertLayout:
    """The checked groups of one setting (ints; int64 arrays of checked settings on the
    planner's path, :func:`expert_state_of`)."""

    tensor_parallel: int
    pipeline_parallel: int
    data_parallel: int
    expert_parallel: int
    expert_tensor_parallel: int

    @property
    def expert_data_parallel(self) -> int:
        """GPUs holding the same experts: t x d / (ETP x E) (Megatron-LM's world / (ETP x EP x PP))."""
        return self.tensor_parallel * self.data_parallel // (self.expert_tensor_parallel
                                                             * self.expert_parallel)


def expert_rules(model, tensor_parallel: int, data_parallel: int, expert_parallel: int,
                 expert_tensor_parallel: int | None = None) -> dict[str, bool]:
    """For each rule of :data:`RULES`, True where the setting obeys it (ETP None: t)."""
    config = get_model(model)
    t, d, e = tensor_parallel, data_parallel, expert_parallel
    etp = t if expert_tensor_parallel is None else expert_tensor_parallel
    moe = config.mixture_of_experts
    return {"moe": moe or (e == 1 and etp == t),
            "experts": not moe or config.experts % e == 0,
            "expert_ffn": not moe or config.ffn_hidden % etp == 0,
            "expert_grid": (t * d) % (etp * e) == 0}


def expert_parallel_degrees(model, tensor_parallel: int, data_parallel: int,
                            expert_tensor_parallel: int | None = None) -> tuple[int, ...]:
    """Every E that :data:`RULES` allow beside t and d (ETP None: t), smallest first: the
    choices a search over expert parallelism enumerates ((1,) for a dense model)."""
    config = get_model(model)
    if not config.mixture_of_experts:
        return (1,)
    return tuple(e for e in range(1, config.experts + 1)
                 if all(expert_rules(config, tensor_parallel, data_parallel, e,
                                     expert_tensor_parallel).values()))


def check_expert_layout(model, tensor_parallel, pipeline_parallel, data_parallel, expert_parallel,
                        expert_tensor_parallel=None) -> ExpertLayout:
    """Check the groups (whole numbers, :data:`RULES`); a ValueError names the broken rule with
    the model's numbers and the setting."""
    config = get_model(model)
    t = check_positive_int(tensor_parallel, "tensor_parallel", MAX_GPUS)
    p = check_positive_int(pipeline_parallel, "pipeline_parallel", MAX_GPUS)
    d = check_positive_int(data_parallel, "data_parallel", MAX_GPUS)
    e = check_positive_int(expert_parallel, "expert_parallel", MAX_GPUS)
    etp = t if expert_tensor_parallel is None else check_positive_int(
        expert_tensor_parallel, "expert_tensor_parallel", MAX_GPUS)
    facts = {"moe": "no experts", "experts": f"{config.experts} routed experts",
             "expert_ffn": f"ffn_hidden {config.ffn_hidden}", "expert_grid": f"t x d = {t * d}"}
    for name, ok in expert_rules(config, t, d, e, etp).items():
        if not ok:
            raise ValueError(f"{RULES[name]}: {config.name} has {facts[name]}; got expert_parallel "
                             f"{e}, expert_tensor_parallel {etp}, tensor_parallel {t}, "
                             f"data_parallel {d}")
    return ExpertLayout(t, p, d, e, etp)


def routed_expert_elements(config: TransformerConfig, tensor_parallel: int,
                           experts_held: int) -> int:
    """Elements of ``experts_held`` routed experts of one layer on one rank of a
    ``tensor_parallel``-way split (the rules of :data:`~zerolib.core.memory.model_parallel.MODULE_SPLITS`)."""
    total = 0
    for piece in module_splits(config):
        if piece.name in EXPERT_MODULES:
            total += int(rank_elements(piece, tensor_parallel)) * experts_held
    return total


@dataclass(frozen=True)
class ExpertStageParameters:
    """Parameters one GPU of a pipeline stage holds, before ZeRO: the dense part and its experts."""

    pipeline_stage: int
    expert_layers: int        # layers with experts on this stage
    dense: int                # everything but the routed experts (t-way split)
    experts: int              # its experts / E routed experts per layer (ETP-way split)


def stage_parameters(model, layout: ExpertLayout, pipeline_stage: int, *, schedule: str = "1f1b",
                     chunks: int = 1, vocab_divisible_by: int = 1) -> ExpertStageParameters:
    """:class:`ExpertStageParameters` of one checked layout at ``pipeline_stage``."""
    config = get_model(model)
    t, p, e, etp = (layout.tensor_parallel, layout.pipeline_parallel, layout.expert_parallel,
                    layout.expert_tensor_parallel)
    grid = parallel_grid(config, t, p, pipeline_stage, schedule, chunks,
                         vocab_divisible_by=vocab_divisible_by)
    whole = int(parameters_on(grid))    # every expert on the rank, t-way split
    expert_layers = 0
    if config.mixture_of_experts:
        expert_layers = int(stage_layers(config.layers, p, pipeline_stage)
                            - stage_dense_layers(config, p, pipeline_stage, schedule=schedule,
                                                 chunks=chunks))
    all_experts = expert_layers * routed_expert_elements(config, t, config.experts)
    held = expert_layers * routed_expert_elements(config, etp, config.experts // e) if expert_layers else 0
    return ExpertStageParameters(pipeline_stage, expert_layers, whole - all_experts, held)


@dataclass(frozen=True)
class ExpertModelState:
    """Persistent bytes on the most-loaded GPU: the dense part sharded over d, the experts over
    the expert-data-parallel group (each a dict of :func:`~zerolib.core.memory.accounting.state_bytes`)."""

    layout: ExpertLayout
    stage: int
    parameters: ExpertStageParameters
    dense: Mapping[str, int]
    experts: Mapping[str, int]

    @property
    def total(self) -> int:
        return self.dense["total"] + self.experts["total"]

    def category(self, name: str) -> int:
        """Bytes of ``parameters``, ``gradients`` or ``optimizer`` (both parts)."""
        return self.dense[name] + self.experts[name]

    def as_dict(self) -> dict:
        """Plain values for JSON: what was assumed, both parts and the total."""
        lay = self.layout
        return {"expert_parallel": lay.expert_parallel,
                "expert_tensor_parallel": lay.expert_tensor_parallel,
                "data_parallel": lay.data_parallel,
                "expert_data_parallel": lay.expert_data_parallel,
                "pipeline_stage": self.parameters.pipeline_stage,
                "expert_layers_on_stage": self.parameters.expert_layers,
                "dense_parameters": self.parameters.dense,
                "expert_parameters": self.parameters.experts,
                "dense_bytes": {k: v for k, v in self.dense.items() if k != "cluster_total"},
                "expert_bytes": {k: v for k, v in self.experts.items() if k != "cluster_total"},
                "total_bytes": self.total}


def expert_model_state(model, tensor_parallel: int, pipeline: Pipeline | int, data_parallel: int,
                       stage: int, layout: str | Layout = "mixed-adam", *, expert_parallel: int = 1,
                       expert_tensor_parallel: int | None = None) -> ExpertModelState:
    """ZeRO ``stage`` on the GPU of a t x p x d grid holding the most bytes, with E-way expert
    parallelism: the dense part sharded over d, the routed experts over t x d / (ETP x E).
    ``pipeline``: a :class:`~zerolib.core.memory.model_parallel.Pipeline` (its schedule places
    the dense first layers) or its number of stages (1F1B). With E = 1 and ETP = t this equals
    :func:`~zerolib.core.memory.model_parallel.model_state_per_gpu`. One given stage (and
    Megatron-LM's padded vocabulary): :func:`state_of` of :func:`stage_parameters`."""
    config = get_model(model)
    pipeline = as_pipeline(pipeline)
    if pipeline.stages.ndim:
        raise TypeError("pipeline must have a single number of stages here, got an array")
    lay = check_expert_layout(config, tensor_parallel, int(pipeline.stages), data_parallel,
                              expert_parallel, expert_tensor_parallel)
    stage = int(check_stage(stage))
    widths = get_layout(layout)
    best = None
    for r in sorted({int(r) for r in candidate_stages(config, lay.pipeline_parallel)}):
        params = stage_parameters(config, lay, r, schedule=pipeline.schedule, chunks=pipeline.chunks)
        found = state_of(lay, params, stage, widths)
        if best is None or found.total > best.total:
            best = found
    return best


def state_of(layout: ExpertLayout, params: ExpertStageParameters, stage: int,
             widths: Layout) -> ExpertModelState:
    """The bytes of checked ``params`` at ZeRO ``stage``: the dense part over d, the experts
    over the expert-data-parallel group (a caller holding the parameters of many stages)."""
    return ExpertModelState(
        layout, stage, params,
        MappingProxyType(state_bytes(params.dense, layout.data_parallel, stage, widths)),
        MappingProxyType(state_bytes(params.experts, layout.expert_data_parallel, stage, widths)))


# --- the planner's path: arrays of checked settings ---------------------------------------------

def expert_layers_of(config: TransformerConfig, pipeline_parallel, pipeline_stage, *,
                     schedule: str = "1f1b", chunks: int = 1) -> np.ndarray:
    """Layers with routed experts on pipeline stage r of p (arrays; 0 for a dense model)."""
    p = np.asarray(pipeline_parallel, dtype=np.int64)
    r = np.asarray(pipeline_stage, dtype=np.int64)
    if not config.mixture_of_experts:
        return np.zeros(np.broadcast(p, r).shape, dtype=np.int64)
    return (stage_layers(config.layers, p, r)
            - stage_dense_layers(config, p, r, schedule=schedule, chunks=chunks)).astype(np.int64)


@lru_cache(maxsize=64)
def _expert_splits(config: TransformerConfig) -> tuple:
    """The routed experts' modules with their split rules, looked up once per model (the step
    time asks for them on every stage of every context-parallel degree)."""
    return tuple(piece for piece in module_splits(config) if piece.name in EXPERT_MODULES)


def expert_elements_of(config: TransformerConfig, tensor_parallel, experts_held) -> np.ndarray:
    """:func:`routed_expert_elements` for arrays of checked split degrees (t, or ETP) and
    experts held."""
    t = np.asarray(tensor_parallel, dtype=np.int64)
    per_expert = sum((rank_elements(piece, t) for piece in _expert_splits(config)),
                     np.zeros_like(t))
    return per_expert * np.asarray(experts_held, dtype=np.int64)


def expert_state_of(config: TransformerConfig, params, expert_layers, layout: ExpertLayout, stage,
                    widths: Layout) -> np.ndarray:
    """Persistent bytes per GPU holding ``params`` (every routed expert t-split, as the dense
    count has them) with E-way expert parallelism: :func:`state_of` for arrays (``layout`` of
    int64 arrays, its ``data_parallel`` the ZeRO group), the dense part over that group, the
    experts / E held, split ETP ways, over t x group / (ETP x E) (whole shard groups)."""
    e, t, etp = layout.expert_parallel, layout.tensor_parallel, layout.expert_tensor_parallel
    every = expert_layers * expert_elements_of(config, t, config.experts)
    held = expert_layers * expert_elements_of(config, etp, config.experts // e)
    return (ModelState(params - every, layout.data_parallel, stage, widths).total
            + ModelState(held, layout.expert_data_parallel, stage, widths).total)
