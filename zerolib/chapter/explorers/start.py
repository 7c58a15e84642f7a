"""Where an explorer starts: its own defaults, then a run's fields, then the fields named.

An explorer takes the run it should start at (``WillItFitExplorer(run)``), or the fields of one
by their flat names (``WillItFitExplorer(model="llama-2-7b", gpus=8)``, the names of
:data:`zerolib.core.run.FIELDS`), as ``estimate`` does; its controls then hold those values.
"""
from __future__ import annotations

from collections.abc import Mapping

from zerolib.core.catalogue.models import MODELS
from zerolib.core.run import FIELDS, Run


def _field(run: Run, name: str):
    if name == "model":
        config = run.config
        if config is None:
            raise ValueError("an explorer needs a model's architecture, not a bare parameter count")
        return config.name if MODELS.get(config.name) == config else config
    if name == "seq_len":
        return run.seq_len
    if name == "links":
        return run.cluster.link
    value = getattr(run, FIELDS[name][0])
    for part in FIELDS[name][1:]:
        value = getattr(value, part)
    return value


def starting_values(defaults: Mapping, run: Run | None, fields: Mapping) -> dict:
    """The explorer's starting value of each of its ``defaults``' names: a field named in
    ``fields`` wins, then the ``run``'s (where it holds one: None leaves the default), then the
    default."""
    unknown = [name for name in fields if name not in defaults]
    if unknown:
        raise TypeError(f"the explorer has no setting {unknown[0]!r} (it takes "
                        f"{', '.join(defaults)}, or a run)")
    values = dict(defaults)
    if run is not None:
        if not isinstance(run, Run):
            raise TypeError(f"run must be a Run, got {type(run).__name__}")
        for name in defaults:
            if name == "model" or name in FIELDS or name in ("seq_len", "links"):
                value = _field(run, name)
                if value is not None:
                    values[name] = value
    values.update(fields)
    return values
