"""Korthikanti et al.'s (MLSys 2023) own models, run through zerolib's model-parallel arithmetic.

Source: V. Korthikanti, J. Casper, S. Lym, L. McAfee, M. Andersch, M. Shoeybi, B. Catanzaro,
"Reducing Activation Recomputation in Large Transformer Models", MLSys 2023, arXiv 2205.05198.

Table 3 gives four GPT models (attention heads, hidden size, layers, tensor- and pipeline-
parallel size, GPUs, global batch, micro-batch); Sec. 6 sets the sequence length to 2048 and the
vocabulary to 51200 and uses "the interleaving schedule with three interleaving stages (m = 3)
for the 175B and 530B models"; the caption says "no data parallelism is used". The models are
Megatron-LM GPTs: pre-LayerNorm blocks with biases, a fused QKV projection, an MLP of 4h, learned
position embeddings, tied input and output embeddings, dropout; activations in 16 bits, dropout
masks in one byte and the logits in fp32 (Sec. 4.1 and 4.3), attention without a fused kernel.

:data:`PRINTED` holds what the paper prints about these models; ``tests/crosscheck/test_korthikanti.py``
checks each against zerolib (and where it does not reproduce, says so); ``zerolib crosscheck``
prints :func:`technique_table` beside them.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from types import MappingProxyType

import pandas as pd

from zerolib.core.catalogue.models import TransformerConfig, parameter_count
from zerolib.core.memory.activations import ActivationOptions, layer_activation_bytes
from zerolib.core.memory.model_parallel import Pipeline, parameters_per_gpu
from zerolib.core.memory.pipeline_schedule import stage_activation_terms

SEQ_LEN = 2048            # Sec. 6
VOCAB = 51_200            # Sec. 6 (GPT-2's 50,257 padded to a multiple of 1024)
ELEMENT_BYTES = 2         # 16-bit activations (Sec. 4.1)
MASK_BYTES = 1            # dropout masks (Sec. 4.1)
LOGITS_BYTES = (4,)       # "the logits which are calculated in 32-bit floating point" (Sec. 4.3)
SOURCE = "Korthikanti et al., MLSys 2023, arXiv 2205.05198"


def gpt(name: str, heads: int, hidden: int, layers: int) -> TransformerConfig:
    """A Megatron-LM GPT of the paper's shape (see the module doc)."""
    return TransformerConfig(
        name, hidden=hidden, layers=layers, heads=heads, kv_heads=heads, ffn_hidden=4 * hidden,
        vocab=VOCAB, max_positions=SEQ_LEN, tied_embeddings=True, gated_mlp=False,
        norm="layernorm", position_embedding="learned", qkv_bias=True, output_bias=True,
        mlp_bias=True, fused_qkv=True, dropout=True,
        source=f"{SOURCE}, Table 3 ({name}) and Sec. 6 (s = {SEQ_LEN}, v = {VOCAB})")


@dataclass(frozen=True)
class PaperRun:
    """One row of Table 3 (with Sec. 6's interleaving)."""

    model: TransformerConfig
    tensor_parallel: int
    pipeline_parallel: int
    gpus: int
    global_batch: int
    micro_batch: int
    chunks: int = 1             # interleaving stages ("m" in the paper, v in Narayanan et al.)

    @property
    def schedule(self) -> str:
        return "interleaved" if self.chunks > 1 else "1f1b"

    @property
    def micro_batches(self) -> int:
        """Micro-batches per step and pipeline (no data parallelism)."""
        return self.global_batch // self.micro_batch


RUNS: Mapping[str, PaperRun] = MappingProxyType({
    "22B": PaperRun(gpt("22B", 64, 6144, 48), 8, 1, 8, 4, 4),
    "175B": PaperRun(gpt("175B", 96, 12288, 96), 8, 8, 64, 64, 1, chunks=3),
    "530B": PaperRun(gpt("530B", 128, 20480, 105), 8, 35, 280, 280, 1, chunks=3),
    "1T": PaperRun(gpt("1T", 160, 25600, 128), 8, 64, 512, 512, 1),
})

# Table 2's rows: the per-layer settings of each technique.
TECHNIQUES: Mapping[str, dict] = MappingProxyType({
    "tensor parallel": dict(sequence_parallel=False, recompute="none"),
    "tensor + sequence parallel": dict(sequence_parallel=True, recompute="none"),
    "tensor parallel + selective recompute": dict(sequence_parallel=False, recompute="selective"),
    "tensor + sequence parallel + selective recompute": dict(sequence_parallel=True,
                                                             recompute="selective"),
    "full recompute": dict(sequence_parallel=False, recompute="full"),
})
BASELINE = "tensor parallel"   # Figure 7's 100%: Equation 2

