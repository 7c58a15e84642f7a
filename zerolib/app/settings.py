"""What the engineer's page was asked, and its round trip through a URL query.

:class:`Settings` holds every input of the page; :func:`to_query` writes it as a URL query
(every field, so a link reopens the same answers even if a default changes later) and
:func:`from_query` reads one back, keeping the defaults for what is missing and saying in one
line per field what it could not read. An uploaded ``config.json`` travels inside the query,
compressed (zlib, then URL-safe base64), so a shared link carries the model too.

A query is bounded before it is read: at most :data:`MAX_QUERY_CHARS` characters and
:data:`MAX_QUERY_FIELDS` fields; its ``config`` unpacks to at most
:data:`~zerolib.core.catalogue.hf_config.MAX_CONFIG_BYTES` (decompressed in steps, so a small link
cannot unpack to gigabytes) and is read as an uploaded file is
(:func:`~zerolib.core.catalogue.hf_config.config_from_text`).
"""
from __future__ import annotations

import base64
import binascii
import json
import zlib
from dataclasses import dataclass, fields, replace
from urllib.parse import parse_qsl, urlencode

from zerolib.core.catalogue.devices import DEVICES
from zerolib.core.catalogue.hf_config import MAX_CONFIG_BYTES, config_from_text
from zerolib.core.catalogue.models import MODELS, TransformerConfig
from zerolib.core.catalogue.nodes import NODES
from zerolib.core.defaults import DEFAULT_ENGINE, MAX_RUN_TOKENS
from zerolib.core.inputs import MAX_GPUS, echo
from zerolib.core.memory.accounting import LAYOUTS
from zerolib.core.memory.model_parallel import MAX_MICRO_BATCHES
from zerolib.core.memory.working_set import MAX_MICRO_BATCH, MAX_SEQ_LEN
from zerolib.core.parse import parse_whole
from zerolib.core.run import Run

# Devices the page offers: those the planner can place without a links entry (each names the
# node it usually comes in).
PLANNED_DEVICES = tuple(name for name, device in DEVICES.items() if device.node is not None)
MAX_TOKENS = MAX_RUN_TOKENS  # a run's tokens (zerolib.core.defaults): one bound everywhere
TOKEN_EXAMPLE = "a count like 2T, 15.6T, 2e12 or 2,000,000,000,000"
USUAL_NODE = ""              # the links entry meaning "the node the device usually comes in"
# Keys a query may carry besides the settings: the server's access token.
IGNORED_KEYS = ("token",)
# A link this page writes is its 13 fields, the config packed (1 MB of JSON packs to well under
# 1.4 MB of text); anything longer or with more fields is not one of its links.
MAX_QUERY_CHARS = 2_000_000
MAX_QUERY_FIELDS = 64
MAX_NAME_CHARS = 100       # a model's name, as shown in texts and titles
# Set by `zerolib app` in the server's environment, which Voila hands to each page's kernel:
# the seconds without activity after which the server shuts the page's kernel down.
IDLE_VARIABLE = "ZEROLIB_APP_IDLE_SECONDS"


@dataclass(frozen=True)
class Settings:
    """The page's inputs. ``config`` is an uploaded ``config.json`` as compact JSON text (it wins
    over ``model``, a preset's name) and ``config_name`` the name it is shown under; ``links`` is
    a node's name, or :data:`USUAL_NODE`; ``engine`` an engine's name, or "" for the step
    model's own; ``tokens`` the run's training tokens."""

    model: str = "llama-2-7b"
    config: str = ""
    config_name: str = ""
    device: str = "h100-80gb"
    gpus: int = 64
    gpus_per_node: int = 8
    links: str = USUAL_NODE
    seq_len: int = 4096
    global_batch: int = 1024
    micro_batch: int = 1
    layout: str = "mixed-adam"
    engine: str = ""
    tokens: int = 2 * 10**12


