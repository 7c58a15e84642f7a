"""The trainer's memory settings (:mod:`zerolib.core.memory.conventions`): their checks and
the defaults each engine gives them, as methods of :class:`zerolib.core.run.Trainer`."""
from __future__ import annotations

from zerolib.core.defaults import (
    MAX_RECOMPUTE_LAYERS,
    MILLION,
    NORMS,
    RECOMPUTE_METHODS,
    RESERVED_PPM,
)
from zerolib.core.memory.accounting import Layout
from zerolib.core.memory.loss import LOSSES, MAX_LOSS_CHUNKS

__all__ = ["FSDP2_ENGINES", "RESERVED_PPM", "TrainerMemory"]
# The engines that run FSDP2's fully_shard (reshard_after_forward is theirs)
FSDP2_ENGINES = ("fsdp2", "torchtitan")


class TrainerMemory:
    """The memory half of a Trainer (a mixin of the frozen noun: no fields of its own)."""

    def _memory_fields(self) -> None:
        """The trainer's memory settings (zerolib.core.memory.conventions): checked here, in the
        noun's words."""
        self._choice("norms", NORMS)
        for name in ("fp8", "fp8_all_gather", "compile"):
            self._flag(name)
        self._flag("logits_freed", optional=True)
        self._choice("recompute_method", RECOMPUTE_METHODS)
        self._whole("recompute_layers", 1, MAX_RECOMPUTE_LAYERS)
        if (self.recompute_method, self.recompute_layers) != ("uniform", 1) \
                and self.recompute_policy != "full":
            raise ValueError(f"trainer.recompute_method and trainer.recompute_layers choose how "
                             f"full recomputation checkpoints layers: they need trainer.recompute "
                             f"'full', got {self.recompute_policy!r}")
        self._choice("loss", LOSSES, optional=True)
        self._whole("loss_chunks", 1, MAX_LOSS_CHUNKS)
        if self.loss is not None and self.logits_bytes is not None and self.loss != "stored":
            raise ValueError(f"trainer.logits_bytes are the widths of the 'stored' loss: not with "
                             f"trainer.loss {self.loss!r}")
        self._whole("reserved_ppm", 0, MILLION)
        self._flag("reshard_after_forward", optional=True)
        if self.reshard_after_forward is not None and self.engine_name not in FSDP2_ENGINES:
            raise ValueError(f"trainer.reshard_after_forward is FSDP2's fully_shard setting: it "
                             f"needs the engine fsdp2 or torchtitan, got {self.engine_name!r}")
        if self.fp8_all_gather and not (self.fp8 and self.engine_name == "torchtitan"):
            raise ValueError("trainer.fp8_all_gather is FSDP2's all-gather of Float8 weights: it "
                             "needs trainer.fp8 and the engine torchtitan")

    @property
    def engine_name(self) -> str:
        return self.engine if isinstance(self.engine, str) else self.engine.name

    @property
    def recompute_policy(self) -> str:
        """``recompute``, or the engine's default where none is given: torchtitan's train
        configs set op-level selective checkpointing (``[activation_checkpoint] mode =
        "selective"``, ``selective_ac_option = "op"``), the others recompute nothing."""
        if self.recompute is not None:
            return self.recompute
        return "op-selective" if self.engine_name == "torchtitan" else "none"

    def memory_fields(self) -> dict:
        """The working set's fields of the trainer's memory settings (WorkingSetSettings')."""
        return {"engine": self.engine_name, "norms": self.norms, "fp8": self.fp8,
                "fp8_all_gather": self.fp8_all_gather, "compile": self.compile,
                "recompute_method": self.recompute_method, "recompute_layers": self.recompute_layers,
                "loss": self.loss, "loss_chunks": self.loss_chunks,
                "logits_freed": self.logits_freed, "reserved_ppm": self.reserved_ppm,
                "reshard_after_forward": self.reshard_after_forward}

    @property
    def layout_of(self) -> str | Layout:
        """``layout``, or the engine's where none is given: torchtitan's FSDP2 keeps fp32
        sharded parameters and gradients (``MixedPrecisionPolicy(param_dtype=bf16,
        reduce_dtype=fp32)`` over fp32 parameters): ``fp32-adam``; Megatron-LM in 2-byte
        precision its bf16 default, bf16 parameters beside an fp32 gradient buffer
        (``accumulate_allreduce_grads_in_fp32``, forced for bf16): ``bf16-fp32-grads``; the
        others the chapter's ``mixed-adam``."""
        if self.layout is not None:
            return self.layout
        if self.engine_name == "megatron" and self.element_bytes == 2:
            return "bf16-fp32-grads"
        return "fp32-adam" if self.engine_name == "torchtitan" else "mixed-adam"

    @property
    def layout_name(self) -> str:
        layout = self.layout_of
        return layout if isinstance(layout, str) else layout.name
