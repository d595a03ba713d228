"""A batch's offset ranges (`ledger.store.port`): one range per partition, from its least to its
greatest offset, in (topic, partition) order, from triples or from the consumed messages."""

from __future__ import annotations

import pytest

from ledger.store.port import ConsumedMessage, OffsetRange, message_ranges, ranges_from_offsets

CASES = [
    ([], []),
    ([("s", 0, 5)], [OffsetRange("s", 0, 5, 5)]),
    ([("s", 0, 7), ("s", 0, 3), ("s", 0, 5)], [OffsetRange("s", 0, 3, 7)]),
    (
        [("s", 1, 4), ("s", 0, 9), ("s", 1, 2), ("a", 3, 1)],
        [OffsetRange("a", 3, 1, 1), OffsetRange("s", 0, 9, 9), OffsetRange("s", 1, 2, 4)],
    ),
]


@pytest.mark.parametrize(
    ("offsets", "ranges"), CASES, ids=["empty", "one", "unordered", "topics-and-partitions"]
)
def test_offsets_collapse_to_one_range_per_partition(offsets, ranges):
    assert ranges_from_offsets(offsets) == ranges
    messages = [ConsumedMessage(t, p, o, b"{}") for t, p, o in offsets]
    assert message_ranges(messages) == ranges
