"""What the convention modules share: reading a transcription, the comparison's columns, and
turning an exact value into the digits a source printed."""
from __future__ import annotations

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


def row(source: str, item: str, setting: str, printed: str, unit: str, reproduced: Decimal,
        rule: PrintRule | None, how: str, chapter: Decimal, differs_by: str,
        source_note: str = "", printed_value: Decimal | None = None) -> dict:
    """One comparison row; ``rule`` None means the source printed the exact value (or a
    formula, whose value here is ``printed_value``)."""
    as_printed = plain(reproduced) if rule is None else rule.text(reproduced)
    if printed_value is not None:
        agrees = Decimal(printed_value) == Decimal(reproduced)
    elif rule is None:
        agrees = same_number(printed, reproduced)
    else:
        agrees = Decimal(as_printed) == Decimal(printed)
    return {"source": source, "item": item, "setting": setting, "printed": printed, "unit": unit,
            "reproduced": float(reproduced), "reproduced_as_printed": as_printed,
            "agrees": bool(agrees), "how": how, "source_note": "" if agrees else source_note,
            "chapter": float(chapter), "chapter_differs_by": differs_by}


def frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=list(COMPARISON_COLUMNS))
