import pytest

from ledger.periods import Period, period_label

NOV_2026_US = 1_793_491_200_000_000


@pytest.mark.parametrize(
    ("text", "start_us", "days"),
    [
        pytest.param("2026-11", NOV_2026_US, 30, id="november"),
        pytest.param("2028-02", 1_832_976_000_000_000, 29, id="leap-february"),
        pytest.param("2026-12", NOV_2026_US + 30 * 86_400_000_000, 31, id="december"),
    ],
)
def test_month_bounds(text, start_us, days):
    period = Period.month(text)
    assert (period.start_us, period.end_us) == (start_us, start_us + days * 86_400_000_000)


@pytest.mark.parametrize("bad", ["2026-13", "2026-1", "26-11", "November", "", "2026-11-01"])
def test_not_a_month(bad):
    with pytest.raises(ValueError, match="is not a month"):
        Period.month(bad)


def test_labels_and_next():
    assert period_label(NOV_2026_US) == "2026-11"
    assert period_label(NOV_2026_US - 1) == "2026-10"
    assert Period.containing(NOV_2026_US + 5).next().label == "2026-12"
    assert Period.month("2026-12").next().label == "2027-01"
