"""Validate what callers pass in, so no bad value turns into a silent wrong number.

Each checker accepts a scalar or an array-like and returns an int64 ndarray (or a float for
widths). Errors name the argument and say what is allowed.
"""
from __future__ import annotations

import numbers

import numpy as np

# Largest accepted parameter count and worker count: far beyond any real model or cluster,
# small enough that bytes stay exact in int64 (params * 64-byte widths * 3 categories).
MAX_PARAMS = 10**15
MAX_GPUS = 2**24
MAX_WIDTH = 64  # bytes per parameter in one category


def _as_array(value, name: str) -> np.ndarray:
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be a number or an array of numbers, got a string {value!r}")
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as error:  # ragged lists and the like
        raise TypeError(f"{name} must be a number or an array of numbers ({error})") from None
    if array.dtype == object and all(isinstance(v, int) for v in array.ravel()):
        raise ValueError(f"{name} is too large for exact int64 arithmetic, got {value!r}")
    if array.size == 0:
        raise ValueError(f"{name} must not be empty")
    if array.dtype == bool or any(isinstance(v, (bool, np.bool_)) for v in np.ravel(array)[:1]):
        raise TypeError(f"{name} must be a number, not a boolean")
    if not (np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)):
        raise TypeError(f"{name} must be numeric, got {array.dtype} values")
    return array


def _whole_in_range(value, name: str, low: int, high: int, allowed: str) -> np.ndarray:
    """Whole numbers in [low, high] as int64; any other value names what is allowed."""
    array = _as_array(value, name)
    if np.issubdtype(array.dtype, np.floating) and (
        not np.all(np.isfinite(array)) or np.any(array != np.floor(array))
    ):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    if np.issubdtype(array.dtype, np.floating) and np.any(np.abs(array) > 2**62):
        raise ValueError(f"{name} must be at most {high:.0e}, got {value!r}")
    array = array.astype(np.int64, copy=False)
    if np.any(array < low):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    if np.any(array > high):
        raise ValueError(f"{name} must be at most {high:.0e}, got {value!r}")
    return array


def check_params(value, name: str = "params") -> np.ndarray:
    """Parameter counts: whole, positive, finite, at most 10**15."""
    return _whole_in_range(value, name, 1, MAX_PARAMS, "a positive whole parameter count")


def check_gpus(value, name: str = "gpus") -> np.ndarray:
    """Worker counts: positive integers (not booleans, not fractions)."""
    return _whole_in_range(value, name, 1, MAX_GPUS, "a positive whole number of workers")


def check_stage(value, name: str = "stage") -> np.ndarray:
    """ZeRO stages: 0 (plain data parallelism) to 3."""
    array = _whole_in_range(value, name, 0, 2**62, "0, 1, 2 or 3")
    if np.any(array > 3):
        raise ValueError(f"{name} must be 0, 1, 2 or 3, got {value!r}")
    return array


def check_positive_int(value, name: str) -> int:
    """A single positive integer (a micro-batch, a sequence length...)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a positive whole number, got {value!r}")
    if not np.isfinite(value) or value != int(value) or value < 1:
        raise ValueError(f"{name} must be a positive whole number, got {value!r}")
    return int(value)


def check_width(value, name: str) -> float:
    """Bytes per parameter of one category: finite, non-negative, a whole number of bits."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number of bytes per parameter, got {value!r}")
    if not np.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite, non-negative number of bytes, got {value!r}")
    if value > MAX_WIDTH:
        raise ValueError(f"{name} must be at most {MAX_WIDTH} bytes per parameter, got {value!r}")
    if value * 8 != round(value * 8):
        raise ValueError(f"{name} must be a whole number of bits (a multiple of 0.125 bytes), got {value!r}")
    return float(value)