DEFAULTS = Settings()
_WHOLE = {"gpus": MAX_GPUS, "gpus_per_node": MAX_GPUS, "seq_len": MAX_SEQ_LEN,
          "global_batch": MAX_MICRO_BATCHES, "micro_batch": MAX_MICRO_BATCH, "tokens": MAX_TOKENS}
_CHOICES = {"model": tuple(MODELS), "device": PLANNED_DEVICES, "links": (USUAL_NODE, *NODES),
            "layout": tuple(LAYOUTS)}
FIELDS = tuple(f.name for f in fields(Settings))


def pack_config(text: str) -> str:
    """A config's JSON text, compressed for a URL: zlib, then URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(zlib.compress(text.encode("utf-8"), 9)).decode("ascii").rstrip("=")


def unpack_config(packed: str, what: str = "config") -> str:
    """:func:`pack_config` undone; ValueError when ``packed`` is not such a text or unpacks to
    more than :data:`MAX_CONFIG_BYTES` (found out without unpacking more than that)."""
    not_packed = (f"{what} in the address is not a packed "
                  f"{'config.json' if what == 'config' else 'run file'}")
    try:
        raw = base64.urlsafe_b64decode(packed + "=" * (-len(packed) % 4))
        unpacker = zlib.decompressobj()
        data = unpacker.decompress(raw, MAX_CONFIG_BYTES + 1)
    except (binascii.Error, zlib.error, ValueError):
        raise ValueError(not_packed) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ValueError(f"{what} in the address unpacks to more than {MAX_CONFIG_BYTES:,} bytes; "
                         f"a {'config.json' if what == 'config' else 'run file'} is a few kilobytes")
    if not unpacker.eof:
        raise ValueError(not_packed)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(not_packed) from None


def model_name(text: str, field: str = "config_name") -> str:
    """A model's name as given (a file's name, a query's ``config_name``): printable, at most
    :data:`MAX_NAME_CHARS` characters; ValueError naming ``field`` otherwise."""
    if not text.isprintable() or len(text) > MAX_NAME_CHARS:
        raise ValueError(f"{field} must be a name of at most {MAX_NAME_CHARS} printable "
                         f"characters, got {echo(text)}")
    return text


def compact_config(data: dict) -> str:
    """One spelling per config: sorted keys, no spaces (the same file gives the same link)."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def run_of(settings: Settings, model: TransformerConfig) -> Run:
    """The run the page's settings describe, for ``model`` (the preset or the upload, read):
    what the page answers for, its download and its share link carry."""
    return Run.of(model, settings.gpus, gpus_per_node=settings.gpus_per_node,
                  device=settings.device, link=settings.links or None, seq_len=settings.seq_len,
                  global_batch=settings.global_batch, micro_batch=settings.micro_batch,
                  layout=settings.layout, engine=settings.engine or DEFAULT_ENGINE,
                  tokens=settings.tokens)


def settings_of(run: Run, base: Settings = DEFAULTS) -> dict:
    """The page's fields a run gives (its model only when a preset: an upload travels as its
    config); ValueError naming what the page cannot show."""
    c, b, t = run.cluster, run.batch, run.trainer
    if c.device is None or not isinstance(c.device, str):
        raise ValueError("run in the address names no catalogue device")
    values = {"gpus": c.gpus, "device": c.device, "links": c.link or USUAL_NODE,
              "seq_len": run.seq_len, "micro_batch": b.micro_batch, "layout": t.layout_name,
              # "": the page's default engine entry, the step model's own
              "engine": "" if t.engine == DEFAULT_ENGINE or not isinstance(t.engine, str) else t.engine}
    if c.gpus_per_node is not None:
        values["gpus_per_node"] = c.gpus_per_node
    if b.global_batch is not None:
        values["global_batch"] = b.global_batch
    if b.tokens is not None:
        values["tokens"] = b.tokens
    if run.config is not None and MODELS.get(run.config.name) == run.config:
        values["model"] = run.config.name
    for key, value in values.items():   # what the page's own controls can show
        if key in _CHOICES and value not in _CHOICES[key]:
            raise ValueError(f"run in the address: {key} must be one of "
                             f"{', '.join(v or 'the usual node' for v in _CHOICES[key])}, got {echo(value)}")
    return values


