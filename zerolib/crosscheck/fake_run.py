"""A training step run on fake tensors at a real model's width, over fake ranks: a second
opinion on the peak (needs PyTorch and transformers).

The model is built on the meta device from its configuration (a zerolib ``TransformerConfig``
of a Llama-style model, or a ``transformers`` configuration), wrapped with FSDP2 as torchtitan
does (``fully_shard`` per decoder layer and on the root, bf16 parameters, fp32 reduction) over a
``fake`` process group of ``ranks`` ranks, and trained for two steps of AdamW under
``FakeTensorMode``: shapes and dtypes only, no storage, a few seconds for a layer of
Llama-3-8B. The loss is transformers' own (``F.cross_entropy(logits.float(), ...)``).
Everything the step makes is counted by ``StorageTracker``, which sees through DTensor to the
local shards and follows FSDP2's in-place storage resizes; the answer is the second step's
peak of bytes alive on rank 0, and what was alive at that moment by when it was made.

What it is not: a CUDA run. The CPU takes its own kernels where they differ (on the CPU SDPA
without dropout is its flash kernel, which saves what CUDA's flash kernel saves; an
``nn.RMSNorm`` runs as separate ops on the CPU, where PyTorch has a fused ``_fused_rms_norm`` op
for accelerators; dropout on the CPU keeps 2-byte noise where
CUDA keeps a 1-byte mask), the caching allocator's reserve and fragmentation, the CUDA context
and the communication buffers are not in it. ``data/mechanisms_measured.md`` holds a run of
Llama-3-8B's width against a count by hand.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import time
from dataclasses import asdict, dataclass, field

from zerolib.core.catalogue.models import TransformerConfig

RECOMPUTE = ("none", "op-sac", "full")
PHASES = ("setup", "first step", "forward", "backward", "optimizer")
LARGEST = 40


@dataclass(frozen=True)
class FakeStep:
    """What to run: the FSDP2 degree, the micro-batch, the recompute policy and a time bound."""

    ranks: int = 8
    seq_len: int = 2048
    micro_batch: int = 1
    recompute: str = "none"        # none, op-sac (torchtitan's op-level policy), full
    layers: int | None = None      # run this many decoder layers (None: the model's)
    time_limit: float = 300.0      # seconds; the run is stopped after it
    compare: bool = True           # also run PyTorch's FSDPMemTracker: its peak by category

    def __post_init__(self):
        for name in ("ranks", "seq_len", "micro_batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        if self.layers is not None and (isinstance(self.layers, bool) or not isinstance(self.layers, int)
                                        or self.layers < 1):
            raise ValueError(f"layers must be None or a whole number >= 1, got {self.layers!r}")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {self.recompute!r}")
        if isinstance(self.time_limit, bool) or not isinstance(self.time_limit, (int, float)) \
                or not 0 < self.time_limit <= 3600:
            raise ValueError(f"time_limit must be seconds in (0, 3600], got {self.time_limit!r}")


@dataclass(frozen=True)
class FakePeak:
    """The second step's peak on rank 0 (bytes), the bytes alive before that step, and what
    was alive at the peak by when it was made or last grown (``PHASES``: setup = sharded
    parameters and inputs; first step = what the first step left, the optimizer state;
    forward, backward, optimizer = made during the second step), and by FSDPMemTracker's
    categories (sharded and unsharded parameters, gradients, activations, temporaries, the
    prefetched all-gather, optimizer state, inputs)."""

    peak_bytes: int
    state_bytes: int
    by_phase: dict = field(default_factory=dict)
    seconds: float = 0.0
    largest: tuple = ()   # the largest storages alive at the peak: (op, dtype, shape, bytes, phase)
    by_category: dict = field(default_factory=dict)   # FSDPMemTracker's peak (FakeStep.compare)

    @property
    def trackers_agree(self) -> bool:
        """FSDPMemTracker's peak total is the StorageTracker's (it was, to the byte, wherever
        nothing outlived a step: data/mechanisms_measured.md)."""
        return self.by_category.get("Total") == self.peak_bytes


def llama_config(config: TransformerConfig):
    """A transformers LlamaConfig for a Llama-style zerolib configuration."""
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
    if (not config.gated_mlp or config.norm != "rmsnorm" or config.position_embedding != "rotary"
            or config.experts or config.kv_lora_rank or config.post_norms or config.qk_norm != "none"
            or config.fused_qkv or config.shared_norm or config.embedding_norm):
        raise ValueError(f"config must be a Llama-style model (gated MLP, RMSNorm, rotary, dense), "
                         f"got {config.name!r}")
    import transformers

    return transformers.LlamaConfig(
        hidden_size=config.hidden, num_attention_heads=config.heads, num_key_value_heads=config.kv_heads,
        head_dim=config.head_width, intermediate_size=config.ffn_hidden, num_hidden_layers=config.layers,
        vocab_size=config.vocab, max_position_embeddings=config.max_positions,
        tie_word_embeddings=config.tied_embeddings, attention_bias=config.qkv_bias,
        mlp_bias=config.mlp_bias, attn_implementation="sdpa")


def _transformers_config(config):
    import transformers

    if isinstance(config, TransformerConfig):
        return llama_config(config)
    if isinstance(config, transformers.PretrainedConfig):
        return config
    raise TypeError(f"config must be a TransformerConfig or a transformers configuration, "
                    f"got {type(config).__name__}")


def fake_step_peak(config, step: FakeStep = FakeStep()) -> FakePeak:
    """Run ``step`` for ``config`` in a fresh process (its own fake process group), stopped after
    ``step.time_limit`` seconds (``TimeoutError``)."""
    if not isinstance(step, FakeStep):
        raise TypeError(f"step must be a FakeStep, got {type(step).__name__}")
    hf_config = _transformers_config(config)
    if step.seq_len > getattr(hf_config, "max_position_embeddings", step.seq_len):
        raise ValueError(f"seq_len must be at most the model's {hf_config.max_position_embeddings} "
                         f"positions, got {step.seq_len}")
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(hf_config.to_dict(), asdict(step), send), daemon=True)
    start = time.monotonic()
    process.start()
    send.close()
    try:
        if not receive.poll(step.time_limit):
            raise TimeoutError(f"the fake run took longer than time_limit={step.time_limit} s")
        try:
            result = receive.recv()
        except EOFError:
            process.join(5)
            raise RuntimeError(f"the fake run's process ended without an answer (exit code "
                               f"{process.exitcode})") from None
    finally:
        if process.is_alive():
            process.terminate()
        process.join(5)
        receive.close()
    if "error" in result:
        raise RuntimeError(f"the fake run failed: {result['error']}")
    return FakePeak(result["peak_bytes"], result["state_bytes"], result["by_phase"],
                    round(time.monotonic() - start, 3), tuple(map(tuple, result["largest"])),
                    result["by_category"])


def _child(config_dict: dict, step_dict: dict, send) -> None:
    try:
        send.send(run_in_process(config_dict, FakeStep(**step_dict)))
    except Exception as error:   # the parent reports it as one line
        send.send({"error": f"{type(error).__name__}: {error}"})
    finally:
        send.close()


def _wrap_layers(model, recompute: str) -> None:
    """torchtitan's activation checkpointing of each decoder layer (before fully_shard)."""
    import functools

    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    from zerolib.crosscheck.validation.mechanism_run import CPU_FLASH_ATTENTION, op_sac_policy, torchtitan_save_list

    layers = model.model.layers
    for index, layer in enumerate(layers):
        if recompute == "full":
            layers[index] = checkpoint_wrapper(layer)
        else:
            save = torchtitan_save_list() | {CPU_FLASH_ATTENTION}
            layers[index] = checkpoint_wrapper(layer, context_fn=functools.partial(
                lambda save=save: create_selective_checkpoint_contexts(op_sac_policy(save))))


