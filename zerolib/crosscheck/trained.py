"""Configurations that really trained (``data/trained_configurations.csv``), judged by zerolib.

Each row is a published run: its model, GPUs, device, tensor/pipeline/data parallel degrees,
virtual pipeline chunks, micro-batch and global batch, sequence, recomputation, sequence
parallelism, the training code (``framework``, as the source names it) and the engine zerolib's
step model would run it as (``engine``: one of :data:`ENGINES`), the ZeRO stage, and what the
source reports (throughput, memory, step time).
``data/trained_configurations.md`` cites each row and says which columns were assumed.

The models are presets of :mod:`zerolib.core.catalogue.models`, a published ``config.json`` named
by its path in the repository (``tests/data/...json``, read by
:func:`zerolib.core.catalogue.hf_config.model_from_config`) or, for architectures neither holds, a
:class:`TransformerConfig` built here from the paper's stated hyperparameters
(:data:`ARCHITECTURES`). Three questions per row:

- :func:`judge`: the peak per GPU under the row's settings, exactly as ``zerolib estimate``
  computes it (:func:`zerolib.core.estimate.estimate`), against the device's capacity;
- :func:`planner_check`: whether :func:`zerolib.core.planner.plan` lists the row's configuration
  among those that fit, and at which rank, in its default search (every schedule the layers
  allow) or over a given set of virtual chunks;
- :func:`throughput`: the step time the planner predicts for that configuration at a stated
  kernel efficiency (``mfu``), turned into the unit the source reports, and the ratio.

A mixture of experts' row states its expert-parallel degree E (inside d x C, Megatron-LM's
rule): its experts' state is sharded over d x C / E (:mod:`zerolib.core.memory.expert_parallel`),
the planner times its all-to-alls, and its model FLOPs are the active parameters'
(:func:`zerolib.core.catalogue.models.active_parameter_count`). A row with context parallelism
C holds t x p x d x C GPUs, ZeRO over d x C. Each row is judged and planned under its engine.
"""
from __future__ import annotations

import csv
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from types import MappingProxyType

import pandas as pd

from zerolib.core.catalogue.devices import get_device
from zerolib.core.catalogue.hf_config import model_from_config
from zerolib.core.catalogue.models import MODELS, TransformerConfig, active_parameter_count, parameter_count
from zerolib.core.estimate import estimate
from zerolib.core.memory.accounting import Layout, get_layout
from zerolib.core.memory.model_parallel import ALL_CHUNKS, chunks_for
from zerolib.core.planner import plan
from zerolib.core.run import Run
from zerolib.core.step.flops import multiplied_parameters
from zerolib.crosscheck.korthikanti import gpt
from zerolib.paths import REPO_ROOT, data_file

CSV_NAME = "trained_configurations.csv"
# BLOOM-176B (BigScience, arXiv 2211.05100; train/tr11-176B-ml/tr11-176B-ml.slurm): NHIDDEN
# 14336, NLAYERS 70, NHEADS 112, SEQ_LEN 2048, --pad-vocab-size-to 250880; a Megatron GPT block
# (LayerNorm with biases, fused QKV, GeLU MLP of 4h, tied embeddings). ALiBi has no parameters,
# as rotary has none, so "rotary" stands for it; the extra LayerNorm on the embeddings
# (--embed-layernorm, 2 x 14336 elements) is not expressible and is left out.
BLOOM = TransformerConfig(
    "bloom-176b", hidden=14336, layers=70, heads=112, kv_heads=112, ffn_hidden=4 * 14336,
    vocab=250_880, max_positions=2048, tied_embeddings=True, gated_mlp=False, norm="layernorm",
    position_embedding="rotary", qkv_bias=True, output_bias=True, mlp_bias=True, fused_qkv=True,
    dropout=True,
    source="BigScience tr11-176B-ml.slurm (bigscience-workshop/bigscience) and the BLOOM paper "
           "(arXiv 2211.05100): 176,247M parameters")

