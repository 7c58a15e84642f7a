"""The arithmetic: bytes per GPU, exact, from numpy and pandas alone.

Counts and units, argument checks, layouts and per-worker bytes, devices, model presets,
activations, the working set, feasibility, communication and the tidy tables. Nothing here
imports matplotlib, ipywidgets, torch or any other layer of zerolib.
"""
