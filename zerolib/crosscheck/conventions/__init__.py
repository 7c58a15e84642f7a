"""Other systems' published memory arithmetic, reproduced under their own names beside zerolib's.

Each module transcribes one source into ``data/`` (with its citation in a Markdown file there),
reproduces every printed number with zerolib's own functions under the source's convention,
and sets zerolib's chapter numbers beside them with every difference named:

- :mod:`~zerolib.crosscheck.conventions.megatron_distributed_optimizer`: Megatron-LM's distributed-optimizer table
  (bytes per parameter with and without it);
- :mod:`~zerolib.crosscheck.conventions.playbook`: the Hugging Face Ultra-Scale Playbook's
  memory table and the data behind its memory plots (ZeRO stages, model sizes);
- :mod:`~zerolib.crosscheck.conventions.zero_infinity`: the ZeRO-Infinity paper's memory
  requirements for 0.1 to 100 trillion parameters (its Figure 2a);
- :mod:`~zerolib.crosscheck.conventions.side_by_side`: all of them, with the ZeRO paper and
  DeepSpeed's estimator, as bytes per parameter per GPU at one data-parallel degree.

Every ``comparison()`` returns one tidy row per printed value (:data:`common.COMPARISON_COLUMNS`).
"""
