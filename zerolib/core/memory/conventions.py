"""Trainers as named conventions for memory: what each engine keeps alive beside the chapter's count.

The chapter counts what a training step stores (:mod:`zerolib.core.memory.working_set`): model
state, the saved activations, the logits and their fp32 copy, the engine's buffers and a fixed
reserve. A real trainer's code decides more than that: which loss it runs and whether it drops
the logits first, whether its gradients live between steps, what FSDP2 keeps unsharded, what the
optimizer step allocates, whether dropout is on. Each engine of
:data:`zerolib.core.step.engines.ENGINES` names its memory convention here; the working set reads
it (``WorkingSetSettings.engine``). Every behaviour is one mechanism measured with the real
PyTorch code on the CPU (``data/mechanisms_measured.md``) or read in the trainer's source:

``paper`` (the chapter's count, unchanged)
    everything summed as if live at once; the loss ``stored`` (logits + fp32 copy); fits judged
    on the peak plus the fixed ``reserve``.
``deepspeed`` (DeepSpeed 0.19.8), ``fsdp2`` (PyTorch 2.13 FSDP2)
    the chapter's count (the planner searches these engines with it). FSDP2's measured
    behaviour (unsharded parameters and gradients under a pipeline, the optimizer step's
    temporary) is torchtitan's convention below. ``trainer.reshard_after_forward`` False
    (FSDP2's own name; None: ``fully_shard``'s True) counts each GPU's parameters whole at
    stage 3. A ds_config with bf16 and fp32 gradient accumulation at stage 1 is DeepSpeed's
    ``BF16_Optimizer`` (``zerolib.core.deepspeed_config.BF16_OPTIMIZER``: its layout).
``megatron`` (Megatron-LM, commit d98e8a64)
    the chapter's count over Megatron-LM's own buffers: the gradients are ``main_grad`` views
    into one contiguous gradient buffer, reduced (all-reduce, or reduce-scatter with the
    distributed optimizer) in place, and the updated parameters all-gathered into the
    parameter buffer, so neither DDP's second copy of the gradients nor DeepSpeed's buckets
    exist (``param_and_grad_buffer.py``). Under ``--bf16`` the gradient buffer is fp32
    (``accumulate_allreduce_grads_in_fp32``, forced by ``validate_args``) beside bf16
    parameters and the distributed optimizer's fp32 main parameters and moments: the
    ``bf16-fp32-grads`` layout (2 + 4 + 12 bytes per parameter; stage 1 shards the 12).
    Megatron-LM launches with ``hidden_dropout = attention_dropout = 0.1``
    (``transformer_config.py``; a 1-byte mask after attention and after the MLP, none inside a
    flash kernel; measured: rows ``none-dropout``, ``selective-dropout``); the catalogue's
    models say whether they train with dropout (Llama, Mixtral, DeepSeek: no), so a launch at
    Megatron-LM's defaults is ``dropout = true``.
``torchtitan`` (pytorch/torchtitan, commit b5bcd76c; the December 2024 benchmarks ran 9dec370)
    FSDP2 as torchtitan applies it (``apply_fsdp``: bf16 parameters, fp32 reduction,
    ``reshard_after_forward`` except under pipeline parallelism), its loss
    (``cross_entropy_loss``: ``F.cross_entropy(pred.flatten(0, 1).float(), labels)``, ``del
    pred`` before ``loss.backward()``: 12 bytes per logit; compiled with ``--compile``:
    ``build_cross_entropy_loss`` wraps it in ``torch.compile``, 4), the loss chain and the
    layer being recomputed counted at their own moments, and fits judged on the reserved peak
    (torchtitan logs ``max_reserved``). Its llama3 train configs set ``[activation_checkpoint]
    mode = "selective"``, ``selective_ac_option = "op"``: ``--recompute op-selective``.

The caching allocator's reserve (``peak_reserved``, :data:`RESERVED_PPM`) and what is
outside PyTorch's allocator (the ``reserve``) are the same for every engine: see
``data/measured_peaks.md``.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from zerolib.core.defaults import ENGINE_NAMES, MILLION, RESERVED_PPM  # noqa: F401

JUDGES = ("peak", "peak_reserved")
STEP_MOMENTS = ("none", "foreach-adamw", "fp32-gradient-copy")



@dataclass(frozen=True)
class MemoryConvention:
    """One engine's memory convention (see the module doc)."""

    name: str
    loss: str = "stored"                 # the loss it runs (zerolib.core.memory.loss.LOSSES)
    compiled_loss: bool = False          # --compile compiles its loss too
    logits_freed: bool = False           # drops the bf16 logits before the backward
    dropout: bool | None = None          # its default dropout (None: the model's own)
    fsdp: bool = False                   # FSDP2's unsharded parameters and gradients
    gradients_between_steps: bool = True   # False: made in the backward, freed by the step
    step_moment: str = "none"            # what the optimizer step allocates (STEP_MOMENTS)
    ddp_buckets: bool = True             # stage 0: DDP's second copy of the gradients
    deepspeed_buffers: bool = True       # DeepSpeed's reduce bucket and stage-3 live parameters
    separate_moments: bool = False       # the loss chain and the recompute transient apart
    judges: str = "peak"                 # what fits judges (JUDGES), plus the reserve
    sources: Mapping[str, str] = field(default_factory=dict)

    def __deepcopy__(self, memo) -> MemoryConvention:
        return self   # immutable

    def as_dict(self) -> dict:
        return {"name": self.name, "loss": self.loss, "compiled_loss": self.compiled_loss,
                "logits_freed": self.logits_freed, "dropout": self.dropout, "fsdp": self.fsdp,
                "gradients_between_steps": self.gradients_between_steps,
                "step_moment": self.step_moment, "ddp_buckets": self.ddp_buckets,
                "deepspeed_buffers": self.deepspeed_buffers,
                "separate_moments": self.separate_moments, "judges": self.judges}


