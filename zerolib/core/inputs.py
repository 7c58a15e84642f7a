"""Validate what callers pass in, so no bad value turns into a silent wrong number.

The array checkers accept a scalar or an array-like and return an int64 ndarray; the scalar
ones (a positive int, a width) return a Python number. Errors name the argument and say what
is allowed.
"""
from __future__ import annotations

import math
import numbers
import os
import stat

import numpy as np

from zerolib.core.defaults import MIN_MFU

# Largest accepted parameter count and worker count: far beyond any real model or cluster,
# small enough that bytes stay exact in int64 (params * 64-byte widths * 3 categories).
MAX_PARAMS = 10**15
MAX_ELEMENTS = MAX_PARAMS     # bucket sizes and live-parameter limits, in elements
MAX_GPUS = 2**24
MAX_WIDTH = 64  # bytes per parameter in one category
# Largest byte count accepted or produced anywhere (extra bytes, a reserve, a working set, a
# peak): 2**62, so that a sum of two such values still fits int64 exactly.
MAX_BYTES = 2**62
# Values in the broadcast of the array arguments of one call (:func:`broadcast`; and
# configurations in one plan):
# 10**7 keeps a call to seconds and its memory to about 80 MB per int64 array; model_state on
# 10**8 took 23 s and 3.1 GB.
MAX_ARRAY_SIZE = 10_000_000
MAX_FIGURE_POINTS = 4096  # GPU counts along the axis of a figure (one line per stage)
# Model sizes along the model-size figure's axis: a group of bars each, so 4,096 took 20 s to
# draw and could not be read; 64 draw in a few seconds.
MAX_FIGURE_SIZES = 64
STAGES = (0, 1, 2, 3)  # 0 = plain data parallelism, 1-3 = ZeRO stages


def _as_array(value, name: str) -> np.ndarray:
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be a number or an array of numbers, got a string {echo(value)}")
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as error:  # ragged lists and the like
        raise TypeError(f"{name} must be a number or an array of numbers ({error})") from None
    if array.dtype == object and all(isinstance(v, int) for v in array.ravel()):
        raise ValueError(f"{name} is too large for exact int64 arithmetic, got {echo(value)}")
    if array.size == 0:
        raise ValueError(f"{name} must not be empty")
    if array.dtype == bool or any(isinstance(v, (bool, np.bool_)) for v in np.ravel(array)[:1]):
        raise TypeError(f"{name} must be a number, not a boolean")
    if not (np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)):
        raise TypeError(f"{name} must be numeric, got {array.dtype} values")
    return array


def whole_in_range(value, name: str, low: int, high: int, allowed: str) -> np.ndarray:
    """Whole numbers in [low, high] as int64; any other value names what is allowed."""
    array = _as_array(value, name)
    if np.issubdtype(array.dtype, np.floating) and (
        not np.all(np.isfinite(array)) or np.any(array != np.floor(array))
    ):
        raise ValueError(f"{name} must be {allowed}, got {echo(value)}")
    # Compared before the cast, so no value can wrap around in int64.
    if np.any(array < low):
        raise ValueError(f"{name} must be {allowed}, got {echo(value)}")
    if np.any(array > high):
        raise ValueError(f"{name} must be at most {high:,}, got {echo(value)}")
    return array.astype(np.int64, copy=False)


def _finite(value: numbers.Real) -> bool:
    """Whether a real number is finite; Python ints of any size are (np.isfinite refuses big ones)."""
    return isinstance(value, numbers.Integral) or math.isfinite(value)


def check_params(value, name: str = "params") -> np.ndarray:
    """Parameter counts: whole, positive, finite, at most 10**15."""
    return whole_in_range(value, name, 1, MAX_PARAMS, "a positive whole parameter count")


def check_gpus(value, name: str = "gpus") -> np.ndarray:
    """Worker counts: positive integers (not booleans, not fractions)."""
    return whole_in_range(value, name, 1, MAX_GPUS, "a positive whole number of workers")


