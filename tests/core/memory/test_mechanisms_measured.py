"""Each trainer mechanism of the memory model held to its CPU measurement
(data/mechanisms_measured.csv: the real PyTorch code, transformers' Llama layers, Megatron-LM's
loss, FSDP2 over fake ranks). The expected bytes are worked out here from the shapes by hand,
from what each trainer's code saves, then compared with both the measurement and zerolib."""
from __future__ import annotations

import csv
import re
from dataclasses import replace
from pathlib import Path

import pytest

from zerolib.core.memory.activations import ActivationOptions, layer_activation_terms, layer_shape
from zerolib.core.memory.loss import loss_bytes
from zerolib.core.memory.pipeline_schedule import stage_activation_terms
from zerolib.core.memory.working_set import WorkingSetSettings, working_set

ROWS = list(csv.DictReader((Path(__file__).parents[3] / "data" / "mechanisms_measured.csv")
                           .open(encoding="utf-8")))
LAYERS = 4   # every activation row ran 4 LlamaDecoderLayers


def _shape(configuration: str) -> dict[str, int]:
    return {key: int(value) for key, value in
            re.findall(r"\b(s|b|h|a|k|d|f)=(\d+)", configuration)}


def _by_hand(case: str, g: dict[str, int]) -> int:
    """Bytes per token per layer of each policy, from what autograd saves in a Llama block
    (bf16 = 2 bytes, fp32 = 4): eager RMSNorm keeps its bf16 input, fp32 copy and 1/rms (2h + 4h
    + 4 per norm, two norms); q, k, v, o inputs and outputs; the flash kernel its output and
    fp32 log-sum-exp per head; SwiGLU its gate, up, silu and product; dropout a bool mask."""
    h, a, k, d, f = g["h"], g["a"], g["k"], g["d"], g["f"]
    everything = 16 * h + 8 + 4 * a * d + 4 * k * d + 4 * a + 8 * f
    op_level = 2 * h + 2 * a * d + 2 * k * d + (2 * a * d + 4 * a) + 2 * f + 2 * h
    return {"none": everything, "none-dropout": everything + 2 * h,
            "selective": everything - 4 * a, "selective-dropout": everything - 4 * a + 2 * h,
            "op-sac": op_level, "float8-none": everything,
            "full": 2 * h, "uniform-2": 2 * h * 2 // LAYERS,
            "block-2": (2 * 2 * h + 2 * everything) // LAYERS}.get(case)


OPTIONS = {
    "none": dict(recompute="none"), "none-dropout": dict(recompute="none", dropout=True),
    "selective": dict(recompute="selective"),
    "selective-dropout": dict(recompute="selective", dropout=True),
    "op-sac": dict(recompute="op-selective"), "float8-none": dict(recompute="none", fp8=True),
    "float8-op-sac": dict(recompute="op-selective", fp8=True), "full": dict(recompute="full"),
    "uniform-2": dict(recompute="full", recompute_method="uniform", recompute_layers=2),
    "block-2": dict(recompute="full", recompute_method="block", recompute_layers=2),
}
ACTIVATION_ROWS = [row for row in ROWS if row["mechanism"].startswith("saved activations")
                   and row["case"] in OPTIONS]


def _zerolib(case: str, g: dict[str, int]) -> int:
    """zerolib's bytes of the 4 layers' saved activations (the stage's layers term)."""
    config = layer_shape(g["h"], g["a"], kv_heads=g["k"], ffn_hidden=g["f"], head_dim=g["d"],
                         gated_mlp=True, dropout=False)
    asked = {"dropout": False, **OPTIONS[case]}
    options = ActivationOptions(norms="eager", flash_attention=True, **asked)
    if case in ("uniform-2", "block-2"):
        model = replace(config, layers=LAYERS)
        return stage_activation_terms(model, g["s"], g["b"], options=options)["transformer_layers"]
    return LAYERS * sum(layer_activation_terms(config, g["s"], g["b"], options=options).values())


@pytest.mark.parametrize("row", ACTIVATION_ROWS, ids=lambda r: f"{r['mechanism']}-{r['case']}")
def test_saved_activations_are_the_measured_bytes(row):
    g = _shape(row["configuration"])
    tokens = g["s"] * g["b"]
    hand = _by_hand(row["case"], g)
    if row["case"] == "float8-op-sac":   # + two bf16 amax scalars per Linear, 7 Linears a layer
        expected = LAYERS * (tokens * _by_hand("op-sac", g) + 7 * 2 * 2)
    else:
        expected = LAYERS * tokens * hand
    assert int(row["measured_bytes"]) == expected
    assert _zerolib(row["case"], g) == expected


def _loss_rows():
    return [row for row in ROWS if row["mechanism"] == "logits and loss"]


# Bytes per logit at the loss's peak, the bf16 logits kept by the caller (as measured).
PER_LOGIT = {"eager-fp32": ("eager", 2 + 4 + 4 + 4), "eager-bf16": ("eager-bf16", 2 + 2 + 2 + 2),
             "chunked-fp32": ("chunked", 2 + 4 + 1), "compiled-fp32": ("compiled", 2 + 2),
             "vocab-parallel-2": ("vocab-parallel", 2 + 4 + 2),
             "vocab-parallel-4": ("vocab-parallel", 2 + 4 + 2)}


@pytest.mark.parametrize("row", _loss_rows(), ids=lambda r: r["case"])
def test_each_loss_is_its_measured_bytes_per_logit(row):
    loss, per_logit = PER_LOGIT[row["case"]]
    logits = int(row["units"])     # N x V (x 1/t for the vocabulary-parallel shard)
    assert loss_bytes(loss, logits, chunks=8) == per_logit * logits
    # the measurement adds the scalars and per-token tensors (the loss, the targets): < 0.3 %
    assert 0 <= int(row["measured_bytes"]) - per_logit * logits < 0.003 * per_logit * logits


def test_a_freed_eager_loss_is_twelve_bytes_per_logit():
    # torchtitan deletes its logits before the backward: the three fp32 tensors of the chain
    assert loss_bytes("eager", 1000, freed=True) == 12 * 1000


# FSDP2 under a pipeline: 2 Llama layers (h 64, a 4, k 2, d 16, f 160): P = 86,272, 18 tensors,
# 14 of them Linear weights holding P_linear = 86,016 elements.
P = 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 160 + 2 * 64)
P_LINEAR = 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 160)