_TT = "pytorch/torchtitan at b5bcd76c"
_FSDP_SOURCES = {
    "the root is not resharded after forward": "torch/distributed/fsdp/_fully_shard/"
    "_fsdp_state.py FSDPState._lazy_init (the root's post_forward_mesh_info = None); PyTorch 2.13",
    "under a pipeline: parameters kept unsharded, gradients accumulated unsharded in fp32":
    "torch/distributed/pipelining/stage.py (set_reshard_after_backward, "
    "set_requires_gradient_sync before every backward but the last); _fsdp_param.py "
    "to_accumulated_grad_if_needed; PyTorch 2.13; data/mechanisms_measured.csv 'FSDP2 state'",
    "gradients set to None by the step": "torch.optim.Optimizer.zero_grad(set_to_none=True)",
    "AdamW foreach: one temporary as wide as the second moment": "torch/optim/adamw.py "
    "_multi_tensor_adamw (torch._foreach_sqrt(exp_avg_sqs)); data/mechanisms_measured.csv "
    "'optimizer step'",
}
CONVENTIONS: Mapping[str, MemoryConvention] = MappingProxyType({
    "paper": MemoryConvention("paper", sources=MappingProxyType({
        "everything summed as if live at once": "Korthikanti et al., MLSys 2023, Table 2; "
        "Rajbhandari et al., SC20, Sec. III-A"})),
    # DeepSpeed and FSDP2 keep the chapter's count (the planner searches them); torchtitan's
    # convention is FSDP2's measured behaviour in full.
    "deepspeed": MemoryConvention("deepspeed", sources=MappingProxyType({
        "the chapter's count with DeepSpeed's buffers": "deepspeed/runtime/zero/config.py; "
        "DeepSpeed 0.19.8"})),
    "fsdp2": MemoryConvention("fsdp2", sources=MappingProxyType({
        "the chapter's count": "Rajbhandari et al., SC20, Sec. III-A"})),
    # Megatron-LM: the chapter's count. Its launch default is dropout 0.1 (a mask after attention
    # and after the MLP, measured: rows none-dropout, selective-dropout); the catalogue's models
    # say whether they train with dropout, so trainer.dropout = true asks for a launch at defaults.
    "megatron": MemoryConvention(
        "megatron", ddp_buckets=False, deepspeed_buffers=False, sources=MappingProxyType({
            "hidden_dropout = attention_dropout = 0.1 (trainer.dropout = true)": "megatron/core/"
            "transformer/transformer_config.py TransformerConfig; Megatron-LM d98e8a64",
            "one contiguous gradient buffer (grad_dtype fp32 under grad_reduce_in_fp32), "
            "main_grad views into it, reduced in place; a bf16 parameter buffer with the "
            "distributed optimizer": "megatron/core/distributed/param_and_grad_buffer.py "
            "(grad_dtype L924, param_data and grad_data L1181-1195); Megatron-LM d98e8a64",
            "bf16 forces fp32 gradient accumulation and reduction": "megatron/training/"
            "arguments.py validate_args L1205-1216; Megatron-LM d98e8a64",
            "fp32 main parameters of the shard; an fp32 gradient is a view, not a copy":
            "megatron/core/optimizer/distrib_optimizer.py (shard_model_param.clone().float() "
            "L445, shard_model_grad.float() L2792); Megatron-LM d98e8a64"})),
    "torchtitan": MemoryConvention(
        "torchtitan", loss="eager", compiled_loss=True, logits_freed=True, fsdp=True,
        deepspeed_buffers=False,
        gradients_between_steps=False, step_moment="foreach-adamw", separate_moments=True,
        judges="peak_reserved", sources=MappingProxyType({
            **_FSDP_SOURCES,
            "bf16 parameters, fp32 reduction; reshard_after_forward except under PP":
            f"torchtitan/models/llama3/infra/parallelize.py apply_fsdp; {_TT}",
            "F.cross_entropy(pred.flatten(0, 1).float(), labels); del pred before backward":
            f"torchtitan/components/loss.py cross_entropy_loss, torchtitan/train.py "
            f"forward_backward_step; {_TT}",
            "the loss compiled with --compile": f"torchtitan/components/loss.py "
            f"build_cross_entropy_loss; {_TT}",
            "op-level selective checkpointing": f"torchtitan/distributed/activation_checkpoint.py "
            f"SelectiveAC (_op_sac_save_list); {_TT}"})),
})


def memory_convention(engine: str) -> MemoryConvention:
    """The memory convention of the engine called ``engine``."""
    if engine not in CONVENTIONS:
        raise ValueError(f"engine must be one of {', '.join(ENGINE_NAMES)}, got {engine!r}")
    return CONVENTIONS[engine]


def check_reserved_ppm(ppm, name: str = "reserved_ppm") -> int:
    """The allocator's reserve in parts per million of the allocated peak: 0 to 1,000,000."""
    if isinstance(ppm, bool) or not isinstance(ppm, int) or not 0 <= ppm <= MILLION:
        raise ValueError(f"{name} must be a whole number of parts per million from 0 to "
                         f"{MILLION:,}, got {ppm!r}")
    return ppm


def reserved_bytes(allocated, ppm: int = RESERVED_PPM):
    """The reserved peak of an allocated peak: allocated plus the caching allocator's reserve,
    ``ppm`` parts per million of it (default: :data:`RESERVED_PPM`), rounded down, exact for
    Python ints and int64 arrays alike (no product passes 2**63)."""
    return allocated + allocated // MILLION * ppm + (allocated % MILLION) * ppm // MILLION
