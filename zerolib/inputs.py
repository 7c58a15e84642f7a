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


def _whole(array: np.ndarray, name: str, what: str) -> np.ndarray:
    if np.issubdtype(array.dtype, np.floating):
        if not np.all(np.isfinite(array)):
            raise ValueError(f"{name} must be finite ({what}), got NaN or infinity")
        if np.any(array != np.floor(array)):
            raise ValueError(f"{name} must be whole numbers ({what})")
        if np.any(np.abs(array) > 2**62):
            raise ValueError(f"{name} is too large ({what})")
    return array.astype(np.int64, copy=False)


def check_params(value, name: str = "params") -> np.ndarray:
    """Parameter counts: whole, positive, finite, at most 10**15."""
    array = _whole(_as_array(value, name), name, "a positive whole parameter count")
    if np.any(array <= 0):
        raise ValueError(f"{name} must be positive, got {array[array <= 0].ravel()[0]}")
    if np.any(array > MAX_PARAMS):
        raise ValueError(f"{name} must be at most {MAX_PARAMS:.0e}")
    return array


def check_gpus(value, name: str = "gpus") -> np.ndarray:
    """Worker counts: positive integers (not booleans, not fractions)."""
    array = _as_array(value, name)
    if np.issubdtype(array.dtype, np.floating) and (
        not np.all(np.isfinite(array)) or np.any(array != np.floor(array))
    ):
        raise ValueError(f"{name} must be a positive whole number of workers, got {value!r}")
    array = array.astype(np.int64, copy=False)
    if np.any(array < 1):
        raise ValueError(f"{name} must be a positive whole number of workers, got {value!r}")
    if np.any(array > MAX_GPUS):
        raise ValueError(f"{name} must be at most {MAX_GPUS}")
    return array


def check_stage(value, name: str = "stage") -> np.ndarray:
    """ZeRO stages: 0 (plain data parallelism) to 3."""
    array = _as_array(value, name)
    if np.issubdtype(array.dtype, np.floating) and (
        not np.all(np.isfinite(array)) or np.any(array != np.floor(array))
    ):
        raise ValueError(f"{name} must be 0, 1, 2 or 3, got {value!r}")
    array = array.astype(np.int64, copy=False)
    if np.any((array < 0) | (array > 3)):
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
