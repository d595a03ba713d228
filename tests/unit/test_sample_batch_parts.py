"""A fetched samples batch goes to the ledger in parts bounded by their values' bytes: in
order, every message once, no part over the bound unless it is one message larger than it."""

from __future__ import annotations

import pytest

from ledger.store.port import ConsumedMessage
from streams.sample_batches import parts


def _messages(*sizes: int) -> list[ConsumedMessage]:
    return [
        ConsumedMessage("samples", n % 2, n, b"x" * size if size else None)
        for n, size in enumerate(sizes)
    ]


@pytest.mark.parametrize(
    ("sizes", "bound", "cut"),
    [
        pytest.param((3, 3, 3), 10, [3], id="all-fit-in-one"),
        pytest.param((4, 4, 4), 8, [2, 1], id="exactly-the-bound-then-a-new-part"),
        pytest.param((2, 20, 2), 10, [1, 1, 1], id="an-oversized-message-alone"),
        pytest.param((0, 0, 9, 0), 9, [4], id="empty-values-weigh-nothing"),
        pytest.param((), 10, [], id="no-messages"),
    ],
)
def test_parts_keep_order_and_stay_within_the_bound(
    sizes: tuple[int, ...], bound: int, cut: list[int]
) -> None:
    messages = _messages(*sizes)
    runs = parts(messages, bound)
    assert [len(run) for run in runs] == cut
    assert [m for run in runs for m in run] == messages
    for run in runs:
        assert len(run) == 1 or sum(len(m.value or b"") for m in run) <= bound
