"""What trainers' memory mechanisms keep, counted by hand from the shapes, beside the real runs.

Each case names the PyTorch code it runs (``mechanism_run`` runs it) and the count, in bytes,
that the code's own operators imply, worked out here from the shapes alone. The counts are the
reference the analytic model is held to: per token per layer (saved activations), per logit
(the loss), per parameter (FSDP2's state). Plain Python: the recorded file and the tests read
it without PyTorch.

Symbols: s = sequence length, b = micro-batch, T = s x b tokens, h = hidden, a = query heads,
k = key/value heads, d = head width, f = MLP width, L = layers, V = vocabulary, N = tokens of
the loss, t = tensor-parallel ranks. bf16 activations (2 bytes).

Sources of the policies (the code each case reproduces):

- torchtitan's op-level selective checkpointing (``SelectiveAC`` at commit b5bcd76c of
  pytorch/torchtitan, ``torchtitan/distributed/activation_checkpoint.py``; v0.2.2's
  ``_apply_op_sac`` with ``_op_sac_save_list`` in ``models/llama3/infra/parallelize.py``):
  ``torch.utils.checkpoint`` with ``create_selective_checkpoint_contexts``; the outputs of the
  listed ops are saved (mm, the CUDA SDPA kernels, reduce-scatter, max, ...), except every
  second mm of a block, counted per block forward; everything else is recomputed.
- Megatron-LM (commit d98e8a64): ``--recompute-granularity selective`` checkpoints the core
  attention (``attention.py`` ``_checkpointed_attention_forward``: Megatron's reentrant
  ``tensor_parallel.checkpoint`` over query, key, value); ``full`` with ``--recompute-method
  uniform`` checkpoints chunks of ``--recompute-num-layers`` layers (their input kept),
  ``block`` checkpoints the first N layers of a stage and keeps everything of the rest
  (``megatron/core/recompute.py`` ``checkpointed_forward``); ``hidden_dropout`` and
  ``attention_dropout`` default to 0.1 (``transformer_config.py``).
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

# --- the block ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LlamaShape:
    """The Llama layers measured: transformers' LlamaDecoderLayer at this size."""

    seq_len: int = 64
    micro_batch: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    ffn_hidden: int = 160
    layers: int = 4

    @property
    def tokens(self) -> int:
        return self.seq_len * self.micro_batch


@dataclass(frozen=True)
class RecomputeCase:
    """One recompute policy on ``layers`` Llama layers (what ``mechanism_run`` runs)."""

    name: str
    trainer: str
    policy: str             # none, op-sac, op-sac-cpu-list, core-attention, uniform, block
    description: str
    dropout: bool = False   # Megatron's hidden dropout 0.1 after attention and after the MLP
    recompute_layers: int = 0   # Megatron's --recompute-num-layers (uniform, block)
    float8: bool = False    # every Linear a torchao Float8Linear (tensorwise dynamic scales)


LLAMA_SHAPE = LlamaShape()
# Llama-3-8B's layer (hidden 4,096, 32 heads, 8 key/value heads of 128, MLP 14,336) at 8,192
# tokens: run on fake tensors, to show the per-token counts hold at a real width.
FULL_WIDTH = LlamaShape(seq_len=8192, micro_batch=1, hidden=4096, heads=32, kv_heads=8,
                        head_dim=128, ffn_hidden=14336, layers=4)
STAGE_SHAPE = LlamaShape(layers=2)   # the pipeline stage FSDP2 shards