# Narayanan et al. 2021 (arXiv 2104.04473) Table 1: (billions as printed, heads, hidden size,
# layers); "All models use a vocabulary size of 51,200 and a sequence length of 2048" (the
# Megatron-LM README), the same Megatron GPT block as Korthikanti et al.'s.
NARAYANAN_TABLE1 = (("1.7", 24, 2304, 24), ("3.6", 32, 3072, 30), ("7.5", 32, 4096, 36),
                    ("18.4", 48, 6144, 40), ("39.1", 64, 8192, 48), ("76.1", 80, 10240, 60),
                    ("145.6", 96, 12288, 80), ("310.1", 128, 16384, 96),
                    ("529.6", 128, 20480, 105), ("1008", 160, 25600, 128))


def _narayanan(billions: str, heads: int, hidden: int, layers: int) -> TransformerConfig:
    return replace(gpt(f"narayanan-{billions}b", heads, hidden, layers),
                   source=f"Narayanan et al. 2021 (arXiv 2104.04473) Table 1, {billions}B row; "
                          f"s = 2048, v = 51,200")


# DeepSeek-V3's config.json shape fields (deepseek-ai/DeepSeek-V3; the report, arXiv 2412.19437,
# Sec. 4.2: 61 layers, hidden 7168, 256 routed experts of width 2048 plus 1 shared, 8 routed per
# token, the first 3 layers dense, MLA ranks 512 / 1536): 671,026,404,352 parameters without the
# multi-token-prediction module. No DeepSeek-V3 config.json is in tests/data and no preset
# holds it, so it is built here.
DEEPSEEK_V3_CONFIG = MappingProxyType({
    "model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
    "moe_layer_freq": 1, "n_group": 8, "topk_group": 4, "num_nextn_predict_layers": 1,
    "max_position_embeddings": 163840, "tie_word_embeddings": False})

ARCHITECTURES: Mapping[str, TransformerConfig] = MappingProxyType({
    **{f"narayanan-{row[0]}b": _narayanan(*row) for row in NARAYANAN_TABLE1},
    # Korthikanti et al. Table 3 (the same models as zerolib.crosscheck.korthikanti.RUNS).
    "korthikanti-22b": gpt("22B", 64, 6144, 48),
    "korthikanti-175b": gpt("175B", 96, 12288, 96),
    "korthikanti-530b": gpt("530B", 128, 20480, 105),
    "korthikanti-1t": gpt("1T", 160, 25600, 128),
    # MT-NLG 530B (Smith et al. 2022, arXiv 2201.11990): 105 layers, hidden 20480, 128 heads,
    # the model Korthikanti et al.'s 530B row stands for (Megatron pads the GPT-2 vocabulary to
    # 51,200 at t = 8).
    "mt-nlg-530b": gpt("MT-NLG 530B", 128, 20480, 105),
    "bloom-176b": BLOOM,
    "deepseek-v3": model_from_config(dict(DEEPSEEK_V3_CONFIG), name="deepseek-v3"),
})
# Layouts no preset holds, by the name a row gives: DeepSeek-V3 (Sec. 3.3) keeps BF16 weights,
# FP32 weight gradients, FP32 master weights and BF16 AdamW moments: 2 + 4 + (4 + 2 + 2).
ROW_LAYOUTS: Mapping[str, Layout] = MappingProxyType({
    "bf16-fp32-grads-bf16-moments": Layout.custom(2, 4, 8, name="bf16-fp32-grads-bf16-moments")})
CONFIG_FOLDER = "tests/data/"   # a row's model may be a published config.json there
# tflops_per_gpu: model FLOPs (6 per parameter and token); hardware_tflops_per_gpu: with the
# recomputed forward pass counted too (8 under full recomputation), as Narayanan et al.'s Eq. 3.
METRICS = ("mfu", "tflops_per_gpu", "hardware_tflops_per_gpu", "tokens_per_gpu_second")
DEFAULT_MFU = 0.5    # the stated kernel efficiency of the throughput comparison
# The engines the step model names (zerolib.core.step.engines): "paper" is the ZeRO paper's
# schedule, "deepspeed" DeepSpeed at its defaults, "fsdp2" PyTorch FSDP2, "megatron" Megatron-LM
# (its distributed optimizer at stage 1). A row records the one its training code is.
ENGINES = ("paper", "deepspeed", "fsdp2", "megatron")
TFLOPS = 10**12
# How each source counts a token's FLOPs (docs/flops.md), so that a published TFLOP/s or MFU
# turns back into tokens per second, which needs no convention:
# - "eq3": Narayanan et al. 2021 (arXiv 2104.04473) Eq. 3, 96 l h^2 (1 + s/6h + V/16lh) per
#   token, hardware FLOPs with full recomputation (BLOOM's logs count the same);
# - "korthikanti": Korthikanti et al.'s model FLOPs, 72 l h^2 (1 + s/6h + V/12lh) per token;
# - "palm": 6 N + 12 L (a d) s per token, N the parameters a matrix multiplies (a mixture's
#   active ones, no input embedding), the attention non-causal (PaLM App. B; Megatron-LM's
#   count before 2025-03-06; Llama 3's "BF16 MFU");
# - "tokens": the source reports tokens per second already.
FLOP_CONVENTIONS = ("eq3", "korthikanti", "palm", "tokens")
# Each device's kernel efficiency fitted to these runs (fitted_efficiency(): the median run of
# the device predicted at its published throughput), the rate on the FLOPs zerolib counts.


