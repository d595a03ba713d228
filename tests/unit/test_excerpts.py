"""Bounded excerpts (`ledger.excerpts`) and what they bound: dead letters, their encoding,
alerts. One oversized input never makes an oversized output."""

from __future__ import annotations

import hashlib

import orjson
import pytest

from ledger.alerts import encode_alert
from ledger.envelope import DeadLetter
from ledger.envelope import excerpt as payload_excerpt
from ledger.events import MAX_DEAD_LETTER_BYTES, decode_message, encode_dead_letter
from ledger.excerpts import ID_LIMIT, MIN_LIMIT, TEXT_LIMIT, bounded, excerpt

MIB = 1 << 20


def sha12(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


# ---------------------------------------------------------------------------- the helper


@pytest.mark.parametrize(
    ("text", "limit", "kept_whole"),
    [
        pytest.param("", 64, True, id="empty"),
        pytest.param("a" * 63, 64, True, id="one-under-the-limit"),
        pytest.param("a" * 64, 64, True, id="exactly-the-limit"),
        pytest.param("a" * 65, 64, False, id="one-over-the-limit"),
        pytest.param("é" * 3000, TEXT_LIMIT, False, id="non-ascii-over"),
        pytest.param("x" * MIB, ID_LIMIT, False, id="one-mib-id"),
        pytest.param("x" * MIB, TEXT_LIMIT, False, id="one-mib-text"),
    ],
)
def test_an_excerpt_is_the_text_when_it_fits_else_a_marked_cut_within_the_limit(
    text, limit, kept_whole
):
    e = excerpt(text, limit)
    assert len(e.text) <= limit
    assert e.size == len(text)
    assert e.cut is not kept_whole
    if kept_whole:
        assert e.text == text and e.digest == ""
    else:
        assert e.digest == sha12(text)
        assert e.text.endswith(f"…[cut: {len(text)} chars, sha256 {e.digest}]")
        assert text.startswith(e.text[: e.text.index("…[cut:")])
    assert bounded(text, limit) == e.text


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        pytest.param("x" * 5000, "x" * 5000, True, id="same-text-same-excerpt"),
        pytest.param("x" * 5000, "x" * 4999 + "y", False, id="same-head-other-tail"),
    ],
)
def test_a_cut_excerpt_tells_originals_with_the_same_head_apart(a, b, same):
    assert (excerpt(a, 256) == excerpt(b, 256)) is same


def test_a_limit_too_small_for_the_marker_is_refused():
    with pytest.raises(ValueError, match="at least"):
        excerpt("anything", MIN_LIMIT - 1)


def test_a_payload_excerpt_of_bytes_hashes_the_decoded_original():
    raw = b"z" * MIB
    text = payload_excerpt(raw)
    assert len(text) <= TEXT_LIMIT and sha12("z" * MIB) in text


# ---------------------------------------------------------------------------- dead letters


def a_sample_message(**fields) -> bytes:
    obj = {
        "specversion": "1.0",
        "id": "id-1",
        "type": "tally.gpu.sample",
        "source": "tally://collector/node-1",
        "subject": "GPU-1",
        "time": 1,
        "schema": 1,
        "data": {"gpu_uuid": "GPU-1"},
    }
    obj.update(fields)
    return orjson.dumps(obj)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(a_sample_message(id="i" * MIB), id="one-mib-id"),
        pytest.param(a_sample_message(type="t" * MIB), id="one-mib-type-in-the-reason"),
        pytest.param(a_sample_message(data={"gpu_uuid": "g" * MIB}), id="one-mib-payload-field"),
        pytest.param(b"[" * 5000 + b"]" * 5000, id="deep-garbage"),
        pytest.param(b"\x00\xff" * MIB, id="binary-garbage"),
        pytest.param(orjson.dumps([{"id": "x" * 1000}] * 64), id="a-batch-of-bad-elements"),
    ],
)
def test_the_dead_letters_of_oversized_input_are_bounded(value):
    events, dead = decode_message(value)
    assert not events and dead
    for letter in dead:
        assert len(letter.reason) <= TEXT_LIMIT
        assert len(letter.payload) <= TEXT_LIMIT
        assert letter.event_id is None or len(letter.event_id) <= ID_LIMIT
        assert len(encode_dead_letter(letter, "incarnation")) <= MAX_DEAD_LETTER_BYTES


def test_a_cut_event_id_keeps_its_length_and_hash():
    big = "i" * MIB
    [letter] = decode_message(a_sample_message(id=big))[1]
    assert letter.event_id is not None
    assert letter.event_id.endswith(f"[cut: {MIB} chars, sha256 {sha12(big)}]")


@pytest.mark.parametrize(
    "letter",
    [
        pytest.param(DeadLetter(reason="r" * MIB, payload=""), id="one-mib-reason"),
        pytest.param(
            DeadLetter(reason="\x01" * MIB, payload="\x00" * MIB, event_id="\x02" * MIB),
            id="control-characters-escape-to-six-bytes",
        ),
        pytest.param(
            DeadLetter(reason="\ud800" * MIB, payload="p", topic="t" * MIB),
            id="lone-surrogates",
        ),
    ],
)
def test_an_encoded_dead_letter_never_exceeds_the_bound(letter):
    value = encode_dead_letter(letter, "c" * MIB)
    assert len(value) <= MAX_DEAD_LETTER_BYTES
    assert orjson.loads(value)["partition"] is None


def test_an_alert_repeats_no_more_than_an_id_limit_of_a_name():
    from ledger.alerts import AlertKind, IdleAlert
    from ledger.events import Owner

    alert = IdleAlert(
        AlertKind.DETECTED, "GPU-1", "GPU-1", "n" * MIB, "pool", "A100",
        Owner("t" * MIB, None, None, None), 1, 2, 3, 4,
    )  # fmt: skip
    value = encode_alert(alert)
    assert len(value) < 4 * ID_LIMIT + 1024
    data = orjson.loads(value)["data"]
    assert len(data["node"]) <= ID_LIMIT and len(data["owner"]["team"]) <= ID_LIMIT