# What the paper prints about these models (section, quote or value).
PRINTED: Mapping[str, tuple[str, object]] = MappingProxyType({
    "5as/h, 175B": ("Sec. 5: 'for GPT-3 ... 5as/h = 80'", 80),
    "5as/h, 530B": ("Sec. 5: 'for MT-NLG ... 5as/h = 64'", 64),
    "selective saving, 175B": ("Sec. 5: selective recomputation saves '70%' of activation memory", "70%"),
    "selective saving, 530B": ("Sec. 5: '65%' for MT-NLG", "65%"),
    "combined, all models": ("Sec. 6.1: combined 'bringing the memory requirements to under 20%'", 0.20),
    "full recompute, all models": ("Sec. 6.1: full recomputation 'at 10% of the baseline'", 0.10),
    "extra terms, 22B": ("Sec. 4.3: embedding/output terms 'account for less than 0.01%'", 0.0001),
    "deallocation, 530B": ("Appendix B: 'sbhp = 2.73 GB' on the first stage (GiB, 2-byte elements)",
                           "2.73"),
})


def layer_bytes(run: PaperRun, technique: str) -> int:
    """One transformer layer's activation bytes on one GPU (zerolib's Table 2 row)."""
    config = run.model
    return layer_activation_bytes(
        SEQ_LEN, run.micro_batch, config.hidden, config.heads, tensor_parallel=run.tensor_parallel,
        element_bytes=ELEMENT_BYTES, mask_bytes=MASK_BYTES, dropout=True, **TECHNIQUES[technique])


def first_stage_terms(run: PaperRun, technique: str, *, interleaved: bool = True) -> Mapping[str, int]:
    """Activation bytes on one GPU of the first pipeline stage, by term, under the paper's
    schedule (``interleaved=False``: plain 1F1B even for the 175B and 530B models)."""
    chunks = run.chunks if interleaved else 1
    pipeline = Pipeline(run.pipeline_parallel, "interleaved" if chunks > 1 else "1f1b", chunks,
                        run.micro_batches)
    options = ActivationOptions(element_bytes=ELEMENT_BYTES, mask_bytes=MASK_BYTES, dropout=True,
                                logits_bytes=LOGITS_BYTES, **TECHNIQUES[technique])
    return stage_activation_terms(run.model, SEQ_LEN, run.micro_batch, run.tensor_parallel,
                                  pipeline, 0, options)


def technique_table() -> pd.DataFrame:
    """Per model and technique: one layer's bytes, the share of the tensor-parallel baseline
    (Figure 7's measure, as an exact fraction and a float), and the first stage's activations
    (Eq. 5 / 6 with their interleaving factor, plus the embedding's terms)."""
    rows = []
    for name, run in RUNS.items():
        baseline = layer_bytes(run, BASELINE)
        for technique in TECHNIQUES:
            layer = layer_bytes(run, technique)
            terms = first_stage_terms(run, technique)
            rows.append({"model": name, "technique": technique, "layer_bytes": layer,
                         "share_of_baseline": Fraction(layer, baseline),
                         "share_float": layer / baseline,
                         "first_stage_bytes": sum(terms.values()),
                         "first_stage_layer_bytes": terms["transformer_layers"]})
    frame = pd.DataFrame(rows)
    frame.attrs.update(source=SOURCE, seq_len=SEQ_LEN, vocab=VOCAB)
    return frame


def parameter_table() -> pd.DataFrame:
    """Per model: zerolib's parameter count, Narayanan et al.'s Eq. 2 (which leaves out the
    final LayerNorm), and the parameters on one GPU of the most-loaded pipeline stage."""
    rows = []
    for name, run in RUNS.items():
        config = run.model
        h, L = config.hidden, config.layers
        rows.append({"model": name, "parameters": parameter_count(config),
                     "narayanan_eq2": 12 * L * h * h + 13 * L * h + (VOCAB + SEQ_LEN) * h,
                     "per_gpu": int(parameters_per_gpu(
                         config, run.tensor_parallel, run.pipeline_parallel,
                         schedule=run.schedule, chunks=run.chunks))})
    return pd.DataFrame(rows)