@dataclass(frozen=True)
class TrainedRun:
    """One row of ``data/trained_configurations.csv`` (types as the columns say)."""

    run: str
    model: str
    source: str
    gpus: int
    device: str
    tensor_parallel: int
    pipeline_parallel: int
    data_parallel: int
    context_parallel: int
    expert_parallel: int
    virtual_chunks: int
    micro_batch: int
    global_batch: int
    seq_len: int
    recompute: str
    sequence_parallel: bool
    flash_attention: bool
    framework: str              # the training code, as the source names it
    engine: str                 # one of ENGINES
    zero_stage: int
    layout: str                 # zerolib's layout: "mixed-adam", "bf16-fp32-grads", ...
    published_metric: str
    published_value: float
    published_memory_gb: float | None
    published_step_seconds: float | None
    assumed: tuple[str, ...]
    flop_convention: str        # how the source counts FLOPs: one of FLOP_CONVENTIONS

    @property
    def config(self) -> TransformerConfig:
        if self.model.startswith(CONFIG_FOLDER):
            return _config_file(self.model)
        return ARCHITECTURES[self.model] if self.model in ARCHITECTURES else MODELS[self.model]

    @property
    def widths(self) -> Layout:
        """The row's layout: a preset or one of :data:`ROW_LAYOUTS`."""
        return ROW_LAYOUTS.get(self.layout) or get_layout(self.layout)

    @property
    def micro_batches(self) -> int:
        """Micro-batches per step and pipeline."""
        return self.global_batch // (self.data_parallel * self.micro_batch)

    @property
    def flops_parameters(self) -> int:
        """Parameters a token's model FLOPs count: a mixture's active ones, else all."""
        config = self.config
        return active_parameter_count(config) if config.mixture_of_experts else parameter_count(config)

    @property
    def described(self) -> Run:
        """The row as a zerolib run, at its own ZeRO stage under its own engine."""
        return Run.of(
            self.config, self.gpus, device=self.device, layout=self.widths,
            engine=self.engine, stages=(self.zero_stage,), seq_len=self.seq_len,
            micro_batch=self.micro_batch, recompute=self.recompute,
            flash_attention=self.flash_attention, tensor_parallel=self.tensor_parallel,
            sequence_parallel=self.sequence_parallel, pipeline_parallel=self.pipeline_parallel,
            pipeline_schedule="interleaved" if self.virtual_chunks > 1 else "1f1b",
            pipeline_chunks=self.virtual_chunks, micro_batches=self.micro_batches,
            context_parallel=self.context_parallel, expert_parallel=self.expert_parallel)


@lru_cache(maxsize=16)
def _config_file(name: str) -> TransformerConfig:
    return model_from_config(REPO_ROOT / name)


def _value(field, text: str):
    if field.name == "assumed":
        return tuple(name for name in text.split(";") if name)
    if field.name in ("published_memory_gb", "published_step_seconds"):
        return float(text) if text else None
    if field.type == "int":
        return int(text)
    if field.type == "float":
        return float(text)
    if field.type == "bool":
        if text not in ("True", "False"):
            raise ValueError(f"{field.name} must be True or False, got {text!r}")
        return text == "True"
    return text


