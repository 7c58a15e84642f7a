"""Does it fit? Fewest workers per stage, largest model per worker count.

A setting fits when the most-loaded worker's bytes (persistent model state plus any
``extra_bytes`` the caller adds, such as the working set) are at most the device capacity.
Per-worker bytes never rise with more workers and never fall with more parameters, so both
searches are vectorised bisections.
"""
from __future__ import annotations

import numpy as np

from zerolib.core.accounting import Layout, get_layout, model_state
from zerolib.core.devices import Device, get_device
from zerolib.core.inputs import (
    MAX_GPUS,
    MAX_PARAMS,
    broadcast,
    check_gpus,
    check_params,
    check_single,
    check_stage,
)


def _extra(extra_bytes) -> np.ndarray:
    extra = np.asarray(extra_bytes)
    if extra.dtype == bool or not np.issubdtype(extra.dtype, np.number):
        raise TypeError(f"extra_bytes must be a number of bytes, got {extra_bytes!r}")
    if not np.all(np.isfinite(extra)) or np.any(extra < 0):
        raise ValueError(f"extra_bytes must be finite and non-negative, got {extra_bytes!r}")
    return extra


def _scalar_or_array(result: np.ndarray, empty_as_none: bool):
    if result.ndim == 0:
        value = int(result)
        return None if (empty_as_none and value == 0) else value
    return result


def fits(params, gpus, stage, layout: "str | Layout" = "mixed-adam",
         device: "str | Device" = "a100-80gb", extra_bytes=0):
    """True where per-worker bytes (+ ``extra_bytes``) are at most the device capacity."""
    capacity = get_device(device).capacity
    total = model_state(params, gpus, stage, layout).total + _extra(extra_bytes)
    result = total <= capacity
    return bool(result) if result.ndim == 0 else result


def fewest_gpus(params, stage, layout: "str | Layout" = "mixed-adam",
                device: "str | Device" = "a100-80gb", extra_bytes=0, max_gpus: int = MAX_GPUS):
    """Smallest worker count at which ``stage`` fits, searched up to ``max_gpus``.

    Scalars give an int, or None when no count up to ``max_gpus`` fits (stages 0-2 never fit
    when their replicated categories alone exceed the device). Arrays give int64 arrays with
    0 where nothing fits.
    """
    layout, device = get_layout(layout), get_device(device)
    max_gpus = check_single(max_gpus, check_gpus, "max_gpus")
    params, stage, extra = broadcast(params=check_params(params), stage=check_stage(stage),
                                     extra_bytes=_extra(extra_bytes))

    def ok(gpus):
        return model_state(params, gpus, stage, layout).total + extra <= device.capacity

    low = np.ones(params.shape, dtype=np.int64)
    high = np.full(params.shape, max_gpus, dtype=np.int64)
    feasible = ok(high)
    while np.any(low < high):
        mid = (low + high) // 2
        good = ok(mid)
        high = np.where(good, mid, high)
        low = np.where(good, low, mid + 1)
    return _scalar_or_array(np.where(feasible, low, 0), empty_as_none=True)


def largest_model(gpus, stage, layout: "str | Layout" = "mixed-adam",
                  device: "str | Device" = "a100-80gb", extra_bytes=0):
    """Largest parameter count whose per-worker bytes fit (0 if not even one parameter fits)."""
    layout, device = get_layout(layout), get_device(device)
    gpus, stage, extra = broadcast(gpus=check_gpus(gpus), stage=check_stage(stage),
                                   extra_bytes=_extra(extra_bytes))

    def ok(params):
        return model_state(params, gpus, stage, layout).total + extra <= device.capacity

    low = np.zeros(gpus.shape, dtype=np.int64)       # fits (0 parameters trivially)
    high = np.full(gpus.shape, MAX_PARAMS, dtype=np.int64)
    top_fits = ok(high)
    while np.any(low < high):
        mid = (low + high + 1) // 2
        good = ok(np.maximum(mid, 1))
        low = np.where(good, mid, low)
        high = np.where(good, high, mid - 1)
    result = np.where(top_fits, MAX_PARAMS, low)
    return _scalar_or_array(result, empty_as_none=False)
