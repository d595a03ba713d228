"""Idle detection inside ingest: flags on postings, alerts in the outbox, state across restarts."""

from __future__ import annotations

import orjson

from ledger.events import encode_batch
from ledger.idle import MINUTE_US, IdlePolicy
from ledger.ingest import ConsumedMessage, Ingestor, OutputTopics
from ledger.pricing import Price, PriceBook
from ledger.read.queries import LedgerQueries
from ledger.store.hot import DuckDBStore
from tests.builders import T0_US, a_process, an_envelope, an_owner

POLICY = IdlePolicy(5, 30 * MINUTE_US, 10, 5 * MINUTE_US)
TOPICS = OutputTopics(alerts="alerts", deadletter="dl")


def minute(m: int, util: int):
    return an_envelope(
        sample_time_us=T0_US + (m + 1) * MINUTE_US,
        interval_us=MINUTE_US,
        util_gpu_pct=util,
        processes=(a_process(sm=util, owner=an_owner("vision", "notebooks")),),
    )


def notebook_messages():
    """40 idle minutes, then 10 busy ones: one message per minute."""
    utils = [0] * 40 + [80] * 10
    return [ConsumedMessage("s", 0, m, encode_batch([minute(m, u)])) for m, u in enumerate(utils)]


def ingestor(store):
    return Ingestor(store, "c", PriceBook((Price("*", 3_600_000),)), {}, POLICY, TOPICS)


def alerts_in(store):
    out = []
    for message in store.pending_outbox():
        if message.topic == "alerts":
            out.append(orjson.loads(message.value)["type"])
    return out


def test_one_alert_and_its_resolve_across_batches_and_a_restart(tmp_path):
    messages = notebook_messages()
    with DuckDBStore(tmp_path / "l") as store:
        ingestor(store).apply(messages[:20])
        ingestor(store).apply(messages[:35])  # a redelivery overlapping the first batch
    with DuckDBStore(tmp_path / "l") as store:  # a restart in the middle of the episode
        ingestor(store).apply(messages[35:])
        assert alerts_in(store) == ["tally.idle.detected", "tally.idle.resolved"]
        store.seal()
    q = LedgerQueries(tmp_path / "l")
    rows = q._query(
        "SELECT count(*) FILTER (idle), sum(amount) FILTER (idle AND unit = 'money_micros' "
        "AND amount > 0) FROM {postings} WHERE account LIKE 'consumer:%' AND unit = 'gpu_ms'"
    )
    # minutes 29..39 are confirmed idle (the first 29 are the grace period): 11 samples
    assert rows[0][0] == 11
    waste = q._query(
        "SELECT sum(amount) FROM {postings} WHERE idle AND unit = 'money_micros' AND amount > 0"
    )[0][0]
    assert waste == 11 * 60_000  # one micro per GPU-ms


def test_alert_payload(tmp_path):
    with DuckDBStore(tmp_path / "l") as store:
        ingestor(store).apply(notebook_messages())
        payloads = [orjson.loads(m.value) for m in store.pending_outbox() if m.topic == "alerts"]
        store.mark_sent([m.id for m in store.pending_outbox()])
        assert store.pending_outbox() == []
    detected = payloads[0]["data"]
    assert detected["owner"]["team"] == "vision"
    assert detected["since_us"] == T0_US
    assert detected["waste_micros"] == 60_000
    assert payloads[1]["data"]["waste_micros"] == 11 * 60_000
    assert payloads[1]["data"]["reason"] == "busy_again"


def test_dead_letters_are_queued_for_publishing(tmp_path):
    with DuckDBStore(tmp_path / "l") as store:
        ingestor(store).apply([ConsumedMessage("s", 0, 0, b"nope")])
        queued = store.pending_outbox()
    assert [m.topic for m in queued] == ["dl"]
    assert orjson.loads(queued[0].value)["offset"] == 0