FAKE_SDPA = "zerolib_fake_sdpa"


def _causal_sdpa(module, query, key, value, attention_mask, **kwargs):
    """transformers' sdpa attention without the materialised causal mask. On real tensors with
    no padding transformers passes no mask (SDPA's ``is_causal``); on fake tensors it cannot read
    the padding mask, so it builds an s x s mask and repeats K and V to every head, which a real
    run does not. The fake run's inputs are never padded: the mask is dropped, as a real run's."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, None, **kwargs)


def run_in_process(config_dict: dict, step: FakeStep) -> dict:
    """The run itself, in this process (which must have no process group yet)."""
    import logging
    import warnings

    logging.getLogger("torchao").setLevel(logging.ERROR)   # if installed: its CUDA-only extensions
    import torch
    import torch.distributed as dist
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from zerolib.crosscheck.validation.live_memory import StorageTracker

    warnings.simplefilter("ignore")
    config = transformers.AutoConfig.for_model(**config_dict)
    if step.layers is not None:
        config.num_hidden_layers = step.layers
    transformers.AttentionInterface.register(FAKE_SDPA, _causal_sdpa)
    config._attn_implementation = FAKE_SDPA
    config.use_cache = False   # training: no KV cache (it would keep every layer's K and V)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=step.ranks)
    try:
        mesh = init_device_mesh("cpu", (step.ranks,))
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
        if step.recompute != "none":
            _wrap_layers(model, step.recompute)
        tracker = StorageTracker()
        with FakeTensorMode(allow_non_fake_inputs=True):
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            for layer in model.model.layers:
                fully_shard(layer, mesh=mesh, mp_policy=policy)
            fully_shard(model, mesh=mesh, mp_policy=policy)
            with tracker:
                tracker.phase = "setup"
                model.to_empty(device="cpu")
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
                ids = torch.randint(0, config.vocab_size, (step.micro_batch, step.seq_len))

                def train_step(first: bool):
                    tracker.phase = "first step" if first else "forward"
                    loss = model(input_ids=ids, labels=ids).loss
                    tracker.phase = "first step" if first else "backward"
                    loss.backward()
                    del loss
                    tracker.phase = "first step" if first else "optimizer"
                    optimizer.step()
                    optimizer.zero_grad()

                # PyTorch's own tracker runs beside, for comparison (its peak, by category)
                pytorch_tracker = FSDPMemTracker(model, optimizer) if step.compare else None
                with pytorch_tracker if pytorch_tracker is not None else contextlib.nullcontext():
                    if pytorch_tracker is not None:
                        pytorch_tracker.track_inputs((ids,))
                    train_step(True)
                    state = tracker.current
                    tracker.reset_peak()
                    if pytorch_tracker is not None:
                        pytorch_tracker.reset_mod_stats()
                    train_step(False)
        compared = {}
        if pytorch_tracker is not None:
            (snapshot,) = pytorch_tracker.get_tracker_snapshot("peak").values()
            compared = {getattr(key, "name", str(key)): int(value) for key, value in snapshot.items()}
        by_phase = {phase: sum(item.nbytes for item in tracker.at_peak if item.phase == phase)
                    for phase in PHASES}
        largest = sorted(tracker.at_peak, key=lambda item: -item.nbytes)[:LARGEST]
        return {"peak_bytes": tracker.peak, "state_bytes": state, "by_phase": by_phase,
                "by_category": compared,
                "largest": [(i.op, i.dtype, "x".join(map(str, i.shape)), i.nbytes, i.phase)
                            for i in largest]}
    finally:
        dist.destroy_process_group()
