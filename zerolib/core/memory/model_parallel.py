"""Tensor and pipeline parallelism beside ZeRO: what one GPU holds, exact to the parameter.

``gpus`` = t x p x d: a tensor-parallel group of t GPUs splits every layer's matrices, p
pipeline stages each hold a contiguous run of layers, and d data-parallel replicas of that
(t x p) grid are what ZeRO shards over (:func:`model_state_per_gpu`).

How each module splits over the t tensor-parallel ranks (Shoeybi et al. 2019, "Megatron-LM",
arXiv 1909.08053, Sec. 3; Megatron-LM ``megatron/core/tensor_parallel/layers.py``), one rule per
module name of :func:`zerolib.core.catalogue.models.modules` (:data:`MODULE_SPLITS`; a name without a
rule is an error, so a new kind of module cannot be counted by accident):

- ``column``: the output dimension is split (query/key/value, the MLP's gate and up
  projections); a bias splits with it (``ColumnParallelLinear`` allocates
  ``output_size_per_partition``);
- ``row``: the input dimension is split (attention output and MLP down projections); the bias
  is *not* split: every rank holds all of it (``RowParallelLinear``: "Note that bias is not
  parallelized");
- ``vocabulary``: the embedding and the output layer split their vocabulary rows
  (``VocabParallelEmbedding``); the most-loaded rank holds ceil(V / t) rows, or with Megatron's
  padding (``vocab_divisible_by`` = k, its ``--make-vocab-size-divisible-by``, 128 by default
  there) the vocabulary is padded to a multiple of k x t and every rank holds V_padded / t;
- ``replicated``: norms and learned position embeddings are whole on every rank.

Column and row splits are exact because the validity rules (:func:`parallel_rules`) require t
to divide the heads, the key/value heads and the MLP width, as Megatron-LM does
(``divide(num_query_groups, world_size)`` and the like assert it).

Pipeline stages (1F1B, Narayanan et al. 2021, arXiv 2104.04473, Sec. 2.2.1): stage r holds
L // p layers, one more for the first L mod p stages (DeepSpeed 0.19.8
``runtime/utils.py partition_uniform``, numpy.array_split; Megatron-LM itself asks p to divide
L unless told otherwise). The first stage also holds the embedding (and learned position
embeddings), the last stage the final norm and the output layer. With tied embeddings and
p > 1 the last stage keeps its own copy of the embedding matrix for the output layer, kept
equal by an all-reduce of the two gradients (Megatron-LM ``language_module.py``: "Create a
second copy of word_embeddings on the last stage"); with p = 1 it is counted once. The
interleaved schedule (``schedule="interleaved"``, Narayanan et al. Sec. 2.2.2) gives each GPU
``chunks`` (v) model chunks of L / (p v) layers, which must divide evenly; rank r holds chunks
r, r + p, ...: L / p layers, the embedding on rank 0, the output layer on rank p - 1.

A model whose first ``dense_layers`` layers hold a dense MLP and the others experts
(DeepSeek-V2/V3's ``first_k_dense_replace``): the dense layers are the first layers, so they
sit on the first stage(s) under 1F1B and in the first model chunk(s) interleaved
(:func:`stage_dense_layers`); each stage counts the modules of the layers it holds, and its
largest module among them.

The activations a stage keeps in flight under each schedule are :mod:`zerolib.core.memory.pipeline_schedule`'s.

Which stage is the most loaded: the first stage holds at least as many layers, and at least
as many micro-batches in flight, as any middle stage, plus the embedding; the last stage holds
the output layer and the logits. So for parameters, activations and every working-set term
(all non-decreasing in both) the maximum over stages is at the first or the last stage:
``pipeline_stage=None`` takes the larger of the two (a test checks this against every stage).

Every function is vectorised over ``tensor_parallel`` and ``pipeline_parallel`` (and
``pipeline_stage``, ``micro_batches``), which broadcast together; results are exact int64.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

from zerolib.core.catalogue.models import TransformerConfig, get_model, modules
from zerolib.core.defaults import MAX_CHUNKS, MAX_MICRO_BATCHES, SCHEDULE_RULE, SCHEDULES  # noqa: F401
from zerolib.core.inputs import (
    MAX_GPUS,
    broadcast,
    check_flag,
    check_gpus,
    check_positive_int,
    check_stage,
    echo,
    whole_in_range,
)
from zerolib.core.intmath import ceil_div
from zerolib.core.memory.accounting import Layout, ModelState, model_state
from zerolib.core.memory.pipeline_stages import (  # noqa: F401  (where callers find them)
    MAX_LAYERS,
    candidate_stages,
    check_first_last,
    stage_dense_layers,
    stage_layers,
    stage_start,
    uneven_ok,
)

if TYPE_CHECKING:  # pandas is imported where a frame is built: commands that build none start without it
    import pandas as pd

SPLITS = ("column", "row", "vocabulary", "replicated")
PLACES = ("layer", "first", "last")       # every layer; the first / last pipeline stage
MAX_VOCAB_DIVISOR = 2**16                 # Megatron-LM's --make-vocab-size-divisible-by


@dataclass(frozen=True)
class SplitRule:
    """How one kind of module splits over the tensor-parallel group, and where it lives."""

    split: str                 # one of SPLITS
    place: str                 # one of PLACES
    bias: str | None = None    # row-parallel: the config flag of its bias (replicated)


MODULE_SPLITS: Mapping[str, SplitRule] = MappingProxyType({
    "embedding": SplitRule("vocabulary", "first"),
    "position_embedding": SplitRule("replicated", "first"),
    "attention_norm": SplitRule("replicated", "layer"),
    "qkv_projection": SplitRule("column", "layer"),
    "query_projection": SplitRule("column", "layer"),
    "key_projection": SplitRule("column", "layer"),
    "value_projection": SplitRule("column", "layer"),
    "attention_output_projection": SplitRule("row", "layer", bias="output_bias"),
    "mlp_norm": SplitRule("replicated", "layer"),
    "mlp_gate_projection": SplitRule("column", "layer"),
    "mlp_up_projection": SplitRule("column", "layer"),
    "mlp_gate_up_projection": SplitRule("column", "layer"),   # Phi-3's fused gate and up
    "mlp_down_projection": SplitRule("row", "layer", bias="mlp_bias"),
    # Gemma-2's norms after attention and the MLP; a mixture of experts' router (replicated, as
    # Megatron-LM keeps it) and each expert's MLP, split like the dense MLP (expert tensor
    # parallelism; expert parallelism, which spreads whole experts, is
    # zerolib.core.memory.expert_parallel's).
    "post_attention_norm": SplitRule("replicated", "layer"),
    "post_mlp_norm": SplitRule("replicated", "layer"),
    "router": SplitRule("replicated", "layer"),
    # Norms on queries and keys (Qwen3, Gemma-3 per head; OLMo-2 over the whole projection),
    # BLOOM's norm after the embedding, a shared expert (split as a dense MLP) and its gate.
    "query_norm": SplitRule("replicated", "layer"),
    "key_norm": SplitRule("replicated", "layer"),
    "embedding_norm": SplitRule("replicated", "first"),
    "shared_expert_gate_projection": SplitRule("column", "layer"),
    "shared_expert_up_projection": SplitRule("column", "layer"),
    "shared_expert_down_projection": SplitRule("row", "layer", bias="mlp_bias"),
    "shared_expert_gate": SplitRule("replicated", "layer"),
    # Latent attention (DeepSeek-V2/V3): the down projections and their norms whole on every
    # rank, the up projections split by heads (Megatron-LM's MLA: linear_q_down_proj and
    # linear_kv_down_proj are not tensor-parallel); the first layers' dense MLP as any MLP.
    "query_down_projection": SplitRule("replicated", "layer"),
    "query_down_norm": SplitRule("replicated", "layer"),
    "query_up_projection": SplitRule("column", "layer"),
    "kv_down_projection": SplitRule("replicated", "layer"),
    "kv_down_norm": SplitRule("replicated", "layer"),
    "kv_up_projection": SplitRule("column", "layer"),
    "dense_mlp_gate_projection": SplitRule("column", "layer"),
    "dense_mlp_up_projection": SplitRule("column", "layer"),
    "dense_mlp_down_projection": SplitRule("row", "layer", bias="mlp_bias"),
    "expert_gate_projection": SplitRule("column", "layer"),
    "expert_up_projection": SplitRule("column", "layer"),
    "expert_down_projection": SplitRule("row", "layer", bias="mlp_bias"),
    "final_norm": SplitRule("replicated", "last"),
    "output_projection": SplitRule("vocabulary", "last"),
})


@dataclass(frozen=True)
class ModuleSplit:
    """One module of a model with its split applied (elements of one module, not of all layers).

    A rank holds ``sharded / t + replicated`` elements of a column- or row-parallel module,
    ``rows(t) * row_width`` of a vocabulary-parallel one, ``replicated`` of a replicated one.
    """

    name: str
    split: str
    place: str           # one of PLACES, or of LAYER_PLACES on a model with dense first layers
    elements: int        # the whole module (weight + bias)
    sharded: int         # elements divided over the tensor-parallel ranks
    replicated: int      # elements every rank holds whole
    rows: int            # vocabulary rows (vocabulary-parallel modules; else 0)
    row_width: int       # elements per vocabulary row
    per_layer: int       # modules of this kind in one layer holding it (1 for first/last-stage modules)
    shared: bool         # a tied output layer: its weights are the embedding's


def _rule(name: str) -> SplitRule:
    if name not in MODULE_SPLITS:
        raise ValueError(f"module {name!r} has no tensor-parallel split rule in "
                         f"zerolib.core.memory.model_parallel.MODULE_SPLITS; add one (column, row, "
                         f"vocabulary or replicated)")
    return MODULE_SPLITS[name]


def module_splits(model: str | TransformerConfig) -> tuple[ModuleSplit, ...]:
    """Every module of ``model`` (:func:`zerolib.core.catalogue.models.modules`) with its split rule."""
    return _module_splits(get_model(model))


# A model whose first layers are dense (DeepSeek's first_k_dense_replace): which layer modules
# only those layers hold, and which only the others (the layers with experts).
DENSE_LAYER_MODULES = ("dense_mlp_gate_projection", "dense_mlp_up_projection", "dense_mlp_down_projection")
EXPERT_LAYER_MODULES = ("router", "expert_gate_projection", "expert_up_projection",
                        "expert_down_projection", "shared_expert_gate_projection",
                        "shared_expert_up_projection", "shared_expert_down_projection",
                        "shared_expert_gate")
# Where a module of a ModuleSplit lives: PLACES, and on a model with dense first layers the
# layer modules of only the dense or only the expert layers.
LAYER_PLACES = ("layer", "dense_layer", "expert_layer")


def layer_place(config: TransformerConfig, name: str) -> tuple[str, int]:
    """(place, layers that hold the module) of a module that lives in layers."""
    if config.dense_layers and name in DENSE_LAYER_MODULES:
        return "dense_layer", config.dense_layers
    if config.dense_layers and name in EXPERT_LAYER_MODULES:
        return "expert_layer", config.sparse_layers
    return "layer", config.layers


def _module_splits(config: TransformerConfig) -> tuple[ModuleSplit, ...]:
    out = []
    for module in modules(config):
        rule = _rule(module.name)
        place = rule.place
        if rule.place == "layer":
            place, layers = layer_place(config, module.name)
            if module.count % layers:
                raise ValueError(f"module {module.name!r} appears {module.count} times, not a "
                                 f"multiple of the {layers} layers")
            per_layer = module.count // layers
        elif module.count != 1:
            raise ValueError(f"module {module.name!r} lives on one pipeline stage but appears "
                             f"{module.count} times")
        else:
            per_layer = 1
        sharded = replicated = rows = width = 0
        if rule.split == "vocabulary":
            if module.elements % config.vocab:
                raise ValueError(f"module {module.name!r} ({module.elements:,} elements) is not "
                                 f"a whole number of {config.vocab:,} vocabulary rows")
            rows, width = config.vocab, module.elements // config.vocab
        elif rule.split == "replicated":
            replicated = module.elements
        elif rule.split == "column":
            sharded = module.elements      # weight and bias split along the output
        else:
            bias = config.hidden if rule.bias is not None and getattr(config, rule.bias) else 0
            if (module.elements - bias) % config.hidden:
                raise ValueError(f"module {module.name!r}: weight of {module.elements - bias:,} "
                                 f"elements does not project to the hidden size {config.hidden}")
            sharded, replicated = module.elements - bias, bias
        out.append(ModuleSplit(module.name, rule.split, place, module.elements, sharded,
                               replicated, rows, width, per_layer, module.shared))
    return tuple(out)


def split_table(model: str | TransformerConfig, tensor_parallel: int = 1,
                vocab_divisible_by: int = 1) -> pd.DataFrame:
    """One row per module: its split, where it lives, its elements and one rank's share at t."""
    import pandas as pd
    config = get_model(model)
    t = check_positive_int(tensor_parallel, "tensor_parallel", MAX_GPUS)
    check_parallel(config, t)
    rows = []
    for piece in module_splits(config):
        count = piece.per_layer * _layers_of(config, piece.place)
        rows.append({"module": piece.name, "split": piece.split, "place": piece.place,
                     "count": count, "elements": piece.elements,
                     "elements_per_gpu": int(_rank_elements(piece, np.int64(t), vocab_divisible_by)),
                     "shared": piece.shared})
    frame = pd.DataFrame(rows)
    frame.attrs.update(model=config.name, tensor_parallel=t)
    return frame


