"""Reading numbers people type: one parser for whole numbers and counts, one for sizes in bytes.

Every count-like argument (parameters, GPUs, sequence length, micro-batch, bucket sizes, model
fields) goes through :func:`parse_whole`, so all accept the same spellings and fail with the
same kind of message:

- digits, optionally grouped in thousands by commas or underscores: ``7000000000``,
  ``7,000,000,000``, ``7_000_000_000`` (a separator anywhere else is refused: ``1,5B``);
- a decimal mantissa and exponent: ``7e9``, ``1.5e3``;
- a decimal suffix: ``K`` (10^3), ``M`` (10^6), ``B`` or ``G`` (10^9), ``T`` (10^12), e.g.
  ``7B``, ``1.5T``, ``4K``.

Text is parsed with exact decimal arithmetic, never evaluated and never through a float, so
every accepted value is exact however large. Only ASCII digits count (``٨`` is refused
everywhere). Sizes (:func:`parse_size`) take the same numbers followed by a unit: ``B``,
``KB``/``MB``/``GB``/``TB`` (powers of 10) or ``KiB``/``MiB``/``GiB``/``TiB`` (powers of 2).
"""
from __future__ import annotations

import math
import numbers
import re
from fractions import Fraction

import numpy as np

from zerolib.core.inputs import MAX_PARAMS, echo

MAX_TEXT_LENGTH = 100  # longer text is refused before any arithmetic

_DIGITS = r"(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]{1,3}(?:_[0-9]{3})+|[0-9]+)"
_NUMBER = rf"(?P<sign>[+-]?)(?P<whole>{_DIGITS})?(?:\.(?P<fraction>[0-9]*))?(?:[eE](?P<exponent>[+-]?[0-9]{{1,4}}))?"
_COUNT = re.compile(rf"^\s*{_NUMBER}\s*(?P<suffix>[KMBGT]?)\s*$", re.IGNORECASE | re.ASCII)
_SIZE = re.compile(rf"^\s*{_NUMBER}\s*(?P<unit>[KMGT]i?B|B)?\s*$", re.ASCII)

COUNT_SUFFIXES = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}
SIZE_UNITS = {None: 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
              "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def _decimal(text: str, pattern: re.Pattern, name: str, example: str) -> tuple[Fraction, re.Match]:
    """The exact value of ``text`` (before its suffix or unit), and the match."""
    if len(text) > MAX_TEXT_LENGTH:
        raise ValueError(f"{name} must be {example} (at most {MAX_TEXT_LENGTH} characters), "
                         f"got {echo(text)}")
    match = pattern.match(text)
    if match is None or (match["whole"] is None and not match["fraction"]):
        raise ValueError(f"{name} must be {example}, got {echo(text)}")
    whole = (match["whole"] or "0").replace(",", "").replace("_", "")
    fraction = match["fraction"] or ""
    value = Fraction(int(whole + fraction), 10 ** len(fraction)) * Fraction(10) ** int(match["exponent"] or 0)
    return (-value if match["sign"] == "-" else value), match


def parse_whole(value, name: str, *, minimum: int = 1, maximum: int,
                example: str = "a whole number like 64, 4096, 1e3 or 4K") -> int:
    """A whole number from text (see the module doc) or a number, checked against the bounds.

    ``name`` is what the error messages call the value (a flag such as ``--gpus``).
    """
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be {example}, not a boolean")
    if isinstance(value, (numbers.Integral, np.integer)):
        exact = Fraction(int(value))
    elif isinstance(value, (numbers.Real, np.floating)):
        if not math.isfinite(value):
            raise ValueError(f"{name} must be {example}, got {echo(value)}")
        exact = Fraction(value)
    elif isinstance(value, str):
        exact, match = _decimal(value, _COUNT, name, example)
        exact *= COUNT_SUFFIXES[match["suffix"].upper()]
    else:
        raise TypeError(f"{name} must be {example}, got {type(value).__name__}")
    if exact.denominator != 1:
        raise ValueError(f"{name} must be a whole number, got {echo(value)}")
    if exact < minimum:
        least = {0: "a whole number, 0 or more", 1: "a positive whole number"}.get(
            minimum, f"at least {minimum:,}")
        raise ValueError(f"{name} must be {least}, got {echo(value)}")
    if exact > maximum:
        raise ValueError(f"{name} must be at most {maximum:,}, got {echo(value)}")
    return int(exact)


def parse_size(value, name: str, *, maximum: int) -> int:
    """Bytes from ``2GiB``, ``1.5GB``, ``512MiB``, ``0`` or a byte count; a fraction of a byte is
    rounded up to a whole byte. At most ``maximum`` bytes."""
    example = "a size like 2GiB, 1.5GB, 512MiB or a byte count"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (str, numbers.Integral)):
        raise TypeError(f"{name} must be {example}, got {type(value).__name__}")
    if isinstance(value, str):
        exact, match = _decimal(value, _SIZE, name, example)
        exact *= SIZE_UNITS[match["unit"]]
    else:
        exact = Fraction(int(value))
    if exact < 0:
        raise ValueError(f"{name} must be 0 or more bytes, got {echo(value)}")
    if exact > maximum:
        raise ValueError(f"{name} must be at most {maximum:,} bytes, got {echo(value)}")
    return math.ceil(exact)