RECOMPUTE_CASES = (
    RecomputeCase("none", "any", "none", "no recomputation: everything autograd saves"),
    RecomputeCase("none-dropout", "megatron", "none",
                  "no recomputation, Megatron's hidden dropout 0.1 after attention and MLP "
                  "(torch.native_dropout, CUDA's kernel: bool masks)", dropout=True),
    RecomputeCase("op-sac", "torchtitan", "op-sac",
                  "torchtitan's op-level selective policy (every second mm, the attention "
                  "kernel's outputs), the CPU flash kernel standing in for the CUDA one"),
    RecomputeCase("op-sac-cpu-list", "torchtitan", "op-sac-cpu-list",
                  "torchtitan's save list as written, run on the CPU: its SDPA entries are the "
                  "CUDA kernels, so the CPU flash kernel's outputs are recomputed"),
    RecomputeCase("selective", "megatron", "core-attention",
                  "Megatron's --recompute-granularity selective (core attention checkpointed, "
                  "reentrant) with a flash kernel"),
    RecomputeCase("selective-dropout", "megatron", "core-attention",
                  "the same with hidden dropout 0.1", dropout=True),
    RecomputeCase("full", "any", "uniform",
                  "full recomputation of every layer (Megatron uniform, 1 layer; torchtitan "
                  "full; HF gradient checkpointing)", recompute_layers=1),
    RecomputeCase("uniform-2", "megatron", "uniform",
                  "Megatron --recompute-method uniform --recompute-num-layers 2",
                  recompute_layers=2),
    RecomputeCase("block-2", "megatron", "block",
                  "Megatron --recompute-method block --recompute-num-layers 2",
                  recompute_layers=2),
    RecomputeCase("float8-none", "torchtitan", "none",
                  "torchao Float8Linear for every Linear (torchtitan's float8 converter), no "
                  "recomputation", float8=True),
    RecomputeCase("float8-op-sac", "torchtitan", "op-sac",
                  "torchao Float8Linear, torchtitan's op-level policy (its list saves max: the "
                  "amax of each fp8 cast)", float8=True),
)
LINEARS_PER_LAYER = 7      # q, k, v, o, gate, up, down
AMAX_BYTES = 2             # torch.max of a bf16 tensor: a bf16 scalar



def none_per_token(shape: LlamaShape, dropout: bool = False) -> int:
    """Bytes per token one transformers LlamaDecoderLayer saves with no recomputation (sdpa).

    Each LlamaRMSNorm (Python: upcast, pow, mean, rsqrt, multiply, cast back, weight) saves its
    fp32 input copy (4h), the per-token 1/rms (4) and the normalised bf16 values before the
    weight (2h); its bf16 output is saved by the projections it feeds (2h). Attention: the
    rotated query (2ad) and key (2kd), the value (2kd, a view of v_proj's output), the kernel's
    output (2ad, also o_proj's input) and its fp32 log-sum-exp (4a). The SwiGLU MLP: gate
    projection (SiLU's input), SiLU output, up projection, their product (down_proj's input):
    8f. Residual adds and the rotary multiplies by the (model-level) cos and sin save nothing
    of the layer's. Dropout: a 1-byte mask per element after attention and after the MLP (2h).
    """
    h, a, k, d, f = shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, shape.ffn_hidden
    norms = 2 * (4 * h + 4 + 2 * h + 2 * h)
    attention = 2 * a * d + 2 * k * d + 2 * k * d + 2 * a * d + 4 * a
    return norms + attention + 8 * f + (2 * h if dropout else 0)


def op_sac_per_token(shape: LlamaShape, attention_saved: bool = True) -> int:
    """torchtitan's op-level policy on one layer: the layer input (2h, kept by the checkpoint),
    the 1st, 3rd, 5th and 7th of the seven mm outputs (q_proj 2ad, v_proj 2kd, gate_proj 2f,
    down_proj 2h) and, when its kernel is in the list, the attention kernel's outputs (output
    2ad, log-sum-exp 4a)."""
    h, a, k, d, f = shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, shape.ffn_hidden
    kept = 2 * h + 2 * a * d + 2 * k * d + 2 * f + 2 * h
    return kept + ((2 * a * d + 4 * a) if attention_saved else 0)


