"""Issue 24, item 5: one exact parser for a width in bytes per parameter."""
from __future__ import annotations

import pytest

from zerolib.core.parse import parse_width


@pytest.mark.parametrize("text, value", [("2", 2.0), ("0.125", 0.125), ("1.5e1", 15.0),
                                         (" 12 ", 12.0), ("-0", 0.0), ("64", 64.0), ("6.4e1", 64.0)])
def test_exact_values(text, value):
    assert parse_width(text, "w", maximum=64) == value


@pytest.mark.parametrize("text, says", [
    ("1e-400", "w must be a whole number of bits"),
    ("0.1", "w must be a whole number of bits"),
    ("1_0", "w must be a number of bytes per parameter like 2 or 0.5"),
    ("1,0", "w must be a number of bytes per parameter like 2 or 0.5"),
    ("nan", "w must be a finite, non-negative number of bytes"),
    ("-inf", "w must be a finite, non-negative number of bytes"),
    ("-1e-400", "w must be a finite, non-negative number of bytes"),
    ("64.125", "w must be at most 64 bytes per parameter"),
    ("٢", "w must be a number of bytes per parameter"),
])
def test_refused(text, says):
    with pytest.raises(ValueError, match=f"^{says}"):
        parse_width(text, "w", maximum=64)


def test_not_text():
    with pytest.raises(TypeError, match="^w must be text"):
        parse_width(2.0, "w", maximum=64)
