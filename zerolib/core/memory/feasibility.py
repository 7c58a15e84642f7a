"""Does the model state fit? Fewest workers per stage, largest model per worker count.

These judge **persistent model state** (plus any ``extra_bytes`` the caller adds) against the
device: "model state fits" is not "the run fits", which also needs the working set
(:func:`zerolib.core.memory.working_set.peak_fits`). A setting fits when the most-loaded worker's
bytes are at most the device capacity. Per-worker bytes never rise with more workers and never
fall with more parameters, so both searches are vectorised bisections
(:mod:`zerolib.core.intmath`).
"""
from __future__ import annotations

import numpy as np

from zerolib.core.catalogue.devices import Device, get_device
from zerolib.core.inputs import (
    MAX_BYTES,
    MAX_GPUS,
    MAX_PARAMS,
    broadcast,
    check_gpus,
    check_params,
    check_single,
    check_stage,
    echo,
)
from zerolib.core.intmath import first_true, last_true
from zerolib.core.memory.accounting import Layout, get_layout, model_state


def check_extra_bytes(extra_bytes) -> np.ndarray:
    """Bytes added to the model state: whole, 0 to :data:`MAX_BYTES`, as int64."""
    try:
        extra = np.asarray(extra_bytes)
    except (TypeError, ValueError):   # ragged lists and the like
        raise TypeError(f"extra_bytes must be a number of bytes or an array of them, got "
                        f"{echo(extra_bytes)}") from None
    if extra.size == 0:   # else it would broadcast the other arguments away
        raise ValueError("extra_bytes must not be empty: a number of bytes, or an array of them")
    if extra.dtype == bool or not np.issubdtype(extra.dtype, np.number):
        raise TypeError(f"extra_bytes must be a number of bytes, got {echo(extra_bytes)}")
    if not np.all(np.isfinite(extra)) or np.any(extra < 0) or np.any(extra != np.floor(extra)):
        raise ValueError(f"extra_bytes must be whole, finite and non-negative, got {echo(extra_bytes)}")
    if np.any(extra > MAX_BYTES):
        raise ValueError(f"extra_bytes must be at most {MAX_BYTES:,}, got {echo(extra_bytes)}")
    return extra.astype(np.int64)


def _scalar_or_array(result: np.ndarray, empty_as_none: bool):
    if result.ndim == 0:
        value = int(result)
        return None if (empty_as_none and value == 0) else value
    return result


def model_state_fits(params, gpus, stage, layout: str | Layout = "mixed-adam",
                     device: str | Device = "a100-80gb", extra_bytes=0):
    """True where per-worker model state (+ ``extra_bytes``) is at most the device capacity."""
    capacity = get_device(device).capacity
    result = model_state(params, gpus, stage, layout).total + check_extra_bytes(extra_bytes) <= capacity
    return bool(result) if result.ndim == 0 else result


def fewest_gpus(params, stage, layout: str | Layout = "mixed-adam",
                device: str | Device = "a100-80gb", extra_bytes=0, max_gpus: int = MAX_GPUS):
    """Smallest worker count at which the model state of ``stage`` (+ ``extra_bytes``) fits,
    searched up to ``max_gpus``.

    Scalars give an int, or None when no count up to ``max_gpus`` fits (stages 0-2 never fit
    when their replicated categories alone exceed the device). Arrays give int64 arrays with
    0 where nothing fits.
    """
    layout, device = get_layout(layout), get_device(device)
    max_gpus = check_single(max_gpus, check_gpus, "max_gpus")
    params, stage, extra = broadcast(params=check_params(params), stage=check_stage(stage),
                                     extra_bytes=check_extra_bytes(extra_bytes))

    def ok(gpus):
        return model_state(params, gpus, stage, layout).total + extra <= device.capacity

    found = first_true(ok, np.ones(params.shape, dtype=np.int64), max_gpus)
    return _scalar_or_array(np.where(found > max_gpus, 0, found), empty_as_none=True)


def largest_model(gpus, stage, layout: str | Layout = "mixed-adam",
                  device: str | Device = "a100-80gb", extra_bytes=0):
    """Largest parameter count whose per-worker model state (+ ``extra_bytes``) fits (0 if not
    even one parameter fits; at most 10**15)."""
    layout, device = get_layout(layout), get_device(device)
    gpus, stage, extra = broadcast(gpus=check_gpus(gpus), stage=check_stage(stage),
                                   extra_bytes=check_extra_bytes(extra_bytes))

    def ok(params):
        return model_state(params, gpus, stage, layout).total + extra <= device.capacity

    found = last_true(ok, np.ones(gpus.shape, dtype=np.int64), MAX_PARAMS)
    return _scalar_or_array(found, empty_as_none=False)
