"""The defaults and limits a run is checked against, in one light module: the run's door
(:mod:`zerolib.core.run`) and the modules that use them (the engines, the step's time, offload)
read them here, so making a run imports none of the step's arithmetic."""
from __future__ import annotations

# The engines, by name (zerolib.core.step.engines.ENGINES holds each convention, in this order).
ENGINE_NAMES = ("paper", "deepspeed", "fsdp2", "megatron", "torchtitan")
DEFAULT_ENGINE = "deepspeed"   # ZeRO's reference implementation, at its defaults

# Where offloaded state can go, and the node size when none is given: an 8-GPU server (DGX/HGX
# A100 and H100), or all GPUs when there are fewer (zerolib.core.memory.placement uses both).
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
DEFAULT_GPUS_PER_NODE = 8

# The working set's terms, by name (zerolib.core.memory.working_set computes each).
TERMS = ("activations", "logits_loss", "ddp_buckets", "reduce_bucket", "allgather_bucket",
         "gathered_parameters", "reserve")

# Compute at a stated utilisation of the device's peak FLOP/s.
DEFAULT_MFU = 0.4
# Lowest utilisation accepted: 0.1 %. Far below any real run, and high enough that every time
# derived from it stays finite (10**15 parameters x 2**40 tokens x 8 FLOPs at 0.1 % of the
# slowest catalogued GPU is about 10**17 s; 1e-320 would overflow float64 to infinity).
MIN_MFU = 0.001
MAX_TOKENS_PER_GPU = 2**40     # tokens one GPU processes in one step
DEFAULT_TOKENS_PER_GPU = 4096  # a bare parameter count's tokens per GPU per step
MAX_RUN_TOKENS = 10**18        # tokens of one run: far above any published pre-training (~10**13)

# Offload's host: the PCIe link its copies run on by default, and the highest CPU-Adam rate
# accepted, parameters per second per node: 10^15, far beyond any host (its memory would have to
# stream 30 PB/s), low enough that every time stays finite.
DEFAULT_HOST_LINK = "pcie4-x16"
MAX_CPU_ADAM_RATE = 10**15

# A run's memory settings and their bounds (their arithmetic lives in zerolib.core.memory): far
# beyond any real run, small enough that every term is exact in int64.
RECOMPUTE = ("none", "selective", "full", "op-selective")
# Full recomputation's methods (Megatron-LM --recompute-method): chunks of N layers keep their
# input, or the first N layers of a stage are checkpointed and the rest keep everything.
RECOMPUTE_METHODS = ("uniform", "block")
MAX_RECOMPUTE_LAYERS = 4096
# A norm's saved tensors: a fused kernel's (its input), or eager RMSNorm's (+ fp32 copy, 1/rms).
NORMS = ("fused", "eager")
MAX_ELEMENT_BYTES = 16        # bytes of one activation, mask or logit element
MAX_CONTEXT_PARALLEL = 1024   # CP ranks per sequence: far beyond any published run
DEFAULT_SEQ = 4096            # a model's sequence when none is given: its context length, at most this
MAX_SEQ_LEN = 2**24           # tokens per sequence (16,777,216)
MAX_MICRO_BATCH = 2**16       # sequences per GPU per step
SCHEDULES = ("1f1b", "interleaved")
SCHEDULE_RULE = "interleaved needs pipeline_parallel >= 2 and chunks >= 2; 1f1b has chunks = 1"
MAX_CHUNKS = 2**10            # model chunks per pipeline stage
MAX_MICRO_BATCHES = 2**24     # micro-batches per step per pipeline

# DeepSpeed's zero_optimization defaults, in elements (deepspeed/runtime/zero/config.py,
# DeepSpeed v0.19.8: reduce_bucket_size = pp_int(5e8), allgather_bucket_size = pp_int(5e8),
# stage3_prefetch_bucket_size = pp_int(5e7), stage3_max_live_parameters = pp_int(1e9),
# stage3_param_persistence_threshold = pp_int(1e5)). A buffer's bytes are these times the
# element size of the dtype it holds.
REDUCE_BUCKET_SIZE = 500_000_000
ALLGATHER_BUCKET_SIZE = 500_000_000
STAGE3_PREFETCH_BUCKET_SIZE = 50_000_000
STAGE3_MAX_LIVE_PARAMETERS = 1_000_000_000
STAGE3_PARAM_PERSISTENCE_THRESHOLD = 100_000

# What PyTorch's allocator does not count (CUDA context, NCCL's buffers; in the chapter's count
# also its cache): a round assumption, not a measurement (data/measured_peaks.md).
DEFAULT_RESERVE = 2 * 2**30   # 2 GiB

# The caching allocator's reserve over the allocated peak, in parts per million of it: the
# median of reserved / allocated - 1 over the 27 published (max allocated, max reserved) pairs
# of one rank each in data/reserve_pairs.csv (data/measured_peaks.md, "The allocator's
# reserve"): 108,403 ppm, rounded down. The pairs run from 0.38 % to 44 %; the model's residual
# against each pair's reserved bytes has a median of 5.5 % and a largest of 23 %: a stated
# median, not a law.
RESERVED_PPM = 108_403
MILLION = 1_000_000
# A spine oversubscribed at most 64:1 (NVIDIA's DGX SuperPOD builds 1:1, data/ring_at_scale.md).
MAX_OVERSUBSCRIPTION = 64.0
