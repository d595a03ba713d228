"""The disk spool: order, durability across reopen, torn tails, CRC checks and the size bound."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from collectors.spool import MAGIC, SUFFIX, DropReason, Spool, SpoolRecord, encode_record


def rec(n: int, samples: int = 2, size: int = 40) -> SpoolRecord:
    return SpoolRecord("samples", f"GPU-{n:04d}".encode(), bytes([n % 256]) * size, samples)


class Drops:
    def __init__(self) -> None:
        self.seen: list[tuple[DropReason, int, int]] = []

    def __call__(self, reason: DropReason, records: int, samples: int) -> None:
        self.seen.append((reason, records, samples))

    def total(self, reason: DropReason) -> tuple[int, int]:
        hits = [(r, s) for why, r, s in self.seen if why is reason]
        return sum(r for r, _ in hits), sum(s for _, s in hits)


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"*{SUFFIX}"))


def drain(spool: Spool) -> list[SpoolRecord]:
    out = spool.peek(1_000_000)
    spool.remove(len(out))
    return out


def test_records_come_back_in_the_order_they_were_spooled(tmp_path):
    with Spool(tmp_path) as spool:
        spool.append([rec(1), rec(2)])
        spool.append([rec(3)])
        assert (spool.records, spool.samples) == (3, 6)
        assert spool.peek(2) == [rec(1), rec(2)]
        assert spool.peek(10) == [rec(1), rec(2), rec(3)]  # peeking removes nothing
        spool.remove(2)
        assert spool.peek(10) == [rec(3)]
        spool.append([rec(4)])
        assert drain(spool) == [rec(3), rec(4)]
        assert spool.records == 0 and spool.live_bytes == 0


def test_peek_stops_at_the_byte_limit_but_returns_at_least_one(tmp_path):
    with Spool(tmp_path) as spool:
        spool.append([rec(1, size=100), rec(2, size=100)])
        assert spool.peek(10, max_bytes=150) == [rec(1, size=100)]
        assert spool.peek(10, max_bytes=10) == [rec(1, size=100)]


def test_the_spool_survives_a_restart_and_remembers_what_was_acknowledged(tmp_path):
    with Spool(tmp_path) as spool:
        spool.append([rec(1), rec(2), rec(3)])
        spool.remove(1)
    with Spool(tmp_path) as reopened:
        assert reopened.recovery.truncated_bytes == 0
        assert reopened.peek(10) == [rec(2), rec(3)]
        reopened.append([rec(4)])
    with Spool(tmp_path) as again:
        assert drain(again) == [rec(2), rec(3), rec(4)]
    with Spool(tmp_path) as empty:
        assert empty.records == 0


def test_a_torn_tail_write_is_cut_and_appending_goes_on_after_it(tmp_path):
    with Spool(tmp_path) as spool:
        spool.append([rec(1), rec(2), rec(3)])
    (segment,) = segments(tmp_path)
    full = segment.stat().st_size
    with segment.open("r+b") as f:
        f.truncate(full - 7)  # the crash came in the middle of writing record 3
    with Spool(tmp_path) as reopened:
        assert reopened.recovery.truncated_bytes == len(encode_record(rec(3))) - 7
        assert reopened.peek(10) == [rec(1), rec(2)]
        reopened.append([rec(4)])
    with Spool(tmp_path) as again:
        assert again.recovery.truncated_bytes == 0
        assert again.peek(10) == [rec(1), rec(2), rec(4)]


def _flip(data: bytearray, at: int) -> None:
    data[at] ^= 0xFF


def _frame_offset(record_index: int) -> int:
    return len(MAGIC) + sum(len(encode_record(rec(i))) for i in range(1, record_index + 1))


CORRUPTIONS = [
    pytest.param(lambda d, at: _flip(d, at + 8 + 10), id="flipped-body-byte"),
    pytest.param(lambda d, at: _flip(d, at + 5), id="flipped-crc-byte"),
    pytest.param(
        lambda d, at: d.__setitem__(slice(at, at + 4), struct.pack(">I", 1 << 30)),
        id="length-beyond-the-file",
    ),
    pytest.param(
        lambda d, at: d.__setitem__(slice(at, at + 4), struct.pack(">I", 3)),
        id="length-shorter-than-a-body",
    ),
    pytest.param(lambda d, at: d.__setitem__(slice(at, at + 4), b"\0\0\0\0"), id="zeroed-length"),
]


@pytest.mark.parametrize("corrupt", CORRUPTIONS)
def test_a_crc_or_length_mismatch_ends_the_segment_at_the_bad_record(tmp_path, corrupt):
    with Spool(tmp_path) as spool:
        spool.append([rec(1), rec(2), rec(3)])
    (segment,) = segments(tmp_path)
    data = bytearray(segment.read_bytes())
    corrupt(data, _frame_offset(1))  # record 2
    segment.write_bytes(bytes(data))
    with Spool(tmp_path) as reopened:
        assert reopened.peek(10) == [rec(1)]
        assert reopened.recovery.truncated_bytes == len(data) - _frame_offset(1)
        assert segment.stat().st_size == _frame_offset(1)


def test_a_segment_without_the_spool_header_is_deleted(tmp_path):
    with Spool(tmp_path) as spool:
        spool.append([rec(1)])
    (segment,) = segments(tmp_path)
    segment.write_bytes(b"not a spool at all")
    with Spool(tmp_path) as reopened:
        assert reopened.records == 0
        assert reopened.recovery.truncated_segments == (int(segment.stem),)
        assert not segment.exists()


def test_a_record_corrupted_on_disk_after_opening_is_dropped_at_replay(tmp_path):
    drops = Drops()
    with Spool(tmp_path, on_drop=drops) as spool:
        spool.append([rec(1), rec(2, samples=5), rec(3)])
        (segment,) = segments(tmp_path)
        data = bytearray(segment.read_bytes())
        _flip(data, _frame_offset(1) + 20)
        segment.write_bytes(bytes(data))
        assert spool.peek(10) == [rec(1), rec(3)]
        assert drops.total(DropReason.CORRUPT) == (1, 5)
        spool.remove(2)
        assert spool.records == 0


def test_when_full_the_oldest_whole_records_are_dropped_and_counted(tmp_path):
    drops = Drops()
    size = len(encode_record(rec(0)))
    with Spool(tmp_path, max_bytes=5 * size, segment_bytes=2 * size, on_drop=drops) as spool:
        for n in range(1, 9):
            spool.append([rec(n, samples=3)])
            assert spool.live_bytes <= spool.max_bytes
        assert [r.key for r in spool.peek(10)] == [rec(n).key for n in range(4, 9)]
        assert drops.total(DropReason.FULL) == (3, 9)
        # one segment more than max_bytes at most, however long it runs full
        assert spool.disk_bytes <= spool.max_bytes + spool.segment_bytes + len(MAGIC)
    with Spool(tmp_path, max_bytes=5 * size) as reopened:
        assert [r.key for r in reopened.peek(10)] == [rec(n).key for n in range(4, 9)]


def test_an_append_larger_than_the_spool_keeps_its_newest_records(tmp_path):
    drops = Drops()
    size = len(encode_record(rec(0)))
    with Spool(tmp_path, max_bytes=3 * size, on_drop=drops) as spool:
        spool.append([rec(n) for n in range(1, 6)])
        assert spool.peek(10) == [rec(3), rec(4), rec(5)]
        assert drops.total(DropReason.FULL) == (2, 4)


def test_a_record_larger_than_the_whole_spool_is_refused_and_counted(tmp_path):
    drops = Drops()
    with Spool(tmp_path, max_bytes=200, on_drop=drops) as spool:
        spool.append([rec(1, samples=7, size=500), rec(2)])
        assert spool.peek(10) == [rec(2)]
        assert drops.total(DropReason.TOO_LARGE) == (1, 7)


def test_segments_roll_and_replayed_ones_are_deleted(tmp_path):
    size = len(encode_record(rec(0)))
    with Spool(tmp_path, segment_bytes=len(MAGIC) + 2 * size) as spool:
        spool.append([rec(n) for n in range(1, 6)])
        assert len(segments(tmp_path)) == 3
        spool.remove(3)
        assert len(segments(tmp_path)) == 2
        spool.append([rec(6)])
        assert drain(spool) == [rec(4), rec(5), rec(6)]
        assert segments(tmp_path) == []
        spool.append([rec(7)])  # a new segment, numbered after every earlier one
    with Spool(tmp_path) as reopened:
        assert reopened.peek(10) == [rec(7)]


def test_an_unreadable_cursor_replays_everything(tmp_path):
    with Spool(tmp_path) as spool:
        spool.append([rec(1), rec(2)])
        spool.remove(1)
    (tmp_path / "cursor").write_text("garbage")
    with Spool(tmp_path) as reopened:
        assert reopened.peek(10) == [rec(1), rec(2)]  # a resend is harmless; a loss is not


def test_removing_more_than_is_held_is_a_bug(tmp_path):
    with Spool(tmp_path) as spool, pytest.raises(ValueError):
        spool.remove(1)