# --- validity -----------------------------------------------------------------------------------

RULES: Mapping[str, str] = MappingProxyType({
    "heads": "tensor_parallel must divide heads",
    "kv_heads": "tensor_parallel must divide kv_heads",
    "ffn_hidden": "tensor_parallel must divide ffn_hidden",
    "node": "tensor_parallel must divide gpus_per_node (one tensor-parallel group within a node)",
    "sequence": "tensor_parallel must divide seq_len under sequence parallelism",
    "layers": "pipeline_parallel must be at most layers (every stage holds a layer)",
    "interleaved_layers": "interleaved: pipeline_parallel x chunks must divide layers",
    "pipeline_layers": "pipeline_layers FIRST,LAST needs pipeline_parallel >= 2, FIRST + LAST "
                       "below the layers (all of them at 2 stages) and the layers left split "
                       "evenly over the middle stages; interleaved, chunks divide each stage's "
                       "layers (Megatron-LM's TransformerConfig)",
    "schedule": SCHEDULE_RULE,
    "micro_batches": "interleaved: micro_batches must be a multiple of pipeline_parallel",
    "pipeline_zero": "ZeRO stages 2 and 3 do not run with pipeline parallelism (DeepSpeed's "
                     "PipelineEngine refuses them; Megatron-LM's distributed optimizer is stage 1)",
    "gpus": "gpus must be a multiple of tensor_parallel x pipeline_parallel",
})
# The ZeRO stages that run under pipeline parallelism (the rule "pipeline_zero").
PIPELINE_STAGES = (0, 1)
# Every schedule the rules accept (the planner's default): at each pipeline degree p, 1F1B and
# every v >= 2 that Megatron-LM's interleaving accepts (megatron/training/arguments.py: the
# layers divide by p and L / p by the layers per virtual stage, so p x v divides L; p >= 2).
ALL_CHUNKS = "all"


