"""The run file: a :class:`~zerolib.core.run.Run` written in TOML, and read back.

One table per noun (``[model]``, ``[cluster]``, ``[parallel]``, ``[trainer]`` with
``[trainer.buckets]``, ``[batch]``), each field under its name in the API; a field left out keeps
its default. ``[model]`` holds ``preset = "llama-2-7b"``, ``params = 7000000000`` (a bare count),
``config = "path/to/config.json"`` (read as ``zerolib estimate --config`` reads it, relative to
the run file), ``megatron_args = "--num-layers 32 ..."``, or the architecture's own fields. The
writer gives every field that differs from its default, and the model whole, so a file answers
alike on any machine. ``docs/run-file.md`` documents every field.

Reading is bounded: at most :data:`MAX_RUN_FILE_BYTES` bytes, nesting that the parser can hold,
and every refusal is one ``ValueError`` naming the file and the field.
"""
from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path

from zerolib.core.catalogue.models import TransformerConfig, get_model
from zerolib.core.run import NOUNS, Buckets, Run

if sys.version_info >= (3, 11):
    import tomllib
else:   # pragma: no cover - Python 3.10 reads TOML with tomli (a dependency there)
    import tomli as tomllib

MAX_RUN_FILE_BYTES = 1_000_000
MODEL_SOURCES = ("preset", "params", "config", "megatron_args")


def read_run(path: str | Path) -> Run:
    """The run a file holds (see the module doc); one ValueError naming the file and the field
    for anything it cannot take."""
    path = Path(path)
    try:
        if not path.is_file():
            raise ValueError(f"run file {path} is not a file")
        if path.stat().st_size > MAX_RUN_FILE_BYTES:
            raise ValueError(f"run file {path} is larger than {MAX_RUN_FILE_BYTES:,} bytes")
        with path.open("rb") as handle:
            raw = handle.read(MAX_RUN_FILE_BYTES + 1)
    except OSError as error:
        raise ValueError(f"run file {path} cannot be read ({error.strerror or error})") from None
    if len(raw) > MAX_RUN_FILE_BYTES:
        raise ValueError(f"run file {path} is larger than {MAX_RUN_FILE_BYTES:,} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"run file {path} is not UTF-8 text") from None
    return run_from_toml(text, where=f"run file {path}", folder=path.parent)


def run_from_toml(text: str, where: str = "the run", folder: Path | None = None) -> Run:
    """:func:`read_run` of TOML text; ``folder`` is where a ``[model] config`` path is found."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_RUN_FILE_BYTES:
        raise ValueError(f"{where} is larger than {MAX_RUN_FILE_BYTES:,} bytes")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{where} is not TOML: {error}") from None
    except (RecursionError, MemoryError):
        raise ValueError(f"{where} nests deeper than a run file can") from None
    return run_from_tables(data, where, folder)


def run_from_tables(data: Mapping, where: str = "the run", folder: Path | None = None) -> Run:
    """A run from its tables (a parsed run file, or :meth:`Run.as_dict`)."""
    unknown = [key for key in data if key not in ("model", *NOUNS)]
    if unknown:
        raise ValueError(f"{where}: no table {unknown[0]!r} (a run has model, {', '.join(NOUNS)})")
    if "model" not in data or not isinstance(data["model"], Mapping):
        raise ValueError(f"{where}: [model] is missing (preset, params, config, megatron_args, "
                         "or the architecture's fields)")
    try:
        model = _model_of(data["model"], folder)
        nouns = {}
        for name, kind in NOUNS.items():
            table = data.get(name, {})
            if not isinstance(table, Mapping):
                raise ValueError(f"{name} must be a table of fields")
            table = dict(table)
            if name == "trainer" and "buckets" in table:
                if not isinstance(table["buckets"], Mapping):
                    raise ValueError("trainer.buckets must be a table of fields")
                known = {f.name for f in fields(Buckets)}
                bad = [key for key in table["buckets"] if key not in known]
                if bad:
                    raise ValueError(f"trainer.buckets has no field {bad[0]!r}")
                table["buckets"] = Buckets(**table["buckets"])
            if name == "trainer" and isinstance(table.get("overlap"), str):
                from zerolib.core.step.engines import get_engine, overlap_rules
                rules = overlap_rules(get_engine(table.get("engine", "deepspeed")))
                if table["overlap"] not in rules:
                    raise ValueError(f"trainer.overlap must be one of {', '.join(rules)}, got "
                                     f"{table['overlap']!r}")
                table["overlap"] = rules[table["overlap"]]
            known = {f.name for f in fields(kind)}
            bad = [key for key in table if key not in known]
            if bad:
                raise ValueError(f"{name} has no field {bad[0]!r} (its fields: "
                                 f"{', '.join(sorted(known))})")
            nouns[name] = kind(**table)
        return Run(model, **nouns)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{where}: {error}") from None


def _model_of(table: Mapping, folder: Path | None) -> TransformerConfig | int:
    sources = [key for key in MODEL_SOURCES if key in table]
    if len(sources) > 1:
        raise ValueError(f"model gives {' and '.join(sources)}: give one")
    if sources:
        source = sources[0]
        if len(table) > 1:
            other = next(key for key in table if key != source)
            raise ValueError(f"model.{other} cannot stand beside model.{source}")
        value = table[source]
        if source == "preset":
            return get_model(value)
        if source == "params":
            return value
        if not isinstance(value, str):
            raise ValueError(f"model.{source} must be text")
        if source == "config":
            from zerolib.core.catalogue.hf_config import model_from_config
            path = Path(value)
            return model_from_config(path if path.is_absolute() or folder is None else folder / path)
        from zerolib.core.catalogue.megatron_args import model_from_megatron_args
        return model_from_megatron_args(value)
    known = {f.name for f in fields(TransformerConfig)}
    bad = [key for key in table if key not in known]
    if bad:
        raise ValueError(f"model has no field {bad[0]!r} (give preset, params, config, "
                         f"megatron_args, or the architecture's fields)")
    return TransformerConfig(**table)
