"""zerolib: per-GPU training memory under the ZeRO stages, exact to the byte.

Every number and figure of the chapter in ``notebooks/`` comes from here. The most used
functions are importable from the top level (loaded on first use, so ``import zerolib`` stays
light); each lives in the module that owns it:

>>> from zerolib import model_state
>>> int(model_state(1_000_000_000, 4, 3).total)   # bytes per worker, ZeRO stage 3
4000000000
"""
from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    "model_state": "core.accounting", "get_layout": "core.accounting", "Layout": "core.accounting",
    "LAYOUTS": "core.accounting", "get_device": "core.devices", "DEVICES": "core.devices",
    "fits": "core.feasibility", "fewest_gpus": "core.feasibility", "largest_model": "core.feasibility",
    "volume": "core.communication", "memory_table": "core.tables", "estimate": "core.estimate",
    "parse_count": "core.units", "to_unit": "core.units", "GB": "core.units", "GiB": "core.units",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):  # PEP 562: import the owning module only when a name is used
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'zerolib' has no attribute {name!r}")
