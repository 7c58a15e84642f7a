"""The defaults and limits a run is checked against, in one light module: the run's door
(:mod:`zerolib.core.run`) and the modules that use them (the engines, the step's time, offload)
read them here, so making a run imports none of the step's arithmetic."""
from __future__ import annotations

# The engines, by name (zerolib.core.step.engines.ENGINES holds each convention, in this order).
ENGINE_NAMES = ("paper", "deepspeed", "fsdp2", "megatron", "torchtitan")
DEFAULT_ENGINE = "deepspeed"   # ZeRO's reference implementation, at its defaults

# Compute at a stated utilisation of the device's peak FLOP/s.
DEFAULT_MFU = 0.4
# Lowest utilisation accepted: 0.1 %. Far below any real run, and high enough that every time
# derived from it stays finite (10**15 parameters x 2**40 tokens x 8 FLOPs at 0.1 % of the
# slowest catalogued GPU is about 10**17 s; 1e-320 would overflow float64 to infinity).
MIN_MFU = 0.001
MAX_TOKENS_PER_GPU = 2**40     # tokens one GPU processes in one step
MAX_RUN_TOKENS = 10**18        # tokens of one run: far above any published pre-training (~10**13)

# Offload's host: the PCIe link its copies run on by default, and the highest CPU-Adam rate
# accepted, parameters per second per node: 10^15, far beyond any host (its memory would have to
# stream 30 PB/s), low enough that every time stays finite.
DEFAULT_HOST_LINK = "pcie4-x16"
MAX_CPU_ADAM_RATE = 10**15