def chunks_for(config: TransformerConfig, p: int, chunks=ALL_CHUNKS) -> tuple[int, ...]:
    """The schedules tried at ``p`` pipeline stages: ``chunks`` as named (the rules reject what
    cannot run), or under :data:`ALL_CHUNKS` 1F1B and every v >= 2 with p x v dividing the
    layers, for p >= 2 (80 layers, p = 4: 1, 2, 4, 5, 10, 20)."""
    return _all_chunks(config.layers, int(p)) if chunks == ALL_CHUNKS else chunks


@lru_cache(maxsize=1024)
def _all_chunks(layers: int, p: int) -> tuple[int, ...]:
    if p < 2 or layers % p:
        return (1,)
    per_stage = layers // p
    return (1, *(v for v in range(2, min(per_stage, MAX_CHUNKS) + 1) if per_stage % v == 0))


def check_schedule(schedule) -> str:
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {echo(schedule)}")
    return schedule


def _micro_batches(value, name: str = "micro_batches") -> np.ndarray:
    return whole_in_range(value, name, 1, MAX_MICRO_BATCHES, "a positive whole number of micro-batches")


@dataclass(frozen=True, eq=False)
class Pipeline:
    """A pipeline: ``stages`` (p, Megatron-LM's ``--pipeline-model-parallel-size``) under
    ``schedule`` ("1f1b", or "interleaved" with ``chunks`` (v) model chunks per stage), over
    ``micro_batches`` (m) micro-batches per step and pipeline (None: as many as it takes to fill
    the pipeline). ``stages`` and ``micro_batches`` may be arrays, broadcast by the functions
    that take them. Checked when made (whole numbers in range, a known schedule); the rules that
    need the model are :func:`check_parallel`'s. Where a function takes a pipeline, a whole
    number p means ``Pipeline(p)``: p stages under 1F1B. ``first_last``: the layers of the
    first and the last stage, the rest split evenly over the middle stages (None: even,
    :func:`stage_layers`)."""

    stages: int | np.ndarray = 1
    schedule: str = "1f1b"
    chunks: int = 1
    micro_batches: int | np.ndarray | None = None
    first_last: tuple[int, int] | None = None

    def __post_init__(self):
        put = object.__setattr__
        put(self, "stages", check_gpus(self.stages, "pipeline_parallel"))
        put(self, "schedule", check_schedule(self.schedule))
        put(self, "chunks", check_positive_int(self.chunks, "chunks", MAX_CHUNKS))
        if self.micro_batches is not None:
            put(self, "micro_batches", _micro_batches(self.micro_batches))
        if self.first_last is not None:
            put(self, "first_last", check_first_last(self.first_last))

    def __deepcopy__(self, memo) -> Pipeline:
        return self  # immutable

    def micro_batches_or(self, default):
        """The micro-batches per step, or ``default`` where none were given."""
        return default if self.micro_batches is None else self.micro_batches


