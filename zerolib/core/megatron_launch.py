"""A whole Megatron-LM launch line read as a :class:`~zerolib.core.run.Run`.

:func:`run_from_megatron_args` takes the arguments of ``pretrain_gpt.py`` (a string, a list of
words or a file holding them, read and bounded as
:func:`zerolib.core.catalogue.megatron_args.model_from_megatron_args` reads them) and returns a
run: the model those arguments build, the parallel layout, the trainer (engine ``megatron``;
ZeRO stage 1 with ``--use-distributed-optimizer``, else 0) and the batch.

Every flag a run can hold is one row of :data:`LAUNCH`: the run field it sets, or ``None`` with
what zerolib does not model yet (refused in one line). A field the run gains is one row changed.
The rules are Megatron-LM's own, at commit d98e8a64 (2026-08-22), cited per row and in
:func:`read_launch`:

- ``megatron/training/arguments.py`` (``validate_args``): ``--recompute-activations`` sets the
  granularity ``selective`` (lines 607-608); ``--expert-tensor-parallel-size`` defaults to the
  tensor-parallel size (587-588); ``--num-layers-per-virtual-pipeline-stage`` gives
  layers / pipeline / that many model chunks per stage, ``--num-virtual-stages-per-pipeline-rank``
  the chunks themselves, one chunk being no interleaving (953-983); sequence parallelism is
  switched off without tensor parallelism (1433-1439); ``--recompute-method`` is refused with
  ``selective`` (1425-1428);
- ``megatron/core/transformer/transformer_config.py``: ``hidden_dropout`` and
  ``attention_dropout`` default to 0.1 (lines 188-191); ``full`` recomputation needs a method and
  a layer count (1908-1924), ``selective`` refuses a layer count (1926-1931); uneven stages
  (``--decoder-first/last-pipeline-num-layers``, "Uneven PP", 2294-2368): each at least 1, the
  middle layers split evenly, with virtual stages the chunks divide every stage's layers;
- ``megatron/core/transformer/transformer_block.py`` ``get_num_layers_to_build`` and
  ``transformer_layer.py`` ``get_transformer_layer_offset``: a stage's layers and where they
  start; without uneven stages the layers (plus the embedding and loss where accounted) must
  divide by the pipeline size (``arguments.py`` 985-1000): Megatron-LM splits nothing unevenly
  on its own;
- ``megatron/core/model_parallel_config.py``: ``fp16``/``bf16`` (lines 177-180), the parallel
  sizes' defaults of 1.

Without ``--bf16`` or ``--fp16`` Megatron-LM trains in fp32: activations of 4 bytes and the
``fp32-adam`` layout. Flags that change neither the model nor a run's memory or time (learning
rates, data paths, logging...) are read by the model's reader and left out, as there.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from zerolib.core.catalogue.megatron_args import argument_tokens, model_from_megatron_args
from zerolib.core.catalogue.models import TransformerConfig
from zerolib.core.inputs import MAX_GPUS, echo

COMMIT = "d98e8a64"   # Megatron-LM's commit whose arguments.py these rules are read from
DEFAULT_DROPOUT = 0.1  # transformer_config.py: hidden_dropout, attention_dropout
MAX_WHOLE = 10**12     # a size or count read here (the run bounds each field more closely)


@dataclass(frozen=True)
class Row:
    """One launch flag: the run ``field`` it sets (a flat name of :data:`zerolib.core.run.FIELDS`,
    or a name this module turns into one), how its value is read (``kind``: "whole", "switch",
    "choice", "fraction", "text") and, for ``field`` None, what zerolib does not model yet."""

    field: str | None
    kind: str
    not_modelled: str = ""
    choices: tuple[str, ...] = ()


def _later(kind: str, what: str, choices: tuple[str, ...] = ()) -> Row:
    return Row(None, kind, what, choices)


# flag -> Row. Change a row when the run gains the field it names.
LAUNCH: Mapping[str, Row] = {
    "--tensor-model-parallel-size": Row("tensor_parallel", "whole"),
    "--pipeline-model-parallel-size": Row("pipeline_parallel", "whole"),
    "--context-parallel-size": Row("context_parallel", "whole"),
    "--expert-model-parallel-size": Row("expert_parallel", "whole"),
    "--expert-tensor-parallel-size": Row("expert_tensor_parallel", "whole"),
    "--sequence-parallel": Row("sequence_parallel", "switch"),
    "--num-virtual-stages-per-pipeline-rank": Row("pipeline_chunks", "whole"),
    "--num-layers-per-virtual-pipeline-stage": Row("layers_per_chunk", "whole"),
    "--decoder-first-pipeline-num-layers": Row("pipeline_layers", "whole"),
    "--decoder-last-pipeline-num-layers": Row("pipeline_layers", "whole"),
    "--pipeline-model-parallel-layout": _later("text", "a pipeline layout of one's own"),
    "--account-for-embedding-in-pipeline-split": Row("pipeline_layers", "switch"),
    "--account-for-loss-in-pipeline-split": Row("pipeline_layers", "switch"),
    "--micro-batch-size": Row("micro_batch", "whole"),
    "--global-batch-size": Row("global_batch", "whole"),
    "--seq-length": Row("seq_len", "whole"),
    "--recompute-granularity": Row("recompute", "choice", choices=("full", "selective")),
    "--recompute-activations": Row("recompute_activations", "switch"),
    "--recompute-method": Row("recompute_method", "choice", choices=("uniform", "block")),
    "--recompute-num-layers": Row("recompute_layers", "whole"),
    "--use-distributed-optimizer": Row("distributed_optimizer", "switch"),
    "--bf16": Row("bf16", "switch"),
    "--accumulate-allreduce-grads-in-fp32": Row("layout", "switch"),
    "--grad-reduce-in-bf16": Row("layout", "switch"),
    "--fp16": Row("fp16", "switch"),
    "--fp8-format": _later("choice", "Float8 training (Transformer Engine)", ("e4m3", "hybrid")),
    "--fp4-format": _later("choice", "FP4 training (Transformer Engine)", ("e2m1",)),
    "--hidden-dropout": Row("hidden_dropout", "fraction"),
    "--attention-dropout": Row("attention_dropout", "fraction"),
    "--distribute-saved-activations": _later("switch", "recomputed activations split over "
                                             "tensor-parallel ranks"),
    "--cpu-offloading": _later("switch", "Megatron-LM's activation offloading"),
    "--virtual-pipeline-model-parallel-size": Row(None, "whole", "REFUSED: not an argument of "
                                                  f"Megatron-LM at {COMMIT} (give "
                                                  "--num-virtual-stages-per-pipeline-rank)"),
}
# Flags read here that the model's reader also needs (the vocabulary's padding).
_MODEL_TOO = frozenset({"--tensor-model-parallel-size", "--seq-length"})


@dataclass(frozen=True)
class Launch:
    """A launch line read: the ``model`` its arguments build, the run fields it sets
    (``fields``: flat names of :data:`zerolib.core.run.FIELDS`), each flag read with the field
    it went to (``carried``), and what zerolib does not model yet (``not_modelled``: one line
    each); ``where`` names the source."""

    model: TransformerConfig
    fields: Mapping
    carried: tuple[tuple[str, str], ...]
    not_modelled: tuple[str, ...]
    where: str


def _read_value(row: Row, flag: str, text: str | None, where: str):
    if row.kind == "switch":
        return True
    if row.kind == "text":
        return text
    if row.kind == "choice":
        if text not in row.choices:
            raise ValueError(f"{where}: {flag} must be one of {', '.join(row.choices)}, got {echo(text)}")
        return text
    if row.kind == "fraction":
        try:
            value = float(text) if len(text) <= 40 else None
        except ValueError:
            value = None
        if value is None or not 0.0 <= value <= 1.0:   # NaN fails both comparisons
            raise ValueError(f"{where}: {flag} must be a probability from 0 to 1, got {echo(text)}")
        return value
    stripped = text.strip()
    if not stripped.isascii() or not stripped.isdigit() or len(stripped) > 15 \
            or not 1 <= int(stripped) <= MAX_WHOLE:
        raise ValueError(f"{where}: {flag} must be a whole number from 1 to {MAX_WHOLE:,}, got "
                         f"{echo(text)} (digits 0-9 only)")
    return int(stripped)


def _split(tokens: list[str], where: str) -> tuple[dict, list[str]]:
    """(flag -> value for the flags of :data:`LAUNCH`, the words left for the model's reader)."""
    found: dict = {}
    rest: list[str] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        flag, equals, inline = token.partition("=")
        flag = flag.replace("_", "-") if flag.startswith("--") else flag
        row = LAUNCH.get(flag)
        if row is None:
            rest.append(token)
            index += 1
            continue
        text = None
        if row.kind != "switch":
            if equals:
                text = inline
            elif index + 1 < len(tokens) and not tokens[index + 1].startswith("--"):
                index += 1
                text = tokens[index]
            else:
                raise ValueError(f"{where}: {flag} needs a value")
        elif equals:
            raise ValueError(f"{where}: {flag} is a switch and takes no value, got {echo(inline)}")
        if flag in found:
            raise ValueError(f"{where}: {flag} is given twice")
        found[flag] = _read_value(row, flag, text, where)
        if flag in _MODEL_TOO:
            rest += [flag, str(found[flag])]
        index += 1
    return found, rest


def read_launch(source, *, name: str = "megatron-gpt") -> Launch:
    """A Megatron-LM launch line read (see the module doc): its model and its run fields; a
    ``ValueError`` naming the source and the flag for a value Megatron-LM would refuse."""
    tokens, where = argument_tokens(source)
    found, rest = _split(tokens, where)
    model = model_from_megatron_args(rest, name=name)
    fields: dict = {"engine": "megatron"}
    carried: list[tuple[str, str]] = []
    later: list[str] = []
    for flag, value in found.items():
        row = LAUNCH[flag]
        if row.field is None:
            if row.not_modelled.startswith("REFUSED: "):
                raise ValueError(f"{where}: {flag}: {row.not_modelled.removeprefix('REFUSED: ')}")
            later.append(f"{where}: {flag} {'' if value is True else value}".rstrip()
                         + f": {row.not_modelled} is not modelled yet")
    t = found.get("--tensor-model-parallel-size", 1)
    p = found.get("--pipeline-model-parallel-size", 1)
    for flag, value in found.items():
        row = LAUNCH[flag]
        if row.field in _RUN_FIELDS:
            fields[row.field] = value
            carried.append((flag, row.field))
    if found.get("--sequence-parallel") and t == 1:   # arguments.py 1433-1439
        fields["sequence_parallel"] = False
    _chunks(found, model, p, fields, carried, where)
    _uneven(found, model, p, fields, carried, later, where)
    _recompute(found, model, p, fields, carried, later, where)
    _precision(found, fields, carried, where)
    _dropout(found, fields, carried, later, where)
    if found.get("--use-distributed-optimizer"):
        carried.append(("--use-distributed-optimizer", "stages"))
    fields["stages"] = (1,) if found.get("--use-distributed-optimizer") else (0,)
    return Launch(model, fields, tuple(carried), tuple(later), where)


_RUN_FIELDS = frozenset({"tensor_parallel", "pipeline_parallel", "context_parallel",
                         "expert_parallel", "expert_tensor_parallel", "sequence_parallel",
                         "micro_batch", "global_batch", "seq_len"})


def _chunks(found, model, p, fields, carried, where) -> None:
    per_rank = found.get("--num-virtual-stages-per-pipeline-rank")
    per_chunk = found.get("--num-layers-per-virtual-pipeline-stage")
    if per_rank is not None and per_chunk is not None:
        raise ValueError(f"{where}: --num-layers-per-virtual-pipeline-stage and "
                         f"--num-virtual-stages-per-pipeline-rank: give one")
    if per_chunk is not None:    # arguments.py 953-976
        layers = model.layers
        if layers % p or (layers // p) % per_chunk:
            raise ValueError(f"{where}: --num-layers-per-virtual-pipeline-stage {per_chunk}: the "
                             f"{layers} layers over {p} pipeline stages must be whole chunks of it")
        per_rank = layers // p // per_chunk
        carried.append(("--num-layers-per-virtual-pipeline-stage", "pipeline_chunks"))
    elif per_rank is not None:
        carried.append(("--num-virtual-stages-per-pipeline-rank", "pipeline_chunks"))
    if per_rank is not None and per_rank > 1:   # one chunk: no interleaving (arguments.py 978)
        if p == 1:
            raise ValueError(f"{where}: virtual pipeline stages need --pipeline-model-parallel-size "
                             f"of 2 or more")
        fields.update(pipeline_chunks=per_rank, pipeline_schedule="interleaved")


def _uneven(found, model, p, fields, carried, later, where) -> None:
    """Uneven stages as Megatron-LM builds them (``transformer_block.py``
    ``get_num_layers_to_build``, ``transformer_layer.py`` ``get_transformer_layer_offset``):
    the first and/or last stage's layers given, the rest split evenly over the other stages
    (a stage not given is one of them); or the embedding and/or the loss counted as a layer
    (``--account-for-...-in-pipeline-split``: (L + 1 or 2) / p per stage, one fewer on the
    first and/or last). The rules are :class:`~zerolib.core.run.Parallelism`'s, checked when the
    run is made; Megatron-LM's own refusals are repeated here in its words."""
    first = found.get("--decoder-first-pipeline-num-layers")
    last = found.get("--decoder-last-pipeline-num-layers")
    embedding = bool(found.get("--account-for-embedding-in-pipeline-split"))
    loss = bool(found.get("--account-for-loss-in-pipeline-split"))
    given = [flag for flag in ("--decoder-first-pipeline-num-layers",
                               "--decoder-last-pipeline-num-layers",
                               "--account-for-embedding-in-pipeline-split",
                               "--account-for-loss-in-pipeline-split") if flag in found]
    if not given:
        if p > 1 and model.layers % p:   # arguments.py 985-1000
            raise ValueError(f"{where}: --pipeline-model-parallel-size {p}: Number of layers should "
                             f"be divisible by the pipeline-model-parallel size ({model.layers} "
                             f"layers; Megatron-LM's validate_args: give "
                             f"--decoder-first/last-pipeline-num-layers for uneven stages)")
        return
    if (first is not None or last is not None) and (embedding or loss):   # transformer_config.py
        raise ValueError(f"{where}: --decoder-first/last-pipeline-num-layers cannot be set with "
                         f"--account-for-embedding/loss-in-pipeline-split (Megatron-LM's "
                         f"TransformerConfig)")
    if (first is not None or last is not None) \
            and "--num-layers-per-virtual-pipeline-stage" in found:   # arguments.py 953-956
        raise ValueError(f"{where}: please use --num-virtual-stages-per-pipeline-rank to specify "
                         f"virtual pipeline parallel degree when enable uneven pipeline "
                         f"parallelism (Megatron-LM's validate_args)")
    if p < 2:
        raise ValueError(f"{where}: {given[0]} needs --pipeline-model-parallel-size of 2 or more")
    layers = model.layers
    if embedding or loss:
        if fields.get("pipeline_chunks", 1) > 1:
            later.append(f"{where}: {given[0]}: with virtual pipeline stages only the first (last) "
                         f"model chunk loses a layer, chunks of unequal size that are not "
                         f"modelled yet")
            return
        total = layers + embedding + loss
        if total % p:   # arguments.py 985-1000
            raise ValueError(f"{where}: {given[0]}: number of layers should be divisible by the "
                             f"pipeline-model-parallel size ({layers} + {embedding + loss} over {p})")
        first, last = total // p - embedding, total // p - loss
        if min(first, last) < 1:
            later.append(f"{where}: {given[0]}: a pipeline stage of no transformer layers is not "
                         f"modelled yet")
            return
    elif first is None or last is None:   # the stage not given is a middle one
        rest = p - 1
        known = first if first is not None else last
        if (layers - known) % rest or layers <= known:
            raise ValueError(f"{where}: {given[0]} {known}: the other {layers - known} layers must "
                             f"split evenly over the other {rest} pipeline stages (Megatron-LM's "
                             f"TransformerConfig)")
        other = (layers - known) // rest
        first, last = (known, other) if first is not None else (other, known)
    fields["pipeline_layers"] = (first, last)
    carried.extend((flag, "pipeline_layers") for flag in given)


def _recompute(found, model, p, fields, carried, later, where) -> None:
    granularity = found.get("--recompute-granularity")
    if found.get("--recompute-activations"):   # arguments.py 607-608
        granularity = "selective"
        carried.append(("--recompute-activations", "recompute"))
    elif granularity is not None:
        carried.append(("--recompute-granularity", "recompute"))
    method, layers = found.get("--recompute-method"), found.get("--recompute-num-layers")
    if granularity == "selective" and method is not None:    # arguments.py 1425-1428
        raise ValueError(f"{where}: --recompute-method: recompute method is not yet supported for "
                         f"selective recomputing granularity (Megatron-LM's validate_args)")
    if granularity == "selective" and layers is not None:    # transformer_config.py 1926-1931
        raise ValueError(f"{where}: --recompute-num-layers: with --recompute-granularity selective "
                         f"recompute_num_layers must be None (Megatron-LM's TransformerConfig)")
    if granularity == "full":
        if method is None or layers is None:   # transformer_config.py 1908-1924
            raise ValueError(f"{where}: --recompute-granularity full needs --recompute-method "
                             f"(uniform or block) and --recompute-num-layers (Megatron-LM's "
                             f"TransformerConfig)")
        # uniform N: chunks of N layers keep their input and are recomputed whole; block N: the
        # first N layers of each model chunk checkpointed, the rest kept whole
        # (megatron/core/recompute.py checkpointed_forward, 150-180: min(N, the chunk's layers),
        # so N above them is accepted there and here). Every method and count is carried.
        fields.update(recompute_method=method, recompute_layers=layers)
        carried += [("--recompute-method", "recompute_method"),
                    ("--recompute-num-layers", "recompute_layers")]
    elif granularity is None and (method is not None or layers is not None):
        flag = "--recompute-method" if method is not None else "--recompute-num-layers"
        raise ValueError(f"{where}: {flag} without --recompute-granularity full recomputes nothing")
    # Megatron-LM recomputes nothing without a granularity (recompute_granularity = None),
    # whatever a trainer's default would be.
    fields["recompute"] = "none" if granularity is None else granularity


def _precision(found, fields, carried, where) -> None:
    if found.get("--bf16") and found.get("--fp16"):
        raise ValueError(f"{where}: --bf16 and --fp16: give one")
    if found.get("--bf16") or found.get("--fp16"):
        flag = "--bf16" if found.get("--bf16") else "--fp16"
        carried.append((flag, "element_bytes"))
        fields["element_bytes"] = 2
        # The gradient buffer's dtype (arguments.py 1205-1216): fp32 under --bf16 unless
        # --grad-reduce-in-bf16; the parameters' own (fp16) under --fp16 unless
        # --accumulate-allreduce-grads-in-fp32.
        fp32 = found.get("--accumulate-allreduce-grads-in-fp32") or (
            flag == "--bf16" and not found.get("--grad-reduce-in-bf16"))
        for given in ("--accumulate-allreduce-grads-in-fp32", "--grad-reduce-in-bf16"):
            if found.get(given):
                carried.append((given, "layout"))
        fields["layout"] = "bf16-fp32-grads" if fp32 else "mixed-adam"
    else:   # fp32 training: fp32 weights, gradients and Adam; 4-byte activations
        fields.update(element_bytes=4, layout="fp32-adam")


def _dropout(found, fields, carried, later, where) -> None:
    hidden = found.get("--hidden-dropout", DEFAULT_DROPOUT)
    attention = found.get("--attention-dropout", DEFAULT_DROPOUT)
    if (hidden > 0) != (attention > 0):
        later.append(f"{where}: --hidden-dropout {hidden:g} with --attention-dropout {attention:g}: "
                     f"dropout in one place and not the other is not modelled yet (zerolib's "
                     f"dropout masks are all or none)")
        return
    for flag in ("--hidden-dropout", "--attention-dropout"):
        if flag in found:
            carried.append((flag, "dropout"))
    fields["dropout"] = hidden > 0


def run_from_megatron_args(source, *, gpus: int | None = None, name: str = "megatron-gpt"):
    """The :class:`~zerolib.core.run.Run` a Megatron-LM launch line describes (see the module
    doc), on ``gpus`` GPUs (None: the fewest it runs on, tensor x pipeline x context parallel);
    a ``ValueError`` in one line naming the source and the flag for what cannot be read or is
    not modelled yet (the first of them)."""
    from zerolib.core.run import Run

    launch = read_launch(source, name=name)
    if launch.not_modelled:
        raise ValueError(launch.not_modelled[0])
    fields = dict(launch.fields)
    model_parallel = (fields.get("tensor_parallel", 1) * fields.get("pipeline_parallel", 1)
                      * fields.get("context_parallel", 1))
    if gpus is None:
        gpus = model_parallel
    elif isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= MAX_GPUS:
        raise ValueError(f"gpus must be a whole number from 1 to {MAX_GPUS:,}, got {echo(gpus)}")
    if gpus % model_parallel:   # arguments.py: the world size divisible by t x p x C
        raise ValueError(f"{launch.where}: {gpus} GPUs are not a multiple of tensor x pipeline x "
                         f"context parallel ({model_parallel})")
    if "global_batch" in fields:   # Megatron-LM's micro-batches per step: B / (b x d)
        data = gpus // model_parallel
        per_step = data * fields.get("micro_batch", 1)
        if fields["global_batch"] % per_step:
            raise ValueError(f"{launch.where}: --global-batch-size {fields['global_batch']} is not a "
                             f"multiple of --micro-batch-size x data parallel ({per_step})")
        fields["micro_batches"] = fields["global_batch"] // per_step
    return Run.of(launch.model, gpus, **fields)

