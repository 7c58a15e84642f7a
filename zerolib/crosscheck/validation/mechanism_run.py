"""Each trainer mechanism run with the real PyTorch code on the CPU (needs PyTorch and
transformers; the vocabulary-parallel loss needs megatron-core, Float8 needs torchao).

- Saved activations: ``LlamaDecoderLayer`` (transformers) x ``shape.layers``, bf16, sdpa (on the
  CPU without dropout: its flash kernel, which saves what CUDA's flash kernel saves), under each
  recompute policy of ``explain_mechanisms.RECOMPUTE_CASES``. Counted twice: the storages made
  during the forward that are still alive after it, less the output (``StorageTracker``), and
  the CPU allocator's bytes (``allocator_trace``), which also holds the CPU RNG state each
  checkpoint stashes (host memory on a GPU too).
- The loss: the peak of bytes alive from the bf16 logits to their bf16 gradient.
- FSDP2 under a pipeline schedule: ``FSDPMemTracker`` over fake ranks (a fake process group,
  the model on the meta device, ``FakeTensorMode``), the state between micro-batches.
"""
from __future__ import annotations

import contextlib
import functools
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from zerolib.crosscheck.validation.explain_mechanisms import (
    FSDP_MICRO_BATCHES,
    FSDP_RANKS,
    FSDP_SETTINGS,
    FULL_WIDTH,
    LLAMA_SHAPE,
    LOSS_CASES,
    LOSS_SHAPE,
    RECOMPUTE_CASES,
    STAGE_SHAPE,
    STEP_POLICIES,
    STEP_SHAPE,
    LlamaShape,
    LossCase,
    LossShape,
    RecomputeCase,
    StepShape,
)
from zerolib.crosscheck.validation.live_memory import StorageTracker, allocator_trace

SEED = 0
DROPOUT_P = 0.1   # Megatron-LM's hidden_dropout default


def llama_config(shape: LlamaShape, **extra):
    import transformers

    return transformers.LlamaConfig(
        hidden_size=shape.hidden, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim, intermediate_size=shape.ffn_hidden, num_hidden_layers=shape.layers,
        vocab_size=256, max_position_embeddings=shape.seq_len, attn_implementation="sdpa", **extra)


# --- recompute policies ----------------------------------------------------------------------

_MM = torch.ops.aten.mm.default
CPU_FLASH_ATTENTION = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


def torchtitan_save_list() -> set:
    """torchtitan v0.2.2's ``_op_sac_save_list`` (llama3 ``parallelize.py``), the ops this
    torch build has: mm, the CUDA SDPA kernels, reduce-scatter, max."""
    names = ("mm.default", "_scaled_dot_product_efficient_attention.default",
             "_scaled_dot_product_flash_attention.default",
             "_scaled_dot_product_cudnn_attention.default",
             "_scaled_dot_product_attention_math.default",
             "_scaled_dot_product_fused_attention_overrideable.default", "max.default")
    ops = {functools.reduce(getattr, name.split("."), torch.ops.aten) for name in names}
    return ops | {torch.ops._c10d_functional.reduce_scatter_tensor.default}