def as_pipeline(pipeline) -> Pipeline:
    """``pipeline`` itself, or a whole number of stages (an array of them) as ``Pipeline(p)``."""
    return pipeline if isinstance(pipeline, Pipeline) else Pipeline(pipeline)


def _rules(config: TransformerConfig, tensor_parallel, pipeline: Pipeline, gpus, gpus_per_node,
           seq_len, sequence_parallel, stage=None):
    """(rule -> ok array, the broadcast inputs by name), all of one shape."""
    arrays = {"tensor_parallel": check_gpus(tensor_parallel, "tensor_parallel"),
              "pipeline_parallel": pipeline.stages}
    if gpus is not None:
        arrays["gpus"] = check_gpus(gpus, "gpus")
    if pipeline.micro_batches is not None:
        arrays["micro_batches"] = pipeline.micro_batches
    if stage is not None:
        arrays["stage"] = check_stage(stage)
    shaped = dict(zip(arrays, broadcast(**arrays)))
    if gpus_per_node is not None:
        gpus_per_node = check_positive_int(gpus_per_node, "gpus_per_node", MAX_GPUS)
    if seq_len is not None and check_flag(sequence_parallel, "sequence_parallel"):
        seq_len = check_positive_int(seq_len, "seq_len")
    grid = ParallelGrid(config, shaped["tensor_parallel"], shaped["pipeline_parallel"], None,
                        pipeline.schedule, pipeline.chunks, shaped.get("micro_batches"), 1,
                        pipeline.first_last)
    return rules_of(grid, gpus_per_node, seq_len, sequence_parallel, shaped.get("gpus"),
                    shaped.get("stage")), shaped


