"""Seconds per step: the collectives a step makes, where their rings run, and how long they and
the compute take, for data parallelism alone and with tensor and pipeline parallelism.

Reads the catalogues and the memory arithmetic.
"""