def op_sac_policy(save: set):
    """torchtitan's per-op policy: save the listed ops' outputs, except every second mm
    (counted per checkpointed forward); recompute everything else."""
    count = {"forward": 0, "recompute": 0}

    def policy(ctx, func, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == _MM:
            count[mode] += 1
        if func in save and not (func == _MM and count[mode] % 2 == 0):
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _checkpointed_sdpa(*args, **kwargs):
    """Megatron's selective recomputation: the core attention under a reentrant checkpoint
    (its inputs saved, the kernel re-run in backward)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    module, query, key, value, mask = args
    return checkpoint(lambda q, k, v: sdpa_attention_forward(module, q, k, v, mask, **kwargs),
                      query, key, value, use_reentrant=True)


def _hidden_dropout(module, args, output):
    return torch.native_dropout(output, DROPOUT_P, True)[0]


@contextlib.contextmanager
def _default_dtype(dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def float8(module: nn.Module, all_gather: bool = False) -> nn.Module:
    """torchao's Float8 training conversion (every nn.Linear a Float8Linear, dynamic tensorwise
    scales, as torchtitan's ``--model.converters float8``); ``all_gather``: FSDP2 all-gathers the
    weights in fp8 (``enable_fsdp_float8_all_gather``)."""
    import logging

    # torchao warns that its CUDA-only extensions do not load on a CPU build
    logging.getLogger("torchao").setLevel(logging.ERROR)
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig(enable_fsdp_float8_all_gather=all_gather)
    return convert_to_float8_training(module, config=config)


def _layers(case: RecomputeCase, shape: LlamaShape):
    from transformers import AttentionInterface
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    AttentionInterface.register("zerolib_checkpointed_sdpa", _checkpointed_sdpa)
    attention = "zerolib_checkpointed_sdpa" if case.policy == "core-attention" else "sdpa"
    config = llama_config(shape)
    config._attn_implementation = attention
    torch.manual_seed(SEED)
    with _default_dtype(torch.bfloat16):   # not .to(): under FakeTensorMode it cannot swap parameters
        layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(shape.layers)).train()
    if case.float8:
        float8(layers)
    if case.dropout:
        for layer in layers:
            layer.self_attn.o_proj.register_forward_hook(_hidden_dropout)
            layer.mlp.down_proj.register_forward_hook(_hidden_dropout)
    return layers, LlamaRotaryEmbedding(config)


def _stack_forward(case: RecomputeCase, layers, x, position):
    """The layers' forward under ``case``'s policy; the input is a fresh storage (a clone, whose
    backward saves nothing), so the first layer's input is counted as the others are."""
    hidden = x.clone()
    run = [lambda h, c, s, layer=layer: layer(h, position_embeddings=(c, s)) for layer in layers]
    n = case.recompute_layers
    if case.policy == "uniform":
        for start in range(0, len(run), n):
            chunk = run[start:start + n]
            hidden = checkpoint(lambda h, c, s, chunk=chunk: functools.reduce(
                lambda acc, f: f(acc, c, s), chunk, h), hidden, *position, use_reentrant=True)
        return hidden
    for index, forward in enumerate(run):
        if case.policy == "block" and index < n:
            hidden = checkpoint(forward, hidden, *position, use_reentrant=True)
        elif case.policy in ("op-sac", "op-sac-cpu-list"):
            save = torchtitan_save_list() | ({CPU_FLASH_ATTENTION} if case.policy == "op-sac" else set())
            context = functools.partial(create_selective_checkpoint_contexts, op_sac_policy(save))
            # non-reentrant, as torchtitan's checkpoint_wrapper; the policy made per forward
            hidden = checkpoint(forward, hidden, *position, use_reentrant=False,
                                context_fn=lambda context=context: context())
        else:
            hidden = forward(hidden, *position)
    return hidden


def measure_recompute(case: RecomputeCase, shape: LlamaShape = LLAMA_SHAPE, fake: bool = False) -> dict:
    """Bytes the layers keep for backward: by storage (``tracker``) and by the allocator, and
    the storages' (op, dtype, shape, bytes) in creation order. ``fake``: under
    ``FakeTensorMode`` (shapes only, any width in a fraction of a second; no allocator count)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() if fake else contextlib.nullcontext():
        layers, rope = _layers(case, shape)
        torch.manual_seed(SEED + 1)
        x = torch.randn(shape.micro_batch, shape.seq_len, shape.hidden, dtype=torch.bfloat16,
                        requires_grad=True)
        position = tuple(t.detach() for t in rope(x, torch.arange(shape.seq_len)[None]))
        tracker = StorageTracker()
        with tracker:
            out = _stack_forward(case, layers, x, position)
        kept = tracker.alive(exclude=out)
        out.float().square().mean().backward()   # what was kept suffices for a real backward
        del out
    if fake:
        return {"tracker": sum(item.nbytes for item in kept), "allocator": None, "items": kept}
    torch.manual_seed(SEED + 2)
    _, allocated = allocator_trace(lambda: _stack_forward(case, layers, x, position))
    output_bytes = 2 * shape.tokens * shape.hidden
    return {"tracker": sum(item.nbytes for item in kept), "allocator": allocated - output_bytes,
            "items": kept}


# --- the loss ----------------------------------------------------------------------------------

@contextlib.contextmanager
def _fake_tensor_parallel(ranks: int):
    """Megatron's tensor-parallel state over a fake process group of ``ranks`` (this process is
    rank 0; collectives move no data, sizes are real)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # megatron-core without TransformerEngine or Apex says so
        from megatron.core import parallel_state
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=ranks)
    try:
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=ranks,
                                                 create_gloo_process_groups=False)
        yield
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def _loss_function(case: LossCase, shape: LossShape, labels):
    if case.name == "eager-fp32":
        return lambda logits: F.cross_entropy(logits.float(), labels)
    if case.name == "eager-bf16":
        return lambda logits: F.cross_entropy(logits, labels)
    if case.name == "chunked-fp32":
        def chunked(logits):
            pairs = zip(logits.chunk(shape.chunks), labels.chunk(shape.chunks))
            return sum(F.cross_entropy(c.float(), y, reduction="sum") for c, y in pairs) / labels.numel()
        return chunked
    if case.name == "compiled-fp32":
        return torch.compile(lambda logits: F.cross_entropy(logits.float(), labels))
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    # Megatron's layout: logits [s, b, V/t], labels [s, b]; one sequence of N tokens here
    return lambda logits: vocab_parallel_cross_entropy(logits[:, None], labels[:, None]).mean()


