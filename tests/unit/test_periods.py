from zoneinfo import ZoneInfo

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


@pytest.mark.parametrize(
    "zone",
    ["UTC", "Asia/Shanghai", "America/New_York", "Asia/Kathmandu"],
    ids=["utc", "shanghai", "new-york-dst", "quarter-hour-offset"],
)
def test_labels_around_month_starts_in_any_order(zone):
    """`period_label` remembers the month it found last; asked back and forth across month
    starts (DST ones too), it answers as the month's own bounds say."""
    tz = ZoneInfo(zone)
    starts = [Period.month(m, tz).start_us for m in ("2026-03", "2026-04", "2026-11")]
    asked = [t + d for t in starts for d in (-1, 0, 1, -1)]
    labels = [period_label(t, tz) for t in asked]
    assert labels == [
        Period.month(m, tz).label
        for m in ("2026-02", "2026-03", "2026-03", "2026-02")
        + ("2026-03", "2026-04", "2026-04", "2026-03")
        + ("2026-10", "2026-11", "2026-11", "2026-10")
    ]