def rules_of(grid: ParallelGrid, gpus_per_node: int | None = None, seq_len: int | None = None,
             sequence_parallel: bool = False, gpus: np.ndarray | None = None,
             stage: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """:func:`parallel_rules` of checked inputs (a grid of int64 arrays of one shape, Python
    scalars; its ``pipeline_stage`` and ``vocab_divisible_by`` unread): the planner's path, which
    checked them once at its door."""
    config, t, p, v, micro_batches = grid.config, grid.t, grid.p, grid.chunks, grid.micro_batches
    holds = np.ones(t.shape, dtype=bool)
    rules = dict.fromkeys(RULES, holds)
    rules.update(heads=config.heads % t == 0, kv_heads=config.kv_heads % t == 0,
                 ffn_hidden=(config.ffn_hidden % t == 0) & (config.shared_expert_ffn % t == 0)
                 & (config.dense_ffn_hidden % t == 0))
    if gpus_per_node is not None:
        k = gpus_per_node
        rules["node"] = (t <= k) & (k % t == 0)
    if seq_len is not None and sequence_parallel:
        rules["sequence"] = seq_len % t == 0
    rules["layers"] = p <= config.layers
    if grid.first_last is not None:
        rules["pipeline_layers"] = uneven_ok(config.layers, p, v, grid.first_last)
    if grid.schedule == "interleaved":
        even = config.layers % (p * v) == 0
        rules["interleaved_layers"] = (even if grid.first_last is None
                                       else np.where(np.asarray(grid.first_last[0]) > 0, True, even))
        rules["schedule"] = (p >= 2) & (v >= 2)
        if micro_batches is not None:
            rules["micro_batches"] = micro_batches % p == 0
    else:
        rules["schedule"] = holds & (v == 1)
    if stage is not None:
        rules["pipeline_zero"] = (p == 1) | (stage <= PIPELINE_STAGES[-1])
    if gpus is not None:
        rules["gpus"] = gpus % (t * p) == 0
    return {name: np.broadcast_to(ok, t.shape) for name, ok in rules.items()}


def parallel_rules(model, tensor_parallel=1, pipeline: Pipeline | int = 1, *, gpus=None,
                   gpus_per_node=None, seq_len=None, sequence_parallel: bool = False,
                   stage=None) -> dict[str, np.ndarray]:
    """For each rule of :data:`RULES`, a boolean array: True where the setting obeys it.

    Broadcast over ``tensor_parallel``, the pipeline's stages and micro-batches, ``gpus`` and
    ``stage`` (the ZeRO stage); a rule whose input is not given (``gpus``, ``gpus_per_node``,
    ``seq_len``, ``stage``) holds.
    """
    rules, _ = _rules(get_model(model), tensor_parallel, as_pipeline(pipeline), gpus,
                      gpus_per_node, seq_len, sequence_parallel, stage)
    return rules


def check_parallel(model, tensor_parallel=1, pipeline: Pipeline | int = 1, *, gpus=None,
                   gpus_per_node=None, seq_len=None, sequence_parallel: bool = False,
                   stage=None) -> None:
    """Raise a ValueError naming the first rule of :data:`RULES` that a setting breaks, with the
    model's numbers and the setting (arguments as :func:`parallel_rules`). The planner rejects
    by the same rules (:data:`zerolib.core.planner.RULES`), in the same words."""
    config = get_model(model)
    pipeline = as_pipeline(pipeline)
    rules, shaped = _rules(config, tensor_parallel, pipeline, gpus, gpus_per_node, seq_len,
                           sequence_parallel, stage)
    for name, ok in rules.items():
        if np.all(ok):
            continue
        index = tuple(np.argwhere(~ok)[0]) if ok.ndim else ()
        setting = ", ".join(f"{key} {int(value[index])}" for key, value in shaped.items())
        if name == "pipeline_layers":
            setting += f", pipeline_layers {pipeline.first_last[0]},{pipeline.first_last[1]}"
            if pipeline.schedule == "interleaved":
                setting += f", chunks {pipeline.chunks}"
        facts = {"heads": f"heads {config.heads}", "kv_heads": f"kv_heads {config.kv_heads}",
                 "ffn_hidden": f"ffn_hidden {config.ffn_hidden}", "layers": f"{config.layers} layers",
                 "interleaved_layers": f"{config.layers} layers",
                 "pipeline_layers": f"{config.layers} layers",
                 "node": f"gpus_per_node {gpus_per_node}", "sequence": f"seq_len {seq_len}",
                 "schedule": f"schedule {pipeline.schedule}, chunks {pipeline.chunks}"}.get(name)
        about = f"{config.name} has {facts}; " if facts else ""
        raise ValueError(f"{RULES[name]}: {about}got {setting}")


# --- parameters --------------------------------------------------------------------------------

def vocabulary_rows(vocab: int, tensor_parallel, vocab_divisible_by: int = 1) -> np.ndarray:
    """Vocabulary rows on the most-loaded tensor-parallel rank: ceil(V / (k t)) x k.

    k = 1: no padding, ranks hold ceil(V / t) rows or fewer (torch.chunk's rule). k > 1:
    Megatron-LM pads V to a multiple of k x t (``vocab_size_with_padding``), every rank holds
    the same V_padded / t rows, and the padding rows are real parameters.
    """
    k = check_positive_int(vocab_divisible_by, "vocab_divisible_by", MAX_VOCAB_DIVISOR)
    return rows_on_rank(vocab, tensor_parallel, k)


def rows_on_rank(vocab: int, tensor_parallel, vocab_divisible_by: int) -> np.ndarray:
    """:func:`vocabulary_rows` of a checked ``vocab_divisible_by`` (the callers' door checked it)."""
    t = np.asarray(tensor_parallel, dtype=np.int64)
    return ceil_div(np.int64(vocab), vocab_divisible_by * t) * vocab_divisible_by


def rank_elements(piece: ModuleSplit, tensor_parallel, vocab_divisible_by: int = 1) -> np.ndarray:
    """One module's elements on one rank of a ``tensor_parallel``-way group (exact for valid t):
    the rule every per-GPU count here applies (the expert holdings use it at ETP)."""
    return _rank_elements(piece, np.asarray(tensor_parallel, dtype=np.int64), vocab_divisible_by)


def _rank_elements(piece: ModuleSplit, t: np.ndarray, vocab_divisible_by: int) -> np.ndarray:
    """One module's elements on one rank of a t-way group (exact for valid t)."""
    if piece.split == "vocabulary":
        return rows_on_rank(piece.rows, t, vocab_divisible_by) * piece.row_width
    if piece.split == "replicated":
        return np.full(np.shape(t), piece.replicated, dtype=np.int64)
    if np.any(piece.sharded % t):
        raise ValueError(f"tensor_parallel must divide the split dimension of {piece.name!r} "
                         f"({piece.sharded:,} elements)")
    return piece.sharded // t + piece.replicated


@dataclass(frozen=True)
class ParallelGrid:
    """Validated, broadcast inputs of the per-GPU functions."""

    config: TransformerConfig
    t: np.ndarray
    p: np.ndarray
    pipeline_stage: np.ndarray | None   # None: the most-loaded stage
    schedule: str
    chunks: int
    micro_batches: np.ndarray | None
    vocab_divisible_by: int
    # Layers of the first and last stage (int64 arrays; 0 on a setting split evenly), or None.
    first_last: tuple | None = None


def parallel_grid(model, tensor_parallel, pipeline_parallel, pipeline_stage, schedule, chunks,
                  micro_batches=None, vocab_divisible_by=1) -> ParallelGrid:
    """Check and broadcast the inputs every per-GPU function takes (the rules of
    :func:`check_parallel` included); ``pipeline_stage`` below ``pipeline_parallel``."""
    return grid_of(model, tensor_parallel, Pipeline(pipeline_parallel, schedule, chunks, micro_batches),
                   pipeline_stage, vocab_divisible_by)


def grid_of(model, tensor_parallel, pipeline: Pipeline | int, pipeline_stage=None,
            vocab_divisible_by=1) -> ParallelGrid:
    """:func:`parallel_grid` of a :class:`Pipeline` (or a whole number of stages)."""
    config = get_model(model)
    pipeline = as_pipeline(pipeline)
    check_positive_int(vocab_divisible_by, "vocab_divisible_by", MAX_VOCAB_DIVISOR)
    arrays = {"tensor_parallel": check_gpus(tensor_parallel, "tensor_parallel"),
              "pipeline_parallel": pipeline.stages}
    if pipeline_stage is not None:
        arrays["pipeline_stage"] = whole_in_range(pipeline_stage, "pipeline_stage", 0, MAX_GPUS,
                                                   "a pipeline stage index, 0 or more")
    if pipeline.micro_batches is not None:
        arrays["micro_batches"] = pipeline.micro_batches
    shaped = dict(zip(arrays, broadcast(**arrays)))
    t, p = shaped["tensor_parallel"], shaped["pipeline_parallel"]
    check_parallel(config, t, Pipeline(p, pipeline.schedule, pipeline.chunks,
                                       shaped.get("micro_batches"), pipeline.first_last))
    stage = shaped.get("pipeline_stage")
    if stage is not None and np.any(stage >= p):
        raise ValueError(f"pipeline_stage must be below pipeline_parallel (stages 0 to p - 1), "
                         f"got {echo(pipeline_stage)} with pipeline_parallel {echo(pipeline.stages.tolist())}")
    return ParallelGrid(config, t, p, stage, pipeline.schedule, pipeline.chunks,
                        shaped.get("micro_batches"), vocab_divisible_by, pipeline.first_last)


def _layers_of(config: TransformerConfig, place: str) -> int:
    """Modules of ``place`` (:data:`LAYER_PLACES` or the first / last stage) in the model."""
    return {"layer": config.layers, "dense_layer": config.dense_layers,
            "expert_layer": config.sparse_layers}.get(place, 1)


def _stage_kinds(grid: ParallelGrid, r) -> dict[str, np.ndarray]:
    """Layers of each of :data:`LAYER_PLACES` on stage r (parameters: as the grid's schedule
    places them)."""
    held = stage_layers(grid.config.layers, grid.p, r, grid.first_last)
    dense = stage_dense_layers(grid.config, grid.p, r, schedule=grid.schedule, chunks=grid.chunks,
                               first_last=grid.first_last)
    return {"layer": held, "dense_layer": dense, "expert_layer": held - dense}


def _place_sums(grid: ParallelGrid) -> dict[str, np.ndarray]:
    """Per-rank elements of one layer (of each kind) and of the first / last stage's own modules."""
    sums = {place: np.zeros(grid.t.shape, dtype=np.int64) for place in PLACES + LAYER_PLACES[1:]}
    shared = np.zeros(grid.t.shape, dtype=np.int64)
    for piece in _module_splits(grid.config):
        share = _rank_elements(piece, grid.t, grid.vocab_divisible_by) * piece.per_layer
        if piece.shared:
            shared = shared + share
        else:
            sums[piece.place] = sums[piece.place] + share
    # A tied output layer is a second copy on the last stage once the pipeline splits the model.
    sums["last"] = sums["last"] + np.where(grid.p > 1, shared, 0)
    return sums


def unsharded_units_on(grid: ParallelGrid, r) -> dict[str, np.ndarray]:
    """What FSDP2 holds unsharded on a GPU of stage r, in elements of its own share (the
    working set's FSDP2 terms, :mod:`zerolib.core.memory.conventions`): ``root``, the modules
    outside the layers on this stage (the embedding on the first, the final norm and the output
    layer on the last), ``layer``, one layer (the larger kind where they differ), ``matrices``
    and ``matrix_tensors``, that layer's column- and row-parallel weights and how many there are
    (what Float8 all-gathers in fp8)."""
    sums = _place_sums(grid)
    kinds = _stage_kinds(grid, r)
    matrices = {place: np.zeros(grid.t.shape, dtype=np.int64) for place in LAYER_PLACES}
    tensors = dict.fromkeys(LAYER_PLACES, 0)
    for piece in _module_splits(grid.config):
        if piece.place in LAYER_PLACES and piece.split in ("column", "row"):
            matrices[piece.place] = matrices[piece.place] + _rank_elements(
                piece, grid.t, grid.vocab_divisible_by) * piece.per_layer
            tensors[piece.place] += piece.per_layer
    layer, matrix, count = sums["layer"], matrices["layer"], np.full(grid.t.shape, tensors["layer"])
    for place in LAYER_PLACES[1:]:   # a model with dense first layers: the larger kind held here
        here = (kinds[place] > 0) & (sums["layer"] + sums[place] > layer)
        layer = np.where(here, sums["layer"] + sums[place], layer)
        matrix = np.where(here, matrices["layer"] + matrices[place], matrix)
        count = np.where(here, tensors["layer"] + tensors[place], count)
    root = np.where(r == 0, sums["first"], 0) + np.where(r == grid.p - 1, sums["last"], 0)
    return {"root": root, "layer": layer, "matrices": matrix, "matrix_tensors": count}


def at_stage(grid: ParallelGrid, load):
    """``load(r)`` at the grid's pipeline stage, or (None) the largest over
    :func:`candidate_stages` (the first and the last for a model whose layers are alike)."""
    if grid.pipeline_stage is not None:
        return load(grid.pipeline_stage)
    return np.maximum.reduce([load(r) for r in candidate_stages(grid.config, grid.p,
                                                                grid.first_last)])


def candidate_loads(config: TransformerConfig, t: np.ndarray, p: np.ndarray,
                    chunks: np.ndarray, first_last=None) -> list[tuple[np.ndarray, np.ndarray]]:
    """(parameters, largest module) on one GPU of each of :func:`candidate_stages`, for checked
    int64 arrays of t, p and model chunks per stage (1: 1F1B, more: interleaved) and uneven
    stages (``first_last``: arrays, 0 where even): the planner's path. The chunks matter only to
    a model with dense first layers."""
    out = []
    for r in candidate_stages(config, p, first_last):
        params, module = np.zeros_like(p), np.zeros_like(p)
        for v in np.unique(chunks):
            sel, schedule = chunks == v, "interleaved" if v > 1 else "1f1b"
            split = None if first_last is None else tuple(np.broadcast_to(x, p.shape)[sel]
                                                          for x in first_last)
            grid = ParallelGrid(config, t[sel], p[sel], r[sel], schedule, int(v), None, 1, split)
            params[sel], module[sel] = parameters_on(grid), largest_module_on(grid)
        out.append((params, module))
    return out


def parameters_per_gpu(model, tensor_parallel=1, pipeline_parallel=1, *, pipeline_stage=None,
                       schedule: str = "1f1b", chunks: int = 1,
                       vocab_divisible_by: int = 1) -> np.ndarray:
    """Parameters one GPU holds (before ZeRO shards them over data-parallel replicas).

    At ``pipeline_stage`` r, or (None) on the most-loaded stage. With t = p = 1 this is
    :func:`zerolib.core.catalogue.models.parameter_count` exactly. int64, broadcast over the inputs.
    """
    grid = parallel_grid(model, tensor_parallel, pipeline_parallel, pipeline_stage, schedule, chunks,
                         vocab_divisible_by=vocab_divisible_by)
    return parameters_on(grid)


def parameters_on(grid: ParallelGrid) -> np.ndarray:
    """:func:`parameters_per_gpu` of a checked grid (a :class:`ParallelGrid` made from checked
    values: the planner's path)."""
    sums = _place_sums(grid)

    def load(r):
        kinds = _stage_kinds(grid, r)
        return (sum(kinds[place] * sums[place] for place in LAYER_PLACES)
                + np.where(r == 0, sums["first"], 0) + np.where(r == grid.p - 1, sums["last"], 0))

    return at_stage(grid, load)


def largest_module_per_gpu(model, tensor_parallel=1, pipeline_parallel=1, *, pipeline_stage=None,
                           schedule: str = "1f1b", chunks: int = 1,
                           vocab_divisible_by: int = 1) -> np.ndarray:
    """Elements of the largest single module one GPU holds at a stage (its own share of it):
    DeepSpeed's ``largest_layer_params`` on that GPU. None: the larger of first and last stage.
    A tied output layer counts as a module, as in :func:`zerolib.core.catalogue.models.largest_layer`."""
    grid = parallel_grid(model, tensor_parallel, pipeline_parallel, pipeline_stage, schedule, chunks,
                         vocab_divisible_by=vocab_divisible_by)
    return largest_module_on(grid)


def largest_module_on(grid: ParallelGrid) -> np.ndarray:
    """:func:`largest_module_per_gpu` of a checked grid (see :func:`parameters_on`)."""
    best = {place: np.zeros(grid.t.shape, dtype=np.int64) for place in PLACES + LAYER_PLACES[1:]}
    for piece in _module_splits(grid.config):
        best[piece.place] = np.maximum(best[piece.place],
                                       _rank_elements(piece, grid.t, grid.vocab_divisible_by))

    def load(r):
        kinds = _stage_kinds(grid, r)   # a kind of layer counts where the stage holds one
        return np.maximum.reduce([best["layer"], np.where(kinds["dense_layer"] > 0, best["dense_layer"], 0),
                                  np.where(kinds["expert_layer"] > 0, best["expert_layer"], 0),
                                  np.where(r == 0, best["first"], 0),
                                  np.where(r == grid.p - 1, best["last"], 0)])

    return at_stage(grid, load)


def model_state_per_gpu(model, tensor_parallel, pipeline: Pipeline | int, data_parallel, stage,
                        layout: str | Layout = "mixed-adam", *, pipeline_stage=None,
                        vocab_divisible_by: int = 1) -> ModelState:
    """ZeRO ``stage`` sharding one GPU's parameters (:func:`parameters_per_gpu`) over the
    ``data_parallel`` replicas: :func:`zerolib.core.memory.accounting.model_state`, broadcast.
    ``pipeline``: a :class:`Pipeline` or its number of stages (1F1B)."""
    params = parameters_on(grid_of(model, tensor_parallel, pipeline, pipeline_stage,
                                   vocab_divisible_by))
    return model_state(params, data_parallel, stage, layout)
