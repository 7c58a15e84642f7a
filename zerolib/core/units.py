"""Units at the edge: parsing human counts and converting bytes for display.

Everything inside zerolib is an integer number of bytes; these helpers are the only place
where GB (10**9, the chapter's unit) or GiB (2**30) appear.
"""
from __future__ import annotations

import math
import re

import numpy as np

from zerolib.core.inputs import MAX_PARAMS

GB = 10**9
GiB = 2**30
UNITS = {"GB": GB, "GiB": GiB}

# Suffixes for counts (decimal, as model cards use them: "7B" = 7 * 10**9).
_SUFFIXES = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}
_COUNT = re.compile(r"^\s*([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+-]?[0-9]+))?\s*([KMBGT]?)\s*$", re.I)


def parse_count(text: str | int | float, name: str = "params") -> int:
    """Parse a count such as ``7B``, ``350M``, ``1.5T``, ``7e9`` or ``7_000_000_000``.

    The text is parsed, never evaluated. The result must be a positive whole number.
    """
    if isinstance(text, bool):
        raise TypeError(f"{name} must be a count like 7B, 350M or 7e9, not a boolean")
    if isinstance(text, (int, np.integer)):
        value = int(text)
    elif isinstance(text, (float, np.floating)):
        if not math.isfinite(text) or text != int(text):
            raise ValueError(f"{name} must be a finite whole number, got {text!r}")
        value = int(text)
    elif isinstance(text, str):
        match = _COUNT.match(text.replace("_", "").replace(",", ""))
        if not match:
            raise ValueError(
                f"{name} must be a count like 7B, 350M, 1.5T, 7e9 or 7000000000, got {text!r}"
            )
        sign, mantissa, exponent, suffix = match.groups()
        # Exact decimal arithmetic: "1.5T" is 1500000000000, not a float approximation.
        whole, _, frac = mantissa.partition(".")
        digits = int((whole or "0") + frac) if (whole or frac) else 0
        if abs(int(exponent or 0)) > 30:
            raise ValueError(f"{name} must be at most {MAX_PARAMS:,}, got {text!r}")
        scale = _SUFFIXES[suffix.upper()] * 10 ** int(exponent or 0)
        numerator, denominator = digits * scale, 10 ** len(frac)
        if numerator % denominator:
            raise ValueError(f"{name} must be a whole number of parameters, got {text!r}")
        value = -(numerator // denominator) if sign == "-" else numerator // denominator
    else:
        raise TypeError(f"{name} must be a count like 7B or 7e9, got {type(text).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {text!r}")
    if value > MAX_PARAMS:
        raise ValueError(f"{name} must be at most {MAX_PARAMS:,}, got {text!r}")
    return value


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