def to_query(settings: Settings, run: Run | None = None) -> str:
    """The share link's query: with ``run``, the run file packed (``run=``) and the upload, if
    any, beside it (``config=``, ``config_name=``); without, every field as ``name=value``, in
    the dataclass's order, the config packed."""
    if run is not None:
        pairs = [("run", pack_config(run.to_toml()))]
        if settings.config:
            pairs += [("config", pack_config(settings.config)), ("config_name", settings.config_name)]
        return urlencode(pairs)
    pairs = []
    for name in FIELDS:
        value = getattr(settings, name)
        if name == "config":
            value = pack_config(value) if value else ""
        pairs.append((name, str(value)))
    return urlencode(pairs)


def from_query(query: str, base: Settings = DEFAULTS) -> tuple[Settings, tuple[str, ...]]:
    """The settings a query names (``base`` for what it leaves out) and one line per value it
    could not take (that field keeps ``base``'s value). A leading ``?`` is allowed; a query
    beyond :data:`MAX_QUERY_CHARS` or :data:`MAX_QUERY_FIELDS` is one line and ``base``."""
    values, problems, unknown = {}, [], []
    if len(query) > MAX_QUERY_CHARS:
        return base, (f"the address is {len(query):,} characters long; the page reads addresses "
                      f"of up to {MAX_QUERY_CHARS:,}",)
    try:
        pairs = parse_qsl(query.lstrip("?"), keep_blank_values=True,
                          max_num_fields=MAX_QUERY_FIELDS)
    except ValueError:
        return base, (f"the address has more than {MAX_QUERY_FIELDS} fields; the page takes "
                      f"{len(FIELDS)} ({', '.join(FIELDS)})",)
    for key, text in pairs:
        if key in IGNORED_KEYS:
            continue
        if key == "run":   # a run file: its fields, then any field named beside it
            try:
                values = {**_run_fields(text, base), **values}
            except (ValueError, TypeError) as error:
                problems.append(str(error))
            continue
        if key not in FIELDS:
            unknown.append(echo(key))
            continue
        try:
            values[key] = _read(key, text)
        except (ValueError, TypeError) as error:
            problems.append(str(error))
    if unknown:   # one line for all of them
        more = f" (and {len(unknown) - 3} more)" if len(unknown) > 3 else ""
        problems.append(f"the address names {', '.join(unknown[:3])}{more}, which the page does "
                        f"not take (it takes {', '.join(FIELDS)})")
    if values.get("config") == "":
        values["config_name"] = ""
    return replace(base, **values), tuple(problems)


def _run_fields(text: str, base: Settings) -> dict:
    """The page's fields of a packed run file (read as ``--run`` reads a file: bounded)."""
    from zerolib.core.run_file import run_from_toml
    run = run_from_toml(unpack_config(text, "run"), where="run in the address")
    return settings_of(run, base)


def _read(key: str, text: str):
    if key in _WHOLE:
        example = TOKEN_EXAMPLE if key == "tokens" else "a whole number like 64, 4096, 1e3 or 4K"
        return parse_whole(text, key, maximum=_WHOLE[key], example=example)
    if key in _CHOICES:
        if text not in _CHOICES[key]:
            allowed = ", ".join(value or '"" (the device\'s usual node)' for value in _CHOICES[key])
            raise ValueError(f"{key} must be one of {allowed}, got {echo(text)}")
        return text
    if key == "config":
        if not text:
            return ""
        # Read as an upload is (bounded depth and values), kept in the one compact spelling.
        return compact_config(config_from_text(unpack_config(text), "config in the address"))
    if key == "config_name":
        return model_name(text)
    if len(text) > MAX_NAME_CHARS:    # engine: its name is checked where it is used
        raise ValueError(f"{key} must be at most {MAX_NAME_CHARS} characters, got {echo(text)}")
    return text
