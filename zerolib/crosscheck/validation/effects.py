"""A mechanism that makes a measurement differ from zerolib's number, and its size in bytes."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Effect:
    """One mechanism and the bytes it adds (negative: removes) relative to zerolib's number.

    ``key`` names the mechanism (the same for every rank and model), ``reason`` says it with
    this row's numbers.
    """

    key: str
    reason: str
    bytes: int


def keys(effects) -> str:
    """The non-zero mechanisms of a row, space separated (the CSV's ``effects`` column)."""
    return " ".join(e.key for e in effects if e.bytes != 0)


def describe(effects, unexplained: int, *, extra: tuple[str, ...] = ()) -> str:
    """The explanation column: each non-zero effect with its signed bytes, then any remainder."""
    parts = [f"{e.reason} ({e.bytes:+,} B)" for e in effects if e.bytes != 0] + list(extra)
    if unexplained:
        parts.append(f"UNEXPLAINED ({unexplained:+,} B)")
    return "; ".join(parts) if parts else "matches"


# Every mechanism once, for legends (the CLI table, the notebook).
MECHANISMS = {
    "step-counters": "AdamW keeps a 0-dim fp32 step counter per parameter tensor (4 B each)",
    "whole-tensor-partition": "ZeroRedundancyOptimizer gives each rank whole tensors, largest "
                              "first to the least-loaded rank, so its share is uneven",
    "shard-padding": "FSDP2 shards each tensor's dim 0 in ceil(rows/W)-row chunks and pads "
                     "parameter and gradient shards to that size",
    "uneven-shards": "AdamW state follows FSDP2's unpadded shards: the last ranks hold fewer rows",
    "resharded-after-backward": "FSDP2 reshards parameters after backward even with "
                                "reshard_after_forward=False; ZeRO-2 keeps a full replica",
    "shards-beside-gathered": "while layers are gathered, FSDP2 still holds its sharded parameters",
    "gathered-padding": "gathered parameters live in W x padded-shard buffers",
    "gathered-layer": "reshard_after_forward=True gathers one layer at a time for its forward",
    "bf16-gathered": "under the bf16 policy the gathered parameters are 2-byte copies",
    "norm-statistics": "LayerNorm saves each token's mean and 1/std, which Table 2 leaves out",
    "dropout-noise": "F.dropout on the CPU saves noise in the activation dtype, not a 1-byte mask",
    "flash-output-copy": "scaled_dot_product_attention saves its per-head output; merging heads "
                         "for the projection stores a second copy",
    "python-gelu": "GPT-2's default GELU (gelu_new) is written in Python: tanh(...), 1 + tanh(...) "
                   "and 0.5 x are saved beside its input, three more f-wide tensors",
    "fused-qkv-view": "at micro-batch 1 merging batch and heads is a view, so the saved Q keeps "
                      "c_attn's whole fused Q|K|V output alive, while the K and V saved are the "
                      "KV cache's copies (use_cache defaults to True, in training too)",
    "rmsnorm-fp32-input": "an RMSNorm computed in fp32 (Llama's Python RMSNorm, PyTorch's CPU "
                          "rms_norm) saves an fp32 copy of its 16-bit input, 4 B per element where "
                          "Table 2 counts 2",
    "rmsnorm-statistics": "an RMSNorm saves each token's 1/rms in fp32, which Table 2 leaves out",
    "rmsnorm-weight-input": "Llama's RMSNorm saves the normalised input before the weight multiply "
                            "(for the weight's gradient): one more s x b x h tensor",
    "rotary-cos-sin": "the rotary multiplies save the cos and sin tables (s x head_dim each, one row "
                      "shared by the micro-batch and computed once for all layers)",
    "repeat-kv": "eager attention repeats the key/value heads to every query head before the "
                 "matmuls, which save the repeated copies",
    "softmax-fp32": "Llama's eager attention takes the softmax in fp32 and saves its fp32 output",
    "softmax-downcast-copy": "the fp32 probabilities cast back to 16 bits for the product with V "
                             "are saved as well",
    "uneven-vocabulary-shard": "DTensor's Shard(0) cuts vocabulary rows like torch.chunk: the last "
                               "tensor-parallel ranks hold fewer rows than the most-loaded one",
    "padded-shard-storage": "distribute_tensor pads a short shard to the chunk size and keeps a "
                            "narrower view of that storage",
    "rmsnorm-normalized-copy": "PyTorch's CPU rms_norm multiplies the weight in fp32 and saves the "
                               "normalised fp32 values; fused kernels recompute them",
    # What a rank hands to its collectives (communication_*.csv).
    "gloo-reduce-scatter": "gloo has no reduce-scatter: torch's reduce_scatter_tensor runs an "
                           "all-reduce of the whole input there (NCCL runs a ring reduce-scatter)",
    "ddp-all-reduce": "ZeroRedundancyOptimizer leaves the gradients to DDP's all-reduce of every "
                      "gradient, where ZeRO stage 1 reduce-scatters them",
    "owner-broadcasts": "ZeroRedundancyOptimizer broadcasts each updated tensor from the rank "
                        "that owns it, one call per tensor, instead of one all-gather",
    # The next two are now the engines' own predictions ("fsdp2", "deepspeed"): kept as named
    # mechanisms for records that were explained against the paper's schedule.
    "per-layer-calls": "FSDP2 gathers and reduces layer by layer where zerolib's stage 2 counts "
                       "one flat buffer: more calls, the same bytes",
    "bucket-all-reduce": "DeepSpeed's ZeRO-1/2 all-reduce each gradient bucket and keep their own "
                         "partition (use_multi_rank_bucket_allreduce=True), not a reduce-scatter",
    "alignment-padding": "DeepSpeed's ZeRO-1/2 pad the flat buffer to a multiple of 2 x N "
                         "elements (nccl_start_alignment_factor), zerolib to a multiple of N",
    "partition-padding": "DeepSpeed's ZeRO-3 pads every tensor's partition on its own, zerolib "
                         "each layer's flat buffer once",
    "kept-gathered": "DeepSpeed's ZeRO-3 keeps parameters gathered from forward to backward "
                     "while under stage3_max_live_parameters and stage3_max_reuse_distance: no "
                     "all-gather before the backward pass",
    "coalesced-fetch": "DeepSpeed's ZeRO-3 fetches prefetched tensors in one coalesced "
                       "all-gather and each persistent small tensor in its own: other calls, "
                       "the same bytes",
    "reduce-bucket": "DeepSpeed reduces many layers' gradients in one reduce_bucket_size bucket: "
                     "fewer calls than one per layer, the same bytes",
    "gradient-norm": "DeepSpeed all-reduces the global gradient norm, one scalar per step",
    "overflow-flag": "with bf16, DeepSpeed's ZeRO-1/2 all-reduce a one-byte overflow flag",
}
