"""Accounting periods: calendar months in the ledger's time zone, named `YYYY-MM`, and the
time zone itself (`ledger.timezone`, an IANA name; UTC by default).

A posting belongs to the period in which its interval starts, in the ledger's time zone.
`Period` is a half-open range `[start_us, end_us)` of UTC microseconds: the 2026-11 period in
Asia/Shanghai runs from 2026-10-31T16:00:00Z to 2026-11-30T16:00:00Z. Every function takes the
zone as a value (a `tzinfo`); none reads it from anywhere else. Labels do not depend on the
zone (the month after 2026-11 is 2026-12 everywhere); bounds and the month of a time do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ledger.invalid import Invalid

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
DEFAULT_ZONE_NAME = "UTC"


def parse_zone(name: str) -> tzinfo:
    """The time zone an IANA name (`Asia/Shanghai`, `UTC`) names; ValueError for anything else.

    `UTC` is `datetime.UTC` itself, so the default zone compares equal however it was made."""
    if name == DEFAULT_ZONE_NAME:
        return UTC
    try:
        if not name or name != name.strip() or name.startswith(("/", ".")) or ".." in name:
            raise ValueError(name)
        return ZoneInfo(name)
    except (ValueError, ZoneInfoNotFoundError) as exc:
        raise Invalid(
            "{name!r} is not an IANA time zone name such as UTC or Asia/Shanghai", name=name
        ) from exc


def zone_name(zone: tzinfo) -> str:
    """The IANA name of `zone` (`UTC` for `datetime.UTC`)."""
    if zone is UTC:
        return DEFAULT_ZONE_NAME
    if isinstance(zone, ZoneInfo):
        return zone.key
    raise ValueError(f"{zone!r} is not an IANA time zone")


def to_us(moment: datetime) -> int:
    """An aware datetime as integer microseconds since the epoch (no float on the way)."""
    return (moment - _EPOCH) // _US


def local_time(time_us: int, zone: tzinfo) -> datetime:
    """`time_us` as a wall-clock time in `zone`."""
    return (_EPOCH + timedelta(microseconds=time_us)).astimezone(zone)


def local_day_start(time_us: int, zone: tzinfo) -> int:
    """The first microsecond of the local day (in `zone`) holding `time_us`."""
    moment = local_time(time_us, zone)
    return to_us(datetime(moment.year, moment.month, moment.day, tzinfo=zone))


def _month_label(year: int, month: int) -> str:
    return f"{year:04d}-{month:02d}"


@dataclass(frozen=True, slots=True)
class Period:
    """A half-open time range `[start_us, end_us)`; `label` is how a person wrote it, `zone`
    the time zone whose month it is."""

    label: str
    start_us: int
    end_us: int
    zone: tzinfo = field(default=UTC, compare=False, repr=False)

    @classmethod
    def month(cls, text: str, zone: tzinfo = UTC) -> Period:
        """`2026-11` → November 2026 in `zone`; raises ValueError for anything else."""
        try:
            year_text, month_text = text.split("-")
            if len(year_text) != 4 or len(month_text) != 2:
                raise ValueError(text)
            year, month = int(year_text), int(month_text)
            start = datetime(year, month, 1, tzinfo=zone)
        except (ValueError, TypeError) as exc:
            raise Invalid("{text!r} is not a month such as 2026-11", text=text) from exc
        after = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=zone)
        return cls(text, to_us(start), to_us(after), zone)

    @classmethod
    def containing(cls, time_us: int, zone: tzinfo = UTC) -> Period:
        return cls.month(period_label(time_us, zone), zone)

    def next(self) -> Period:
        return Period.containing(self.end_us, self.zone)


def period_label(time_us: int, zone: tzinfo = UTC) -> str:
    """The `YYYY-MM` label of the month (in `zone`) containing `time_us`."""
    known = _recent.get(zone)
    if known is not None and known[0] <= time_us < known[1]:
        return known[2]
    label = _label(time_us, zone)
    month = Period.month(label, zone)
    if _label(month.start_us, zone) == label and _label(month.end_us - 1, zone) == label:
        _recent[zone] = (month.start_us, month.end_us, label)
    return label


def _label(time_us: int, zone: tzinfo) -> str:
    moment = local_time(time_us, zone)
    return _month_label(moment.year, moment.month)


# Per zone, the bounds and label of the month `period_label` found last: the ingest asks about
# the same month for every sample (a memo of a pure function: the same answers, fewer calls).
_recent: dict[tzinfo, tuple[int, int, str]] = {}
