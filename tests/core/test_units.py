"""Counts are parsed exactly (never evaluated); units convert only at the edge."""
import math

import pytest

from zerolib.core.parse import parse_count
from zerolib.core.units import GB, GiB, format_bytes, format_count, to_unit


@pytest.mark.parametrize("text, expected", [
    ("7e9", 7_000_000_000),
    ("7000000000", 7_000_000_000),
    ("350M", 350_000_000),
    ("7B", 7_000_000_000),
    ("7b", 7_000_000_000),
    ("1.5T", 1_500_000_000_000),
    ("0.5B", 500_000_000),
    ("7_000_000", 7_000_000),
    ("1.3e3K", 1_300_000),
    (" 13B ", 13_000_000_000),
    (7_000_000_000, 7_000_000_000),
    (7e9, 7_000_000_000),
])
def test_parse_count_accepts_the_documented_forms(text, expected):
    assert parse_count(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "7X", "7BB", "__import__('os').getcwd()", "2**30",
                                  "1e-3", "1.2345678901B", "nan", "inf", "-inf", "1e400"])
def test_parse_count_rejects_malformed_or_fractional_counts(text):
    with pytest.raises(ValueError, match="params"):
        parse_count(text)


@pytest.mark.parametrize("text", ["-5", "0", "-1.5T", 0, -3])
def test_parse_count_rejects_non_positive_counts(text):
    with pytest.raises(ValueError, match="positive"):
        parse_count(text)


@pytest.mark.parametrize("value", [True, None, [7], float("nan")])
def test_parse_count_rejects_other_types(value):
    with pytest.raises((TypeError, ValueError), match="params"):
        parse_count(value)


def test_parse_count_names_the_argument():
    with pytest.raises(ValueError, match="--params"):
        parse_count("seven", "--params")


def test_parse_count_states_its_limit_exactly():
    assert parse_count("1000T") == 10**15
    with pytest.raises(ValueError, match="at most 1,000,000,000,000,000"):
        parse_count("1001T")


def test_gb_and_gib():
    assert GB == 1_000_000_000 and GiB == 1_073_741_824
    # An A100 "80GB" holds 80 GiB: 80 * 1_073_741_824 = 85_899_345_920 bytes = 85.9 GB.
    assert to_unit(85_899_345_920, "GiB") == 80.0
    assert math.isclose(to_unit(85_899_345_920, "GB"), 85.89934592)
    assert list(to_unit([2 * GB, GB], "GB")) == [2.0, 1.0]
    assert format_bytes(112_000_000_000) == "112.00 GB"
    with pytest.raises(ValueError, match="unit"):
        to_unit(1, "MB")
    with pytest.raises(ValueError, match="unit"):
        to_unit(1, ["GB"])
    with pytest.raises(TypeError, match="n_bytes"):
        to_unit("112000000000")            # text is parsed at the edge, not divided


def test_format_count():
    assert [format_count(n) for n in (7_000_000_000, 1_500_000_000_000, 350_000_000, 12)] == \
        ["7B", "1.5T", "350M", "12"]
