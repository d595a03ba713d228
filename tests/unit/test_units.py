from decimal import Decimal

import pytest

from ledger.units import divide_round_half_even, format_micros, parse_micros


@pytest.mark.parametrize(
    ("text", "micros"),
    [
        pytest.param("2.50", 2_500_000, id="two-places"),
        pytest.param("0.000001", 1, id="one-micro"),
        pytest.param("3", 3_000_000, id="integer-text"),
        pytest.param(7, 7_000_000, id="int"),
        pytest.param(Decimal("1.234567"), 1_234_567, id="decimal-six-places"),
        pytest.param("-1.5", -1_500_000, id="negative"),
    ],
)
def test_parse_micros_is_exact(text, micros):
    assert parse_micros(text) == micros


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(2.5, id="float"),
        pytest.param(True, id="bool"),
        pytest.param("1.0000001", id="seven-places"),
        pytest.param("abc", id="not-a-number"),
        pytest.param("NaN", id="nan"),
        pytest.param("Infinity", id="infinity"),
    ],
)
def test_parse_micros_refuses(bad):
    with pytest.raises(ValueError):
        parse_micros(bad)


@pytest.mark.parametrize(
    ("num", "den", "expected"),
    [
        pytest.param(5, 2, 2, id="half-rounds-to-even-down"),
        pytest.param(7, 2, 4, id="half-rounds-to-even-up"),
        pytest.param(10, 3, 3, id="below-half"),
        pytest.param(20, 3, 7, id="above-half"),
        pytest.param(-5, 2, -2, id="negative-half"),
        pytest.param(0, 9, 0, id="zero"),
    ],
)
def test_divide_round_half_even(num, den, expected):
    assert divide_round_half_even(num, den) == expected


def test_divide_needs_a_positive_denominator():
    with pytest.raises(ValueError):
        divide_round_half_even(1, 0)


def test_format_micros():
    assert format_micros(1_234_567) == "1.23"
    assert format_micros(1_235_000) == "1.24"
    assert format_micros(-500_000, 1) == "-0.5"
