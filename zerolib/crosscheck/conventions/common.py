"""What the convention modules share: reading a transcription, the comparison's columns, and
turning an exact value into the digits a source printed."""
from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

import pandas as pd

from zerolib.crosscheck.paper import PrintRule
from zerolib.paths import data_file

# One row per printed value:
# source, item (what the value is), setting (where in the table or figure), printed (as the
# source printed it), unit (what its unit really is), reproduced (zerolib under the source's
# convention, exact, in that unit), reproduced_as_printed (the source's printing rule applied),
# agrees, how (the convention and rule used), source_note (a named inconsistency of the source
# where it does not agree), chapter (zerolib under the chapter's own convention, same unit),
# chapter_differs_by (the named differences between the two, space separated).
COMPARISON_COLUMNS = ("source", "item", "setting", "printed", "unit", "reproduced",
                      "reproduced_as_printed", "agrees", "how", "source_note", "chapter",
                      "chapter_differs_by")


def read_transcription(data_dir, filename: str, columns: tuple[str, ...],
                       text_columns: tuple[str, ...], what: str) -> pd.DataFrame:
    """A transcription from ``data/`` (or ``data_dir``), printed values kept as text."""
    path = data_file(data_dir, filename, what)
    frame = pd.read_csv(path, dtype={c: str for c in text_columns}, keep_default_na=False)
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{path} lacks the column(s) {', '.join(missing)}")
    if frame.empty:
        raise ValueError(f"{path} holds no rows")
    return frame


def exact(numerator: int, denominator: int = 1) -> Decimal:
    """numerator / denominator as a Decimal, exactly when the denominator is a power of 2 or 10
    (every unit here); otherwise to 40 significant digits."""
    value = Fraction(int(numerator), int(denominator))
    return Decimal(value.numerator) / Decimal(value.denominator)


def plain(value: Decimal) -> str:
    """A Decimal without exponent or trailing zeros: 15.000 -> '15'."""
    text = f"{Decimal(value).normalize():f}"
    return text


def same_number(text: str, value: Decimal) -> bool:
    """Whether the printed ``text`` is the number ``value`` (15.0 and 15 are the same)."""
    return Decimal(text) == Decimal(value)


@dataclass(frozen=True)
class Printed:
    """One value as a source printed it: the ``source``, what the value is (``item``), where in
    its table or figure (``setting``), the printed ``text``, the value's real ``unit``, the
    source's printing ``rule`` (None: it printed the exact value, or a formula whose value is
    ``value``) and a named inconsistency of the source (``note``, shown where zerolib does not
    agree)."""

    source: str
    item: str
    setting: str
    text: str
    unit: str
    rule: PrintRule | None = None
    value: Decimal | None = None
    note: str = ""


def row(printed: Printed, reproduced: Decimal, how: str, chapter: Decimal,
        differs_by: str) -> dict:
    """One comparison row: the ``printed`` value beside zerolib's ``reproduced`` one under the
    source's convention (``how``), and zerolib's own (``chapter``) with the named differences
    between the two (``differs_by``)."""
    rule = printed.rule
    as_printed = plain(reproduced) if rule is None else rule.text(reproduced)
    if printed.value is not None:
        agrees = Decimal(printed.value) == Decimal(reproduced)
    elif rule is None:
        agrees = same_number(printed.text, reproduced)
    else:
        agrees = Decimal(as_printed) == Decimal(printed.text)
    return {"source": printed.source, "item": printed.item, "setting": printed.setting,
            "printed": printed.text, "unit": printed.unit,
            "reproduced": float(reproduced), "reproduced_as_printed": as_printed,
            "agrees": bool(agrees), "how": how, "source_note": "" if agrees else printed.note,
            "chapter": float(chapter), "chapter_differs_by": differs_by}


def frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=list(COMPARISON_COLUMNS))
