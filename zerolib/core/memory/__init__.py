"""Bytes per GPU: layouts and accounting, placement, activations, the working set, the
model-parallel splits and pipeline schedules, feasibility and the tidy memory tables.

Reads the catalogues; never imports :mod:`zerolib.core.step`.
"""
