"""``ascii_decimal`` and ``seconds`` (launcher/base/untrusted.py), the one reader of durations on the command line
(through each front end: tests/system/test_number_options.py): what they take is exactly what ``float`` reads of a
plain ASCII decimal, and every refusal is worded one way."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.base.untrusted import ascii_decimal, seconds

PLAIN = st.from_regex(r"\A[+-]?([0-9]{1,8}\.?[0-9]{0,8}|\.[0-9]{1,8})([eE][+-]?[0-9]{1,3})?\Z")


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_float_python_writes_reads_back(value: float) -> None:
    assert ascii_decimal(repr(value)) == value
    assert ascii_decimal(f"{value:.6e}") == float(f"{value:.6e}")


@given(PLAIN)
def test_a_plain_decimal_reads_as_float_reads_it(text: str) -> None:
    value = float(text)
    assert ascii_decimal(text) == (value + 0.0 if math.isfinite(value) else None)


@given(st.text(max_size=12))
def test_whatever_it_takes_is_a_plain_decimal(text: str) -> None:
    value = ascii_decimal(text)
    if value is not None:
        assert text.isascii() and text.strip() == text and "_" not in text and math.isfinite(value)
        assert value == float(text) and text.lower() not in ("nan", "inf", "infinity")


@pytest.mark.parametrize("text", ["1_0", " 5", "5\n", "nan", "-inf", "Infinity", "\u0665", "\uff15", "0x10", "1e",
                                  "e3", ".", "", "+", "-.", "1.2.3", "1e3e3", "+-1", "1e999", "1,5"])
def test_what_float_reads_but_no_one_types_is_refused(text: str) -> None:
    assert ascii_decimal(text) is None


def test_one_wording_for_every_range() -> None:
    with pytest.raises(ValueError, match=r"^'1_0' is not a number of seconds > 0$"):
        seconds("1_0")
    with pytest.raises(ValueError, match=r"^'-1' is not a number of seconds >= 0$"):
        seconds("-1", inclusive=True)
    with pytest.raises(ValueError, match=r"^'0.001' is not a number of seconds from 0.005 to 86400$"):
        seconds("0.001", 0.005, inclusive=True, high=86400)
    with pytest.raises(KeyError, match="is not a number of seconds > 0 and at most 5"):
        seconds("6", high=5, error=KeyError)
    assert seconds("0", inclusive=True) == 0.0 and seconds("-0", inclusive=True) == 0.0
    assert seconds("86400", 0.005, inclusive=True, high=86400) == 86400.0
