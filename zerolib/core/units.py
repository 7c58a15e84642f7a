"""Units at the edge: bytes converted and formatted for display.

Everything inside zerolib is an integer number of bytes; these helpers are the only place
where GB (10**9, the chapter's unit) or GiB (2**30) appear. (Reading numbers people type is
:mod:`zerolib.core.parse`.)
"""
from __future__ import annotations

import math

import numpy as np

GB = 10**9
GiB = 2**30
UNITS = {"GB": GB, "GiB": GiB}

def check_unit(unit: str) -> int:
    """Bytes in one ``unit`` ("GB" or "GiB")."""
    if not isinstance(unit, str) or unit not in UNITS:
        raise ValueError(f"unit must be one of {', '.join(UNITS)}, got {unit!r}")
    return UNITS[unit]


def to_unit(n_bytes, unit: str = "GB"):
    """Convert bytes (scalar or array) to GB or GiB for display."""
    scale = check_unit(unit)
    if isinstance(n_bytes, (str, bytes)):
        raise TypeError(f"n_bytes must be a number of bytes or an array of them, got {n_bytes!r}")
    return np.asarray(n_bytes, dtype=float) / scale if np.ndim(n_bytes) else float(n_bytes) / scale


def format_bytes(n_bytes, unit: str = "GB", digits: int = 2) -> str:
    """``112000000000`` -> ``'112.00 GB'``."""
    return f"{to_unit(n_bytes, unit):,.{digits}f} {unit}"


def format_count(count: int) -> str:
    """``7000000000`` -> ``'7B'``; ``1500000000000`` -> ``'1.5T'`` (for labels)."""
    for suffix, scale in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if count >= scale:
            return f"{count / scale:g}{suffix}"
    return str(int(count))


def format_value(value: float) -> str:
    """Three significant digits for value labels: 1,120 / 293 / 17.5 / 4.19 / 0.25."""
    if not math.isfinite(value):
        return str(value)
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.2g}"


def format_relative(relative: float) -> str:
    """A relative difference for reading: '0%', '+0.0048%', '+0.12%', '-31.4%', '+262%'."""
    if not math.isfinite(relative):
        return str(relative)
    if relative == 0:
        return "0%"
    if abs(relative) < 0.01:  # two significant digits: a few bytes in 100 kB still show
        return f"{relative * 100:+.2g}%"
    if abs(relative) < 1:
        return f"{relative:+.1%}"
    return f"{relative:+.0%}"