def check_stage(value, name: str = "stage") -> np.ndarray:
    """ZeRO stages: 0 (plain data parallelism) to 3."""
    array = _as_array(value, name)
    # Range comparisons are False for NaN and refuse infinities; floats must also be whole.
    # (Much faster than np.isin on large arrays.)
    valid = (array >= STAGES[0]) & (array <= STAGES[-1])
    if np.issubdtype(array.dtype, np.floating):
        valid &= array == np.floor(array)
    if not np.all(valid):
        raise ValueError(f"{name} must be 0, 1, 2 or 3, got {echo(value)}")
    return array.astype(np.int64, copy=False)


def check_flag(value, name: str) -> bool:
    """True or False (a numpy bool too); anything else is a TypeError naming ``name``."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {echo(value)}")
    return bool(value)


def check_count(value, name: str, maximum: int = MAX_BYTES) -> int:
    """A single whole number from 0 to ``maximum`` (a byte count, a bucket size...)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be a whole number, 0 or more, got {echo(value)}")
    if value > maximum:
        raise ValueError(f"{name} must be at most {maximum:,}, got {echo(value)}")
    return int(value)


def check_positive_int(value, name: str, maximum: int = MAX_BYTES) -> int:
    """A single whole number from 1 to ``maximum`` (a micro-batch, a sequence length...)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a positive whole number, got {echo(value)}")
    if not _finite(value) or value != int(value) or value < 1:
        raise ValueError(f"{name} must be a positive whole number, got {echo(value)}")
    if value > maximum:
        raise ValueError(f"{name} must be at most {maximum:,}, got {echo(value)}")
    return int(value)


def echo(value) -> str:
    """``repr(value)`` cut to 40 characters, for one-line error messages (a value too deep or
    too long for ``repr``, such as a hostile nested list, is named by its type)."""
    try:
        text = repr(value)
    except (RecursionError, ValueError):   # nesting beyond the stack; ints beyond 4,300 digits
        return f"a {type(value).__name__} too large to show"
    return text if len(text) <= 40 else text[:37] + "..."


_FILE_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
               (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
               (stat.S_ISSOCK, "a socket"))


def read_small_file(path, what: str, maximum: int) -> str:
    """The UTF-8 text of the regular file ``path`` of at most ``maximum`` bytes; a ValueError
    naming the path otherwise. The size is checked before anything is read, and a named pipe or
    a device (``/dev/zero``) is refused without reading from it. ``what`` names the file's kind
    in the message ("a config.json")."""
    try:
        # Non-blocking: opening a FIFO must not wait for a writer; fstat then judges the very
        # file opened (no race between a check and the open).
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as error:
        raise ValueError(f"{path}: {error.strerror or error}") from None
    with os.fdopen(descriptor, "rb") as handle:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            kind = next((words for test, words in _FILE_KINDS if test(info.st_mode)), "not a file")
            raise ValueError(f"{path}: {kind}, not a regular file; give {what}")
        if info.st_size > maximum:
            raise ValueError(f"{path}: {info.st_size:,} bytes; {what} is read up to {maximum:,} "
                             f"bytes")
        data = handle.read(maximum + 1)    # the file may have grown since fstat
    if len(data) > maximum:
        raise ValueError(f"{path}: more than {maximum:,} bytes; {what} is read up to {maximum:,} "
                         f"bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a UTF-8 text file") from None


def check_width(value, name: str) -> float:
    """Bytes per parameter of one category: finite, non-negative, a whole number of bits."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number of bytes per parameter, got {echo(value)}")
    if not _finite(value) or value < 0:
        raise ValueError(f"{name} must be a finite, non-negative number of bytes, got {echo(value)}")
    if value > MAX_WIDTH:
        raise ValueError(f"{name} must be at most {MAX_WIDTH} bytes per parameter, got {echo(value)}")
    if value * 8 != round(value * 8):
        raise ValueError(f"{name} must be a whole number of bits (a multiple of 0.125 bytes), got {echo(value)}")
    return float(value)