def _checked(run: TrainedRun) -> TrainedRun:
    known = run.model in ARCHITECTURES or run.model in MODELS or (
        run.model.startswith(CONFIG_FOLDER) and run.model.endswith(".json")
        and (REPO_ROOT / run.model).is_file())
    if not known:
        raise ValueError(f"model must be a preset, a {CONFIG_FOLDER}*.json config or one of "
                         f"{', '.join(ARCHITECTURES)}, got {run.model!r} (row {run.run})")
    e, group = run.expert_parallel, run.data_parallel * run.context_parallel
    experts = run.config.experts
    if e != 1 and (not experts or experts % e or group % e):
        # Megatron-LM's rule: E divides the routed experts and sits inside d x C.
        raise ValueError(f"expert_parallel ({e}) must divide the routed experts ({experts}) and "
                         f"data_parallel x context_parallel ({group}) (row {run.run})")
    t, p, d = run.tensor_parallel, run.pipeline_parallel, run.data_parallel
    if t * p * d * run.context_parallel != run.gpus:
        raise ValueError(f"gpus ({run.gpus}) must equal tensor x pipeline x data x context "
                         f"parallel ({t} x {p} x {d} x {run.context_parallel}) (row {run.run})")
    if run.global_batch % (d * run.micro_batch):
        raise ValueError(f"global_batch ({run.global_batch}) must be a multiple of data_parallel x "
                         f"micro_batch ({d} x {run.micro_batch}) (row {run.run})")
    if run.engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {run.engine!r} "
                         f"(row {run.run})")
    if run.flop_convention not in FLOP_CONVENTIONS:
        raise ValueError(f"flop_convention must be one of {', '.join(FLOP_CONVENTIONS)}, got "
                         f"{run.flop_convention!r} (row {run.run})")
    if (run.flop_convention == "tokens") != (run.published_metric == "tokens_per_gpu_second"):
        raise ValueError(f"flop_convention 'tokens' goes with published_metric "
                         f"tokens_per_gpu_second (row {run.run})")
    if run.published_metric not in METRICS:
        raise ValueError(f"published_metric must be one of {', '.join(METRICS)}, got "
                         f"{run.published_metric!r} (row {run.run})")
    unknown = set(run.assumed) - {f.name for f in fields(TrainedRun)}
    if unknown:
        raise ValueError(f"assumed must name columns, got {sorted(unknown)} (row {run.run})")
    get_device(run.device)
    _ = run.widths    # a layout that is neither a preset nor one of ROW_LAYOUTS raises here
    return run


def load(data_dir=None) -> tuple[TrainedRun, ...]:
    """Every row of ``trained_configurations.csv`` in ``data_dir`` (None: the repository's)."""
    path = data_file(data_dir, CSV_NAME, "the published training configurations")
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    return tuple(_checked(TrainedRun(**{f.name: _value(f, row[f.name]) for f in fields(TrainedRun)}))
                 for row in rows)


def judge(run: TrainedRun) -> dict:
    """The peak per GPU of ``run`` under its own settings and ZeRO stage (bytes), the device's
    capacity, whether it fits, the headroom and the working-set terms."""
    # Under the engine the source states: its stages and which of them run beside a pipeline.
    result = estimate(run.described)
    row = result.stages[0]
    capacity = get_device(run.device).capacity
    return {"run": run.run, "parameters": parameter_count(run.config),
            "persistent": row["total"], "working_set": dict(row["working_set"]),
            "peak": row["peak"], "capacity": capacity, "fits": row["fits"],
            "headroom": capacity - row["peak"], "pipeline_stage": row["pipeline_stage"]}


