"""zerolib against the outside world: the ZeRO paper's tables, DeepSpeed's estimator as a named
convention, and real sharded PyTorch and DeepSpeed runs measured per rank."""
