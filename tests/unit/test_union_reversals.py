"""`verify` of a sharded ledger reports, from the global shard's admin log, an admin reversal
whose target no shard holds (`ledger.store.union_verify`): a global and a samples shard written
by ingestors of their roles, one admin batch reversing a usage transaction the samples shard
holds and one nobody holds, sealed, published and pulled as one union. The first is posted by
the samples shard and not reported; the second is a note (a whole ledger's dead letter), and
the ledger stays sound."""

from __future__ import annotations

from pathlib import Path

import orjson

from ledger.admin import AdjustmentRecorded, admin_envelope, admin_envelope_to_dict
from ledger.events import decode_message
from ledger.ingest import ConsumedMessage, Ingestor, InputTopics, OutputTopics
from ledger.ingest.shards import ShardRole
from ledger.pricing import Price, PriceBook
from ledger.store.hot import DuckDBStore
from ledger.store.objects import LocalObjectStore, PrefixedStore
from ledger.store.replica import Publisher, pull
from ledger.store.verify import verify_ledger
from tests.builders import T0_US
from tests.unit.test_store import message

ROLES = {"global": ShardRole.GLOBAL, "samples-0": ShardRole.SAMPLES}


def reversal(target: str) -> AdjustmentRecorded:
    return AdjustmentRecorded(None, None, 0, None, "alice", "undo", T0_US, reverses_txn=target)


def test_verify_reports_an_admin_reversal_no_shard_holds(tmp_path: Path) -> None:
    samples = message(0, 1, 2)
    held = decode_message(samples.value)[0][0].id  # a usage transaction's id is its sample's
    # the one no shard holds first: the samples shard logs only the one it posts, after it
    events = [admin_envelope(reversal("no-such-txn")), admin_envelope(reversal(held))]
    admin = ConsumedMessage(
        "admin", 0, 0, orjson.dumps([admin_envelope_to_dict(e) for e in events])
    )
    store = LocalObjectStore(tmp_path / "store")
    for name, role in ROLES.items():
        with DuckDBStore(tmp_path / name) as shard:
            ingest = Ingestor(
                shard,
                "c",
                PriceBook((Price("*", 3_600_000),)),
                {},
                topics=OutputTopics("alerts", "dl"),
                inputs=InputTopics("admin", "jobs", "inventory"),
                role=role,
            )
            if role is ShardRole.SAMPLES:
                ingest.apply([samples])
            ingest.apply([admin])
            shard.seal()
        Publisher(tmp_path / name, PrefixedStore(store, f"shards/{name}")).push()
    report = verify_ledger(pull(store, tmp_path / "cache"))
    assert report.ok, report.problems
    unposted = [n for n in report.notes if n.startswith("admin reversal")]
    assert unposted == [
        f"admin reversal {events[0].id} of transaction no-such-txn: no shard holds its target, "
        "so none posted it (a whole ledger refuses it as a dead letter)"
    ]