def planner_check(run: TrainedRun, chunks=ALL_CHUNKS, mfu: float = DEFAULT_MFU,
                  whole: bool = False) -> dict:
    """Whether the planner's search over ``chunks`` (its default: every schedule the layers
    allow) covers the row's schedule, and if so the row's configuration in the plan: found among
    the runnable ones, fits, its rank among the fitting ones (1 = fastest) and step seconds. The
    search keeps the row's recomputation, sequence parallelism, stage and no offload, and varies
    t, p, d, the schedule and the micro-batch (a mixture of experts: E = 1 and the row's E);
    ``whole``: it varies every stage, recomputation and sequence parallelism too, and every E
    (the plan for the row's model, GPUs, device, sequence and batch, without offload and with
    whole shard groups)."""
    covered = run.virtual_chunks in chunks_for(run.config, run.pipeline_parallel, chunks)
    out = {"run": run.run, "covered": covered, "found": False, "fits": False, "rank": 0,
           "fitting": 0, "step_seconds": None}
    if not covered:
        return out
    # The rows state no ZeRO-R (DeepSpeed's default: off), so the fixed search keeps it off.
    fixed = {} if whole else dict(stages=(run.zero_stage,), recompute=(run.recompute,),
                                  sequence_parallel=(run.sequence_parallel,), zero_r=("none",))
    degrees = {} if run.config.experts == 0 else {"expert_parallel": (
        None if whole else tuple(sorted({1, run.expert_parallel})))}     # whole: every E
    result = plan(run.config, run.gpus, 8, run.device, run.seq_len, run.global_batch,
                  layout=run.widths, mfu=mfu, chunks=chunks, offload=("none",),
                  shard_groups="whole", engine=run.engine, **fixed, **degrees,
                  context_parallel=tuple(sorted({1, run.context_parallel})),
                  max_micro_batch=max(8, run.micro_batch),
                  flash_attention=run.flash_attention)
    valid = result.valid
    match = valid[(valid["tensor_parallel"] == run.tensor_parallel)
                  & (valid["pipeline_parallel"] == run.pipeline_parallel)
                  & (valid["data_parallel"] == run.data_parallel)
                  & (valid["chunks"] == run.virtual_chunks)
                  & (valid["micro_batch"] == run.micro_batch)
                  & (valid["stage"] == run.zero_stage)
                  & (valid["recompute"] == run.recompute)
                  & (valid["sequence_parallel"] == run.sequence_parallel)
                  & (valid.get("context_parallel", 1) == run.context_parallel)
                  & (valid.get("expert_parallel", 1) == run.expert_parallel)
                  & ~valid.get("partition_activations", False)]
    out["fitting"] = int(valid["fits"].sum())
    if len(match):
        first = match.iloc[0]
        out.update(found=True, fits=bool(first["fits"]), rank=int(first["rank"]),
                   step_seconds=float(first["step_seconds"]),
                   peak=int(first["peak_bytes"]))
    return out


def throughput(run: TrainedRun, mfu: float = DEFAULT_MFU) -> dict:
    """zerolib's predicted step seconds for the row's configuration (the planner's step model at
    ``mfu``), in the unit the source reports, and published / predicted. The model FLOPs of a
    step are 6 x parameters x tokens (a mixture's active parameters); hardware FLOPs 8 x with
    full recomputation (as the step model counts them)."""
    check = planner_check(run, mfu=mfu)
    seconds = check["step_seconds"]
    tokens = run.global_batch * run.seq_len
    per_gpu_tokens = tokens / seconds / run.gpus
    model_flops = 6 * run.flops_parameters * tokens / seconds / run.gpus
    hardware_flops = model_flops * (8 if run.recompute == "full" else 6) / 6
    peak = get_device(run.device).peak_flops
    predicted = {"mfu": model_flops / peak, "tflops_per_gpu": model_flops / TFLOPS,
                 "hardware_tflops_per_gpu": hardware_flops / TFLOPS,
                 "tokens_per_gpu_second": per_gpu_tokens}[run.published_metric]
    # Where the source states its step time, the two steps compare with no FLOP convention.
    published_step = run.published_step_seconds
    return {"run": run.run, "mfu": mfu, "step_seconds": seconds,
            "metric": run.published_metric, "published": run.published_value,
            "predicted": predicted, "ratio": run.published_value / predicted,
            "published_step_seconds": published_step,
            "step_ratio": None if published_step is None else seconds / published_step}


def publisher_flops_per_token(run: TrainedRun) -> float:
    """A token's FLOPs as the row's source counts them (:data:`FLOP_CONVENTIONS`); 0 for
    "tokens". Worked from the model's shape, not from zerolib's step model."""
    c, s = run.config, run.seq_len
    h, layers, v = c.hidden, c.layers, c.vocab
    if run.flop_convention == "eq3":
        return 96 * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))
    if run.flop_convention == "korthikanti":
        return 72 * layers * h * h * (1 + s / (6 * h) + v / (12 * layers * h))
    if run.flop_convention == "palm":
        return 6 * multiplied_parameters(c) + 12 * layers * c.heads * c.head_width * s
    return 0.0