def recompute_hand_bytes(case: RecomputeCase, shape: LlamaShape) -> tuple[int, str]:
    """(bytes the ``shape.layers`` layers keep for backward, the formula per token)."""
    T, L, h = shape.tokens, shape.layers, shape.hidden
    none = none_per_token(shape, case.dropout)
    if case.policy == "none":
        formula = "16h+8 + 4ad+4kd+4a + 8f" + (" + 2h" if case.dropout else "")
        return L * T * none, formula
    if case.policy == "op-sac" and case.float8:
        # Float8Linear saves its bf16 input, as nn.Linear; the policy's max keeps the amax of the
        # input's and the weight's fp8 casts of each Linear (2 bf16 scalars)
        amax = 2 * LINEARS_PER_LAYER * AMAX_BYTES
        return (L * (T * op_sac_per_token(shape) + amax),
                f"2h + 2ad + 2kd + (2ad+4a) + 2f + 2h, + {amax} B per layer (amax scalars)")
    if case.policy == "op-sac":
        return L * T * op_sac_per_token(shape), "2h + 2ad + 2kd + (2ad+4a) + 2f + 2h"
    if case.policy == "op-sac-cpu-list":
        return L * T * op_sac_per_token(shape, False), "2h + 2ad + 2kd + 2f + 2h"
    if case.policy == "core-attention":
        # The checkpoint keeps query, key and value (saved as without it) and the output is
        # o_proj's input: only the kernel's log-sum-exp is not kept.
        return (L * T * (none - 4 * shape.heads),
                "16h+8 + 4ad+4kd + 8f" + (" + 2h" if case.dropout else ""))
    n = case.recompute_layers
    if case.policy == "uniform":
        chunks = -(-L // n)
        return chunks * T * 2 * h, f"2h per chunk of {n} layer(s)"
    if case.policy == "block":
        return n * T * 2 * h + (L - n) * T * none, f"2h for the first {n}, none's for the rest"
    raise ValueError(f"case.policy must be a known policy, got {case.policy!r}")


# --- the loss ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LossShape:
    tokens: int = 256
    vocab: int = 2048
    chunks: int = 8


@dataclass(frozen=True)
class LossCase:
    name: str
    trainer: str
    description: str
    ranks: int = 1           # vocabulary-parallel ranks (Megatron)


LOSS_SHAPE = LossShape()
LOSS_CASES = (
    LossCase("eager-fp32", "torchtitan, transformers",
             "F.cross_entropy(logits.float(), labels): torchtitan's cross_entropy_loss, "
             "transformers' ForCausalLMLoss"),
    LossCase("eager-bf16", "-", "F.cross_entropy(logits, labels) on the bf16 logits"),
    LossCase("chunked-fp32", "torchtune",
             "the logits in 8 chunks of tokens, each F.cross_entropy(chunk.float(), reduction="
             "'sum'), summed and divided by N (torchtune's CEWithChunkedOutputLoss)"),
    LossCase("compiled-fp32", "torchtitan --compile",
             "torch.compile(F.cross_entropy(logits.float(), labels)), inductor on the CPU"),
    LossCase("vocab-parallel-2", "megatron",
             "megatron.core.tensor_parallel.vocab_parallel_cross_entropy over 2 ranks (one "
             "rank's shard of N x V/2)", ranks=2),
    LossCase("vocab-parallel-4", "megatron", "the same over 4 ranks", ranks=4),
)

# Bytes per logit (of the rank's shard) at the peak, and the per-token and constant terms, by
# hand; see loss_hand_bytes.
LOSS_PER_LOGIT = {
    # forward: bf16 logits 2 + fp32 copy 4 + fp32 log-softmax 4; backward (the peak): logits 2
    # + log-softmax 4 (saved) + nll_loss's fp32 gradient 4 + log_softmax_backward's fp32
    # result 4; the fp32 copy is gone by then, the bf16 gradient (2) comes after the
    # log-softmax is freed.
    "eager-fp32": (14, "bf16 logits 2 + fp32 log-softmax 4 + its fp32 gradient 4 + fp32 input "
                       "gradient 4 (the fp32 copy, 4, is freed after the forward)"),
    "eager-bf16": (8, "bf16 logits 2 + bf16 log-softmax 2 + its gradient 2 + input gradient 2"),
    "chunked-fp32": (None, "bf16 logits 2 + every chunk's fp32 log-softmax 4 + the last chunk's "
                           "fp32 gradient 4/K and input gradient 4/K (K chunks)"),
    "compiled-fp32": (4, "bf16 logits 2 + bf16 gradient 2 (inductor fuses the upcast, "
                         "log-softmax and its backward)"),
    "vocab-parallel": (8, "bf16 logits shard 2 + fp32 shard 4 (exp, then softmax in place, "
                          "saved; the gradient is made in place in it) + bf16 gradient 2"),
}


def loss_logits(case: LossCase, shape: LossShape) -> int:
    """Logits on one rank: N x V, or N x V/t for the vocabulary-parallel loss."""
    return shape.tokens * shape.vocab // case.ranks


def loss_hand_bytes(case: LossCase, shape: LossShape) -> tuple[int, str]:
    """(peak bytes by hand, per-logit formula). Only the logit-sized tensors: the scalars (the
    loss, the backward's seed) and the per-token tensors (Megatron's target mask and shifted
    targets) are the measured remainder, under 0.01 %."""
    key = "vocab-parallel" if case.name.startswith("vocab-parallel") else case.name
    per_logit, formula = LOSS_PER_LOGIT[key]
    logits = loss_logits(case, shape)
    if per_logit is None:   # chunked: 2 + 4 + 8/K per logit
        return 6 * logits + 8 * logits // shape.chunks, f"2 + 4 + 8/K, K = {shape.chunks}: {formula}"
    return per_logit * logits, f"{per_logit}: {formula}"


# --- the recorded table ----------------------------------------------------------------------

COLUMNS = ("mechanism", "case", "trainer", "configuration", "counted", "measured_by",
           "measured_bytes", "hand_bytes", "ratio", "unit", "units", "measured_per_unit",
           "hand_per_unit", "formula", "allocator_bytes", "note")


def row(mechanism, case, trainer, configuration, counted, measured_by, measured, hand, unit,
        units, formula, allocator=None, note="") -> dict:
    """One recorded row; ``allocator`` is the CPU allocator's count where one was taken."""
    return {"mechanism": mechanism, "case": case, "trainer": trainer,
            "configuration": configuration, "counted": counted, "measured_by": measured_by,
            "measured_bytes": int(measured), "hand_bytes": int(hand),
            "ratio": measured / hand if hand else float("nan"), "unit": unit, "units": int(units),
            "measured_per_unit": measured / units, "hand_per_unit": hand / units,
            "formula": formula, "allocator_bytes": "" if allocator is None else int(allocator),
            "note": note}


def frame(rows) -> pd.DataFrame:
    return pd.DataFrame(list(rows), columns=list(COLUMNS))


# --- FSDP2 under a pipeline schedule ---------------------------------------------------------

FSDP_RANKS = 4
FSDP_MICRO_BATCHES = 2
FSDP_SETTINGS = ("pipeline", "default", "pipeline-fp8")
# FSDPMemTracker's category -> what it holds between micro-batches, and its bytes by hand from
# P (the stage's parameters), n (its parameter tensors) and W (ranks); dim 0 of every tensor
# here divides by W, so no shard padding.
FSDP_STATE = {
    "SHARDED_PARAM": ("fp32 parameter shards", lambda P, n, W: 4 * P // W, "4P/W"),
    "UNSHARDED_PARAM": ("bf16 unsharded parameters (kept: reshard_after_forward and "
                        "reshard_after_backward False)", lambda P, n, W: 2 * P, "2P"),
    "TEMP": ("fp32 unsharded accumulated gradients (FSDP2 upcasts the bf16 gradient to the "
             "reduce dtype and accumulates it unsharded while gradient sync is off; the tracker "
             "files them as temporaries)", lambda P, n, W: 4 * P, "4P"),
    "SHARDED_GRAD": ("fp32 gradient shards (reduce-scattered)", lambda P, n, W: 4 * P // W, "4P/W"),
    "OPT": ("AdamW's fp32 exp_avg and exp_avg_sq shards and a 4-byte step per tensor",
            lambda P, n, W: 8 * P // W + 4 * n, "8P/W + 4n"),
}


def fp8_unsharded_bytes(P: int, linear: int, linear_tensors: int) -> int:
    """Unsharded parameters with fp8 all-gather: the Linear weights in fp8 (1 B) with one fp32
    scale each, the norms' weights in bf16 (2 B)."""
    return linear + 4 * linear_tensors + 2 * (P - linear)


def fsdp_expected(pipeline: bool, micro_batch: int, micro_batches: int) -> set[str]:
    """The categories holding bytes after micro-batch ``micro_batch`` (1-based)'s backward."""
    if pipeline and micro_batch < micro_batches:
        return {"SHARDED_PARAM", "UNSHARDED_PARAM", "TEMP", "OPT"}
    return {"SHARDED_PARAM", "SHARDED_GRAD", "OPT"}


# --- the rows ----------------------------------------------------------------------------------

def _recompute_rows(measured: dict, shape: LlamaShape, fake: bool = False) -> list[dict]:
    rows = []
    configuration = (f"transformers LlamaDecoderLayer x {shape.layers}, bf16, sdpa, s={shape.seq_len}, "
                     f"b={shape.micro_batch}, h={shape.hidden}, a={shape.heads}, k={shape.kv_heads}, "
                     f"d={shape.head_dim}, f={shape.ffn_hidden}"
                     + (", fake tensors (Llama-3-8B's layer)" if fake else ""))
    for case in RECOMPUTE_CASES:
        found = measured[case.name]
        hand, formula = recompute_hand_bytes(case, shape)
        checkpoints = _checkpoint_calls(case, shape)
        if fake:
            note = "fake tensors: no allocator"
        elif checkpoints:
            note = (f"allocator - storages = {found['allocator'] - found['tracker']:,} B: the CPU "
                    f"RNG state each of {checkpoints} checkpoint calls stashes "
                    f"(torch.get_rng_state(), {RNG_STATE_BYTES:,} B; host memory on a GPU too)")
        else:
            note = "allocator = storages"
        rows.append(row("saved activations" + (", full width" if fake else ""), case.name,
                        case.trainer, f"{case.description}; {configuration}",
                        "kept for backward after the forward",
                        "StorageTracker (saved storages alive after the forward, output excluded)",
                        found["tracker"], hand, "token-layer", shape.tokens * shape.layers, formula,
                        found["allocator"], note))
    return rows


RNG_STATE_BYTES = 5056   # torch.get_rng_state(): the CPU generator's state (Mersenne twister)


def _checkpoint_calls(case: RecomputeCase, shape: LlamaShape) -> int:
    """How many checkpoint calls the forward makes (each stashes the CPU RNG state)."""
    if case.policy in ("op-sac", "op-sac-cpu-list", "core-attention"):
        return shape.layers
    if case.policy == "uniform":
        return -(-shape.layers // case.recompute_layers)
    if case.policy == "block":
        return case.recompute_layers
    return 0


def _loss_rows(measured: dict, shape: LossShape) -> list[dict]:
    rows = []
    for case in LOSS_CASES:
        found = measured[case.name]
        hand, formula = loss_hand_bytes(case, shape)
        logits = loss_logits(case, shape)
        value = found["tracker"] if found["tracker"] is not None else found["allocator"]
        by = ("StorageTracker peak (allocator agrees)" if found["tracker"] is not None
              else "CPU allocator peak (compiled kernels allocate outside the dispatcher)")
        rows.append(row("logits and loss", case.name, case.trainer,
                        f"{case.description}; N={shape.tokens}, V={shape.vocab}, bf16 logits",
                        "peak from the bf16 logits to their bf16 gradient", by, value, hand,
                        "logit", logits, formula, found["allocator"],
                        f"remainder {value - hand:,} B: scalars and per-token tensors"))
    return rows


def _fsdp_rows(measured: dict) -> list[dict]:
    rows = []
    for name, found in measured.items():
        pipeline, fp8 = name != "default", name.endswith("fp8")
        P, n, W = found["parameters"], found["tensors"], FSDP_RANKS
        setting = ("torchtitan's FSDP2 under PP: reshard_after_forward=False, and before every "
                   "backward but the last set_is_last_backward / set_reshard_after_backward / "
                   "set_requires_gradient_sync(False) as torch.distributed.pipelining's stage "
                   "does" if pipeline else "FSDP2 default: reshard_after_forward=True, gradients "
                   "reduce-scattered after every micro-batch")
        if fp8:
            setting += ("; torchao Float8Linear with enable_fsdp_float8_all_gather (weights "
                        "all-gathered in fp8)")
        for index, snapshot in enumerate(found["snapshots"], start=1):
            expected = fsdp_expected(pipeline, index, FSDP_MICRO_BATCHES)
            for category, (what, count, formula) in FSDP_STATE.items():
                hand = count(P, n, W) if category in expected else 0
                measured_bytes = snapshot.get(category, 0)
                note = ""
                if fp8 and category == "UNSHARDED_PARAM" and hand:
                    hand = fp8_unsharded_bytes(P, found["linear_parameters"], found["linear_tensors"])
                    what = ("unsharded parameters: Linear weights in fp8 with an fp32 scale each, "
                            "norm weights in bf16")
                    formula = "P_linear + 4 n_linear + 2 (P - P_linear)"
                elif fp8 and category == "UNSHARDED_PARAM":
                    # torchao's fsdp_post_all_gather attaches the scale (all-gather metadata) to
                    # the unsharded Float8 tensor and hands FSDP only the fp8 data to free
                    hand = 4 * found["linear_tensors"]
                    what = "the fp32 scale of each Linear weight, kept after the reshard"
                    formula = "4 n_linear"
                elif fp8 and category == "TEMP" and measured_bytes and not hand:
                    what, formula = "temporaries the tracker still holds after the step", "-"
                    note = (f"not explained: {measured_bytes:,} B = "
                            f"{found['linear_tensors']} x {measured_bytes // found['linear_tensors']}"
                            f" B, one scalar per Linear weight left by the fp8 all-gather")
                if not hand and not measured_bytes:
                    continue
                rows.append(row("FSDP2 state", f"{name}-after-micro-batch-{index}", "torchtitan"
                                if pipeline else "fsdp2",
                                f"{setting}; {W} fake ranks, 2 Llama layers (P={P:,}, n={n}), bf16 "
                                f"parameters, fp32 reduce, AdamW, {FSDP_MICRO_BATCHES} micro-batches",
                                f"{category}: {what}", "FSDPMemTracker current snapshot",
                                measured_bytes, hand, "parameter", P, formula, note=note))
    return rows


def compare_mechanisms(measured: dict, shape: LlamaShape = LLAMA_SHAPE,
                       loss_shape: LossShape = LOSS_SHAPE) -> pd.DataFrame:
    """The recorded table: one row per measurement beside its hand count."""
    rows = []
    if "recompute" in measured:
        rows += _recompute_rows(measured["recompute"], shape)
    if "recompute_full_width" in measured:
        rows += _recompute_rows(measured["recompute_full_width"], FULL_WIDTH, fake=True)
    if "loss" in measured:
        rows += _loss_rows(measured["loss"], loss_shape)
    if "fsdp_pipeline" in measured:
        rows += _fsdp_rows(measured["fsdp_pipeline"])
    if "step" in measured:
        rows += step_rows(measured["step"])
    return frame(rows)


# --- a whole training step on fake tensors at full width -----------------------------------------

@dataclass(frozen=True)
class StepShape:
    """transformers' LlamaForCausalLM at Llama-3-8B's width, a few layers, FSDP2 over W fake
    ranks (``zerolib.crosscheck.fake_run``)."""

    layers: int = 4
    tokens: int = 4096          # micro-batch 1 x 4,096
    ranks: int = 8
    vocab: int = 128256
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    ffn_hidden: int = 14336

    @property
    def layer_parameters(self) -> int:
        h, a, k, d, f = self.hidden, self.heads, self.kv_heads, self.head_dim, self.ffn_hidden
        return h * a * d + 2 * h * k * d + a * d * h + 3 * h * f + 2 * h

    @property
    def parameters(self) -> int:   # untied embedding and output layer, final norm
        return self.layers * self.layer_parameters + 2 * self.vocab * self.hidden + self.hidden


STEP_SHAPE = StepShape()
STEP_POLICIES = ("none", "op-sac", "full")


def step_peak_hand(policy: str, shape: StepShape = STEP_SHAPE) -> tuple[int, int, str]:
    """(bytes alive before the second step, its peak, the terms) by hand, on rank 0.

    Before the step: fp32 parameter shards 4P/W, AdamW's two fp32 states 8P/W and a 4-byte step
    per tensor (9 per layer, 3 outside), the token ids (8 per token) and the rotary inverse
    frequencies (two fp32 copies of d/2). The peak falls inside the loss's backward
    (``_log_softmax_backward_data``): the root's unsharded bf16 embedding, output layer and final
    norm (FSDP2 does not reshard the root after forward), the last decoder layer all-gathered in
    bf16 by FSDP2's backward prefetch, the loss chain without the bf16 logits (transformers
    upcasts them and nothing saves the bf16 copy: fp32 log-softmax, its gradient and the input
    gradient, 12 per logit) and two fp32 scalars (the loss, the backward's seed), every layer's
    saved activations (the policy's bytes per token), the final norm's (8h + 4 per token) and
    the rotary cos and sin (bf16, N x d each). Under a checkpoint the layers also keep the
    position ids (int64, 8 per token)."""
    s = shape
    h, a, k, d, f, N, V, W = (s.hidden, s.heads, s.kv_heads, s.head_dim, s.ffn_hidden, s.tokens,
                              s.vocab, s.ranks)
    P, tensors = s.parameters, 9 * s.layers + 3
    state = 4 * P // W + 8 * P // W + 4 * tensors + 8 * N + 2 * 4 * (d // 2)
    layer = LlamaShape(seq_len=N, micro_batch=1, hidden=h, heads=a, kv_heads=k, head_dim=d,
                       ffn_hidden=f, layers=1)
    per_token = {"none": none_per_token(layer), "op-sac": op_sac_per_token(layer), "full": 2 * h}[policy]
    step = (2 * (2 * V * h + h) + 2 * s.layer_parameters + 12 * N * V + 8
            + s.layers * N * per_token + N * (8 * h + 4) + 2 * N * d * 2
            + (8 * N if policy != "none" else 0))
    terms = ("4P/W + 8P/W + 4n + 8N + 4d (state) + 2(2Vh + h) (root unsharded) + 2P_layer "
             "(prefetched layer) + 12NV + 8 (loss chain) + L N x policy + N(8h+4) (final norm) "
             "+ 4Nd (cos, sin)" + (" + 8N (position ids)" if policy != "none" else ""))
    return state, state + step, terms


def step_rows(measured: dict, shape: StepShape = STEP_SHAPE) -> list[dict]:
    rows = []
    for policy, found in measured.items():
        state, peak, terms = step_peak_hand(policy, shape)
        compared = found.get("fsdp_mem_tracker_peak", {})
        note = ("FSDPMemTracker beside it: peak " + ", ".join(
            f"{key} {value:,}" for key, value in compared.items() if value) if compared else "")
        rows.append(row(
            "training step, full width", policy, "torchtitan-style FSDP2",
            f"transformers LlamaForCausalLM at Llama-3-8B width (h {shape.hidden}, a {shape.heads}, "
            f"k {shape.kv_heads}, f {shape.ffn_hidden}, V {shape.vocab}), {shape.layers} layers, "
            f"FSDP2 over {shape.ranks} fake ranks (bf16 parameters, fp32 reduce), AdamW, 1 x "
            f"{shape.tokens} tokens, recompute {policy}, fake tensors",
            "peak of the second step on rank 0", "StorageTracker (whole run, DTensor-aware, "
            "follows storage resizes)", found["peak_bytes"], peak, "token", shape.tokens, terms,
            note=note + f"; state before the step {found['state_bytes']:,} (by hand {state:,})"))
    return rows