def measure_loss(case: LossCase, shape: LossShape = LOSS_SHAPE) -> dict:
    """Peak bytes alive from the bf16 logits (a fresh storage) to their bf16 gradient."""
    torch.manual_seed(SEED)
    vocab = shape.vocab // case.ranks
    base = torch.randn(shape.tokens, vocab, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, shape.vocab, (shape.tokens,))
    with _fake_tensor_parallel(case.ranks) if case.ranks > 1 else contextlib.nullcontext():
        loss_fn = _loss_function(case, shape, labels)

        def run():
            logits = base.clone()
            return torch.autograd.grad(loss_fn(logits), logits)

        if case.name == "compiled-fp32":
            run()   # compile outside the measurement
            tracker = None
        else:
            tracker = StorageTracker()
            with tracker:
                run()
        peak, _ = allocator_trace(run)
    return {"tracker": None if tracker is None else tracker.peak, "allocator": peak,
            "items": [] if tracker is None else tracker.at_peak}


# --- FSDP2 under a pipeline schedule ---------------------------------------------------------

def _snapshot(tracker) -> dict[str, int]:
    """FSDPMemTracker's current bytes per category (its names), on the one device."""
    (device_snapshot,) = tracker.get_tracker_snapshot().values()
    return {getattr(key, "name", str(key)): int(value) for key, value in device_snapshot.items()}


class _Stage(nn.Module):
    """A pipeline stage's blocks: Llama layers, the rotary tables made once per forward."""

    def __init__(self, shape: LlamaShape):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

        config = llama_config(shape)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(shape.layers))
        self.rotary = LlamaRotaryEmbedding(config)

    def forward(self, x):
        position = self.rotary(x, torch.arange(x.shape[1], device=x.device)[None])
        for layer in self.layers:
            x = layer(x, position_embeddings=position)
        return x