def check_sequence(values, name: str, allowed: str) -> tuple:
    """``values`` (a list, tuple, range or array) as a tuple; a single value or a string (whose
    letters would be read one by one) is a TypeError naming ``name`` and what it takes."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple, range, np.ndarray)):
        raise TypeError(f"{name} must be a list or tuple of {allowed}, got {echo(values)}")
    return tuple(values)


def check_single(value, check, name: str) -> int:
    """One number, validated by ``check`` (:func:`check_params`, :func:`check_gpus`...)."""
    array = check(value, name)
    if array.ndim != 0:
        raise TypeError(f"{name} must be a single number here, got an array")
    return int(array)


def broadcast(**arrays) -> list[np.ndarray]:
    """``np.broadcast_arrays`` of checked inputs; shapes that do not fit name the arguments."""
    try:
        shape = np.broadcast_shapes(*(np.shape(array) for array in arrays.values()))
    except ValueError:
        shapes = ", ".join(f"{name} {np.shape(array)}" for name, array in arrays.items())
        raise ValueError(f"{', '.join(arrays)} must broadcast together (numpy rules), "
                         f"got the shapes {shapes}") from None
    if math.prod(shape) > MAX_ARRAY_SIZE:   # before any array of that shape is built
        raise ValueError(f"{', '.join(arrays)} broadcast to {math.prod(shape):,} values, more "
                         f"than {MAX_ARRAY_SIZE:,} per call (split the work into several calls)")
    return np.broadcast_arrays(*arrays.values())


def check_whole(value, name: str, allowed: str, low: int = 1, high: int = MAX_GPUS) -> np.ndarray:
    """Whole numbers from ``low`` to ``high`` (a scalar or an array) as int64; ``allowed`` says
    in words what is, for the message (``"a positive whole number of micro-batches"``)."""
    return whole_in_range(value, name, low, high, allowed)


def check_bits(value, name: str = "bits") -> int:
    """A communicated width in bits: 1 to 8 x :data:`MAX_WIDTH` (wider would wrap in int64)."""
    return check_positive_int(value, name, 8 * MAX_WIDTH)


_INT64_MAX = 2**63 - 1


def check_one(value, check, name: str) -> int:
    """:func:`check_single` with a fast path for a plain Python int or float (one answer of
    the scalar API costs microseconds, not a trip through numpy): the same checks and the
    same messages as :func:`check_params` / :func:`check_gpus`; anything else goes through
    ``check``."""
    bounds = _SCALAR_BOUNDS.get(check)
    kind = type(value)
    if bounds is None or not (kind is int or kind is float) or (
            kind is int and not -_INT64_MAX <= value <= _INT64_MAX):
        return check_single(value, check, name)   # arrays, numpy scalars, huge ints, strings...
    low, high, allowed = bounds
    if kind is float and (not math.isfinite(value) or value != math.floor(value)):
        raise ValueError(f"{name} must be {allowed}, got {echo(value)}")
    if value < low:
        raise ValueError(f"{name} must be {allowed}, got {echo(value)}")
    if value > high:
        raise ValueError(f"{name} must be at most {high:,}, got {echo(value)}")
    return int(value)


_SCALAR_BOUNDS = {check_params: (1, MAX_PARAMS, "a positive whole parameter count"),
                  check_gpus: (1, MAX_GPUS, "a positive whole number of workers")}


def check_stages(stages, name: str = "stages") -> tuple[int, ...]:
    """ZeRO stages as a tuple of Python ints (:func:`check_stage`'s checks and messages; a
    tuple or list of plain ints skips numpy)."""
    if type(stages) in (tuple, list) and stages and all(
            type(s) is int and STAGES[0] <= s <= STAGES[-1] for s in stages):
        return tuple(stages)
    return tuple(check_stage(stages, name).ravel().tolist())


def check_mfu(value, name: str = "mfu") -> float:
    """A utilisation: a number above 0 and at most 1, and at least :data:`MIN_MFU`."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.floating)):
        raise TypeError(f"{name} must be a number above 0 and at most 1, got {value!r}")
    if not math.isfinite(value) or not 0 < value <= 1:
        raise ValueError(f"{name} must be a number above 0 and at most 1, got {value!r}")
    if value < MIN_MFU:
        raise ValueError(f"{name} must be at least {MIN_MFU:g} (0.1%), got {value!r}")
    return float(value)
