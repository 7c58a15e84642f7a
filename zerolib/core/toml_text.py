"""TOML text from plain values: what a run file is written with (:meth:`zerolib.core.run.Run.to_toml`).
Reading is tomllib's; writing the few shapes a run holds needs no library."""
from __future__ import annotations

import json
import math
from collections.abc import Mapping


def toml_value(value) -> str:
    """One TOML value: strings quoted (JSON's escapes are TOML's), numbers exact, lists inline."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"a run file cannot hold {value!r}")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"a run file cannot hold {type(value).__name__}")


def toml_table(name: str, values: Mapping) -> list[str]:
    """A ``[name]`` table: one line per value that is not None."""
    return [f"[{name}]", *(f"{key} = {toml_value(value)}" for key, value in values.items()
                           if value is not None)]