def _fsdp_row(case: str, formula: str) -> int:
    (row,) = [r for r in ROWS if r["mechanism"] == "FSDP2 state" and r["case"] == case
              and r["formula"] == formula]
    return int(row["measured_bytes"])


@pytest.mark.parametrize("fp8", [False, True])
def test_fsdp2_under_a_pipeline_keeps_the_stage_unsharded(fp8):
    assert P == 86_272 and P_LINEAR == 86_016
    model = replace(layer_shape(64, 4, kv_heads=2, ffn_hidden=160, head_dim=16, gated_mlp=True,
                                dropout=False), layers=6, vocab=128)
    settings = WorkingSetSettings(seq_len=64, micro_batch=1, pipeline_parallel=3,
                                  engine="torchtitan", fp8=fp8, fp8_all_gather=fp8)
    terms = working_set(model, 3, settings, "fp32-adam", pipeline_stage=1)   # a middle stage
    if fp8:   # 1-byte Linear weights and an fp32 scale each, the norms in bf16
        expected = P_LINEAR + 4 * 14 + 2 * (P - P_LINEAR)
        case, formula = "pipeline-fp8-after-micro-batch-1", "P_linear + 4 n_linear + 2 (P - P_linear)"
    else:
        expected = 2 * P
        case, formula = "pipeline-after-micro-batch-1", "2P"
    assert _fsdp_row(case, formula) == expected == terms["gathered_parameters"]
    # the gradients accumulated unsharded in fp32 over the micro-batches
    assert _fsdp_row(case, "4P") == 4 * P == terms["unsharded_gradients"]


def test_the_chapter_engines_keep_no_unsharded_state():
    model = replace(layer_shape(64, 4, kv_heads=2, ffn_hidden=160, head_dim=16, gated_mlp=True,
                                dropout=False), layers=6, vocab=128)
    settings = WorkingSetSettings(seq_len=64, micro_batch=1, pipeline_parallel=3, engine="fsdp2")
    assert "unsharded_gradients" not in working_set(model, 1, settings, pipeline_stage=1)
