"""Check zerolib's arithmetic against what real PyTorch runs hold in memory (on the CPU).

This package needs the optional ``validate`` extra (PyTorch, and transformers for the shipped
blocks). Importing it does not import torch: only the modules that run PyTorch do
(``sharded_run``, ``block``, ``activation_run``, ``shipped_run``, ``llama_block``,
``tensor_parallel_run``); the expected-value arithmetic (``setups``, ``explain_sharded``,
``explain_activations``, ``explain_shipped``, ``explain_tensor_parallel``) and the recorded files
(``records``) are plain Python.
"""
from __future__ import annotations

# The CPU build this chapter measured with; on this project's machines pip reads it from disk,
# while an unpinned `torch` pulls a CUDA build of several GB.
TORCH_PIN = "2.13.0"
INSTALL_HINT = (f"install the validate extra: pip install -e '.[validate]' "
                f"(on this project's machines: pip install torch=={TORCH_PIN}, the CPU build)")
DEEPSPEED_INSTALL_HINT = (f"pip install torch=={TORCH_PIN} && DS_BUILD_OPS=0 pip install "
                          "--no-build-isolation -e '.[deepspeed]'")