def measure_fsdp_pipeline(pipeline: bool, ranks: int = FSDP_RANKS, micro_batches: int = FSDP_MICRO_BATCHES,
                          shape: LlamaShape = STAGE_SHAPE, fp8_all_gather: bool = False) -> dict:
    """FSDPMemTracker's categories after each micro-batch's backward of the second step.

    ``pipeline``: torchtitan's FSDP2 under PP (``reshard_after_forward=False``) with what
    ``torch.distributed.pipelining``'s stage sets before each backward but the last
    (``set_is_last_backward``, ``set_reshard_after_backward`` and
    ``set_requires_gradient_sync`` False); otherwise FSDP2's default (resharded after forward,
    gradients reduce-scattered after every micro-batch). bf16 parameters, fp32 reduction.
    ``fp8_all_gather``: the Linear layers made Float8Linear with fp8 all-gather (torchao).
    """
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=ranks)
    try:
        mesh = init_device_mesh("cpu", (ranks,))
        with torch.device("meta"):
            stage = _Stage(shape)
        if fp8_all_gather:
            float8(stage, all_gather=True)
        parameters = sum(p.numel() for p in stage.parameters())
        tensors = sum(1 for _ in stage.parameters())
        linear = [m.weight.numel() for m in stage.modules() if isinstance(m, nn.Linear)]
        with FakeTensorMode(allow_non_fake_inputs=True):
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            for layer in stage.layers:
                fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=not pipeline)
            fully_shard(stage, mesh=mesh, mp_policy=policy, reshard_after_forward=not pipeline)
            stage.to_empty(device="cpu")
            optimizer = torch.optim.AdamW(stage.parameters(), lr=1e-3)
            x = torch.empty(shape.micro_batch, shape.seq_len, shape.hidden, dtype=torch.bfloat16)
            tracker = FSDPMemTracker(stage, optimizer)
            tracker.track_inputs((x,))
            snapshots = []

            def step(record):
                for index in range(micro_batches):
                    last = index == micro_batches - 1
                    if pipeline:
                        stage.set_is_last_backward(last)
                        stage.set_reshard_after_backward(last)
                        stage.set_requires_gradient_sync(last)
                    stage(x).float().square().mean().backward()
                    if record:
                        snapshots.append(_snapshot(tracker))
                optimizer.step()
                optimizer.zero_grad()

            with tracker:
                step(False)
                tracker.reset_mod_stats()
                step(True)
    finally:
        dist.destroy_process_group()
    return {"parameters": parameters, "tensors": tensors, "linear_parameters": sum(linear),
            "linear_tensors": len(linear), "snapshots": snapshots}


def measure_step(policy: str, shape: StepShape = STEP_SHAPE) -> dict:
    """A whole training step at full width on fake tensors (``zerolib.crosscheck.fake_run``, in
    a process of its own), with FSDPMemTracker beside it."""
    import transformers

    from zerolib.crosscheck.fake_run import FakeStep, fake_step_peak

    config = transformers.LlamaConfig(
        hidden_size=shape.hidden, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim, intermediate_size=shape.ffn_hidden, num_hidden_layers=shape.layers,
        vocab_size=shape.vocab, max_position_embeddings=shape.tokens)
    found = fake_step_peak(config, FakeStep(ranks=shape.ranks, seq_len=shape.tokens, recompute=policy))
    return {"peak_bytes": found.peak_bytes, "state_bytes": found.state_bytes,
            "fsdp_mem_tracker_peak": found.by_category}


def measure_all() -> dict:
    """Every measurement, by mechanism."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # same kernels every time; the shapes are tiny
    try:
        return {"recompute": {case.name: measure_recompute(case) for case in RECOMPUTE_CASES},
                "recompute_full_width": {case.name: measure_recompute(case, FULL_WIDTH, fake=True)
                                         for case in RECOMPUTE_CASES},
                "loss": {case.name: measure_loss(case) for case in LOSS_CASES},
                "fsdp_pipeline": {name: measure_fsdp_pipeline(name != "default",
                                                              fp8_all_gather=name.endswith("fp8"))
                                  for name in FSDP_SETTINGS},
                "step": {policy: measure_step(policy) for policy in STEP_POLICIES}}
    finally:
        torch.set_num_threads(previous)


def versions() -> dict:
    """What the measurement ran on (recorded beside the numbers)."""
    import platform
    from importlib.metadata import version

    return {"torch_version": torch.__version__, "transformers_version": version("transformers"),
            "megatron_core_version": version("megatron-core"), "torchao_version": version("torchao"),
            "python_version": platform.python_version(),
            "platform": f"{platform.system()}-{platform.machine()}"}


def validate_mechanisms():
    """The recorded table (``explain_mechanisms.compare_mechanisms``) with version columns."""
    from zerolib.crosscheck.validation.explain_mechanisms import compare_mechanisms
    from zerolib.crosscheck.validation.records import MECHANISMS_VERSION_COLUMNS, with_versions

    return with_versions(compare_mechanisms(measure_all()), versions(), MECHANISMS_VERSION_COLUMNS)
