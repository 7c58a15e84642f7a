"""What the engineer's page was asked, and its round trip through a URL query.

:class:`Settings` holds every input of the page; :func:`to_query` writes it as a URL query
(every field, so a link reopens the same answers even if a default changes later) and
:func:`from_query` reads one back, keeping the defaults for what is missing and saying in one
line per field what it could not read. An uploaded ``config.json`` travels inside the query,
compressed (zlib, then URL-safe base64), so a shared link carries the model too.
"""
from __future__ import annotations

import base64
import binascii
import json
import zlib
from dataclasses import dataclass, fields, replace
from urllib.parse import parse_qsl, urlencode

from zerolib.core.catalogue.devices import DEVICES
from zerolib.core.catalogue.models import MODELS
from zerolib.core.catalogue.nodes import NODES
from zerolib.core.inputs import MAX_GPUS, echo
from zerolib.core.memory.accounting import LAYOUTS
from zerolib.core.memory.model_parallel import MAX_MICRO_BATCHES
from zerolib.core.memory.working_set import MAX_MICRO_BATCH, MAX_SEQ_LEN
from zerolib.core.parse import parse_whole

# Devices the page offers: those the planner can place without a links entry (each names the
# node it usually comes in).
PLANNED_DEVICES = tuple(name for name, device in DEVICES.items() if device.node is not None)
MAX_TOKENS = 10**16          # ten quadrillion tokens: far above any published run
TOKEN_EXAMPLE = "a count like 2T, 15.6T, 2e12 or 2,000,000,000,000"
USUAL_NODE = ""              # the links entry meaning "the node the device usually comes in"
# Keys a query may carry besides the settings: the server's access token.
IGNORED_KEYS = ("token",)


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


def unpack_config(packed: str) -> str:
    """:func:`pack_config` undone; ValueError when ``packed`` is not such a text."""
    try:
        raw = base64.urlsafe_b64decode(packed + "=" * (-len(packed) % 4))
        return zlib.decompress(raw).decode("utf-8")
    except (binascii.Error, zlib.error, UnicodeDecodeError, ValueError):
        raise ValueError("config in the address is not a packed config.json") from None


def compact_config(data: dict) -> str:
    """One spelling per config: sorted keys, no spaces (the same file gives the same link)."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def to_query(settings: Settings) -> str:
    """Every field as ``name=value``, in the dataclass's order; the config packed."""
    pairs = []
    for name in FIELDS:
        value = getattr(settings, name)
        if name == "config":
            value = pack_config(value) if value else ""
        pairs.append((name, str(value)))
    return urlencode(pairs)


def from_query(query: str, base: Settings = DEFAULTS) -> tuple[Settings, tuple[str, ...]]:
    """The settings a query names (``base`` for what it leaves out) and one line per value it
    could not take (that field keeps ``base``'s value). A leading ``?`` is allowed."""
    values, problems = {}, []
    for key, text in parse_qsl(query.lstrip("?"), keep_blank_values=True):
        if key in IGNORED_KEYS:
            continue
        if key not in FIELDS:
            problems.append(f"the address names {echo(key)}, which the page does not take "
                            f"(it takes {', '.join(FIELDS)})")
            continue
        try:
            values[key] = _read(key, text)
        except (ValueError, TypeError) as error:
            problems.append(str(error))
    if values.get("config") == "":
        values["config_name"] = ""
    return replace(base, **values), tuple(problems)


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
        return unpack_config(text) if text else ""
    return text    # config_name, engine: checked where they are used