def published_throughput(run: TrainedRun, mfu: float | None = None) -> dict:
    """The row's published and predicted tokens per GPU and second, the published value turned
    into tokens with the source's own FLOP convention (:func:`publisher_flops_per_token`), and
    predicted / published, at ``mfu`` (None: the device's :func:`fitted_efficiency`)."""
    mfu = fitted_efficiency()[run.device] if mfu is None else mfu
    seconds = planner_check(run, mfu=mfu)["step_seconds"]
    predicted = run.global_batch * run.seq_len / seconds / run.gpus
    per_token = publisher_flops_per_token(run)
    value = run.published_value
    published = {"mfu": value * get_device(run.device).peak_flops,
                 "tflops_per_gpu": value * TFLOPS, "hardware_tflops_per_gpu": value * TFLOPS,
                 "tokens_per_gpu_second": value}[run.published_metric]
    if per_token:
        published = published / per_token
    return {"run": run.run, "device": run.device, "mfu": mfu, "convention": run.flop_convention,
            "step_seconds": seconds, "published_tokens": published, "predicted_tokens": predicted,
            "publisher_flops_per_token": per_token, "ratio": predicted / published}


@lru_cache(maxsize=1)
def fitted_efficiency(rounds: int = 3) -> Mapping[str, float]:
    """Per device, the kernel efficiency at which the median of its runs is predicted at its
    published tokens per second: from 0.5, each round scales it by the median published /
    predicted (the step is mostly compute, so throughput is nearly proportional to it)."""
    runs = load()
    fitted = {}
    for device in sorted({run.device for run in runs}):
        mine, mfu = [run for run in runs if run.device == device], DEFAULT_MFU
        for _ in range(rounds):
            ratios = sorted(published_throughput(run, mfu)["ratio"] for run in mine)
            middle = len(ratios) // 2
            median = (ratios[middle] if len(ratios) % 2
                      else (ratios[middle - 1] + ratios[middle]) / 2)
            mfu = min(mfu / median, 1.0)
        fitted[device] = round(mfu, 3)
    return MappingProxyType(fitted)


def throughput_table(runs=None) -> pd.DataFrame:
    """:func:`published_throughput` of every run (or ``runs``) at its device's fitted efficiency,
    one row per run: what :func:`zerolib.chapter.charts.published_runs.published_runs_figure`
    draws."""
    rows = [published_throughput(run) for run in (load() if runs is None else runs)]
    frame = pd.DataFrame(rows)
    frame.attrs.update(fitted=dict(fitted_efficiency()))
    return frame


def summary(runs=None, mfu: float = DEFAULT_MFU) -> pd.DataFrame:
    """One row per run: the verdict, the planner's answer and the throughput ratio, as
    ``data/trained_configurations.md`` tabulates them (peaks in bytes)."""
    rows = []
    for run in load() if runs is None else runs:
        verdict, check = judge(run), planner_check(run, mfu=mfu)
        old_default = planner_check(run, chunks=(1, 2), mfu=mfu)["covered"]
        everything = planner_check(run, mfu=mfu, whole=True)
        speed = throughput(run, mfu)
        rows.append({"run": run.run, "parameters": verdict["parameters"], "peak": verdict["peak"],
                     "headroom": verdict["headroom"],
                     "activations": verdict["working_set"]["activations"],
                     "persistent": verdict["persistent"], "fits": verdict["fits"],
                     "engine": run.engine, "default_search_covers": check["covered"],
                     "old_default_covers": old_default, "rank": check["rank"],
                     "fitting": check["fitting"], "whole_rank": everything["rank"],
                     "whole_fitting": everything["fitting"], "step_seconds": speed["step_seconds"],
                     "published": speed["published"], "predicted": speed["predicted"],
                     "ratio": speed["ratio"], "published_step_seconds": speed["published_step_seconds"],
                     "step_ratio": speed["step_ratio"]})
    frame = pd.DataFrame(rows)
    frame.attrs.update(mfu=mfu)
    return frame