def parse_count(value, name: str = "params") -> int:
    """A parameter count: ``7B``, ``350M``, ``1.5T``, ``7e9``, ``7,000,000,000``; 1 to 10**15."""
    return parse_whole(value, name, minimum=1, maximum=MAX_PARAMS,
                       example="a count like 7B, 350M, 1.5T, 7e9 or 7,000,000,000")


# A width is a small plain decimal: no digit groups (``1_0`` is not 10), no suffix.
_WIDTH = re.compile(r"^\s*(?P<sign>[+-]?)(?P<whole>[0-9]+)?(?:\.(?P<fraction>[0-9]*))?"
                    r"(?:[eE](?P<exponent>[+-]?[0-9]{1,4}))?\s*$", re.ASCII)
_NOT_FINITE = {"nan", "+nan", "-nan", "inf", "+inf", "-inf", "infinity", "+infinity", "-infinity"}


def parse_width(text: str, name: str, *, maximum: int) -> float:
    """Bytes per parameter of one category from text such as ``2``, ``0.5``, ``1.25e1``:
    parsed exactly, never through a float, so ``1e-400`` is refused rather than read as 0. It
    must be a whole number of bits (a multiple of 0.125) from 0 to ``maximum``; the float
    returned is then exact. The messages are :func:`zerolib.core.inputs.check_width`'s."""
    if not isinstance(text, str):
        raise TypeError(f"{name} must be text such as '2' or '0.5', got {type(text).__name__}")
    if text.strip().lower() in _NOT_FINITE:
        raise ValueError(f"{name} must be a finite, non-negative number of bytes, got {echo(text)}")
    exact, _ = _decimal(text, _WIDTH, name, "a number of bytes per parameter like 2 or 0.5")
    if exact < 0:
        raise ValueError(f"{name} must be a finite, non-negative number of bytes, got {echo(text)}")
    if exact > maximum:
        raise ValueError(f"{name} must be at most {maximum} bytes per parameter, got {echo(text)}")
    if (exact * 8).denominator != 1:
        raise ValueError(f"{name} must be a whole number of bits (a multiple of 0.125 bytes), "
                         f"got {echo(text)}")
    return float(exact)


_FRACTION = re.compile(rf"^\s*{_NUMBER}\s*(?P<percent>%?)\s*$", re.ASCII)


def parse_fraction(value, name: str, *, example: str = "a fraction like 0.4 or 40%",
                   minimum: float = 0.0) -> float:
    """A number above 0 and at most 1, from ``0.4``, ``40%``, ``4e-1`` or a number (a
    utilisation), and at least ``minimum`` when one is given. Parsed exactly, then returned as
    a float."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be {example}, not a boolean")
    if isinstance(value, str):
        exact, match = _decimal(value, _FRACTION, name, example)
        if match["percent"]:
            exact /= 100
    elif isinstance(value, (numbers.Real, np.floating)) and math.isfinite(value):
        exact = Fraction(value)
    else:
        raise ValueError(f"{name} must be {example}, got {echo(value)}")
    if not 0 < exact <= 1:
        raise ValueError(f"{name} must be above 0 and at most 1 (or 100%), got {echo(value)}")
    if exact < Fraction(str(minimum)):   # far smaller would make derived times infinite
        raise ValueError(f"{name} must be at least {minimum:g} ({minimum:.1%}), got {echo(value)}")
    return float(exact)
