"""The store port's contract for the GPU inventory, against the DuckDB store (`duckdb`) and the
in-memory one (`memory`): committed with its batch, all or nothing; read back whole and through
the view; folded from collectors' reports by the ingest, published on the inventory topic
through the outbox; and, for the DuckDB store, kept across a restart, copied beside the
segments at each seal and rebuilt from the archive."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ledger.admin import GpuCordoned, GpuUncordoned, admin_envelope, encode_admin
from ledger.events import GpuHealth, HealthKind, SampleSource, encode_health
from ledger.fleet_alerts import HealthAlert, decode_any_alert
from ledger.ingest import ConsumedMessage, Ingestor, InputTopics, OutputTopics
from ledger.inventory import GpuHealthState, decode_record, encode_report
from ledger.pricing import Price, PriceBook
from ledger.store.hot import DuckDBStore
from ledger.store.layout import SEGMENTS_DIR
from ledger.store.memory import MemoryStore
from ledger.store.port import OffsetRange, StateChanges, ViewKeys
from ledger.store.rebuild import ReplaySettings, rebuild
from ledger.store.side_files import load_inventory
from tests.builders import INTERVAL_US, T0_US
from tests.inventory_builders import a_gpu, a_record, a_report

INC = "cluster-a"
REPORTS = "tally.inventory-reports"
INVENTORY = "tally.inventory"
ADMIN = "tally.admin"
LATER = T0_US + 2 * INTERVAL_US
PRICES = PriceBook((Price("*", 3_600_000),))


@pytest.fixture(params=["duckdb", "memory"])
def store(request, tmp_path):
    s = DuckDBStore(tmp_path / "ledger") if request.param == "duckdb" else MemoryStore()
    yield s
    s.close()


def commit_inventory(store, offset: int, *records, **kwargs):
    changes = StateChanges(inventory={r.uuid: r for r in records})
    return store.commit(
        INC, [OffsetRange(REPORTS, 0, offset, offset)], [], changes=changes, **kwargs
    )


def a_message(offset: int, report) -> ConsumedMessage:
    return ConsumedMessage(REPORTS, 0, offset, encode_report(report), report.node.encode())


def an_ingestor(store) -> Ingestor:
    return Ingestor(
        store,
        INC,
        PRICES,
        {},
        topics=OutputTopics(inventory=INVENTORY),
        inputs=InputTopics(inventory=REPORTS),
    )


def test_committed_records_are_read_back_and_a_later_one_replaces_its_gpu(store):
    assert store.inventory() == {} and store.load_view(ViewKeys(inventory=True)).inventory == {}
    commit_inventory(store, 0, a_record("GPU-0"), a_record("GPU-1", index=1))
    moved = a_record("GPU-1", index=1, node="node-02", last_seen_us=LATER)
    commit_inventory(store, 1, moved)
    expected = {"GPU-0": a_record("GPU-0"), "GPU-1": moved}
    assert store.inventory() == expected
    assert store.load_view(ViewKeys(inventory=True)).inventory == expected
    assert store.load_view(ViewKeys()).inventory == {}  # only when the fold asks
    assert store.applied_offsets(INC) == {(REPORTS, 0): 2}


def test_a_commit_that_fails_midway_leaves_the_inventory_as_it_was(store, monkeypatch):
    commit_inventory(store, 0, a_record("GPU-0"))

    def explode(*_args, **_kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(store, "_apply_changes", explode)
    with pytest.raises(RuntimeError):
        commit_inventory(store, 1, a_record("GPU-0", last_seen_us=LATER), a_record("GPU-9"))
    assert store.inventory() == {"GPU-0": a_record("GPU-0")}
    assert store.applied_offsets(INC) == {(REPORTS, 0): 1}


def test_the_ingest_folds_reports_and_publishes_each_changed_record(store):
    ingest = an_ingestor(store)
    two = a_report("node-01", a_gpu("GPU-0"), a_gpu("GPU-1", 1))
    result = ingest.apply([a_message(0, two)])
    assert (result.inventory_reports, result.commit.transactions) == (1, 0)
    published = {m.key: decode_record(m.value) for m in store.pending_outbox()}
    assert published == {b"GPU-0": a_record("GPU-0"), b"GPU-1": a_record("GPU-1", index=1)}
    assert all(m.topic == INVENTORY for m in store.pending_outbox())
    store.mark_sent([m.id for m in store.pending_outbox()])

    resent = ingest.apply([a_message(1, two)])  # the collector's resend: nothing changes
    assert resent.inventory_reports == 1 and store.pending_outbox() == []
    ingest.apply([a_message(2, replace(two, time_us=LATER, gpus=two.gpus[1:]))])
    assert [(m.key, decode_record(m.value).last_seen_us) for m in store.pending_outbox()] == [
        (b"GPU-1", LATER)
    ]
    assert store.inventory()["GPU-0"].last_seen_us == T0_US  # left out: not seen since


def test_a_bad_report_is_a_dead_letter_and_the_rest_of_the_batch_applies(store):
    ingest = an_ingestor(store)
    bad = ConsumedMessage(REPORTS, 0, 0, b'{"type": "tally.inventory.report"}')
    result = ingest.apply([bad, a_message(1, a_report())])
    assert len(result.dead_letters) == 1 and list(store.inventory()) == ["GPU-0"]


def test_both_stores_fold_the_same_inventory_and_queue_the_same_messages(tmp_path):
    batches = [
        [a_message(0, a_report("node-01", a_gpu("GPU-0"), a_gpu("GPU-1", 1)))],
        [a_message(1, a_report("node-02", a_gpu("GPU-2"), at_us=LATER))],
        [a_message(2, a_report("node-01", a_gpu("GPU-1", 1), at_us=LATER))],
    ]
    seen = []
    for store in (DuckDBStore(tmp_path / "ledger"), MemoryStore()):
        ingest = an_ingestor(store)
        for batch in batches:
            ingest.apply(batch)
        seen.append((store.inventory(), [(m.id, m.key, m.value) for m in store.pending_outbox()]))
        store.close()
    duck, memory = seen
    assert memory == duck and len(duck[0]) == 3 and len(duck[1]) == 4


def test_the_duckdb_inventory_outlives_a_restart_is_copied_at_each_seal_and_rebuilt(tmp_path):
    data = tmp_path / "ledger"
    with DuckDBStore(data) as store:
        ingest = an_ingestor(store)
        ingest.apply([a_message(0, a_report("node-01", a_gpu("GPU-0"), a_gpu("GPU-1", 1)))])
        ingest.apply([a_message(1, a_report("node-01", a_gpu("GPU-1", 1), at_us=LATER))])
        store.seal()
        live = store.inventory()
    assert {g.uuid: g for g in load_inventory(data / SEGMENTS_DIR)} == live
    with DuckDBStore(data) as again:
        assert again.inventory() == live
    settings = ReplaySettings(PRICES, {}, inputs=InputTopics(inventory=REPORTS))
    report = rebuild(data, tmp_path / "rebuilt", settings)
    assert report.identical, report.differences
    with DuckDBStore(tmp_path / "rebuilt") as rebuilt:
        assert rebuilt.inventory() == live
    # replayed as samples (the wrong input topics), the reports make no inventory: it shows
    wrong = replace(settings, inputs=InputTopics(inventory="another-topic"))
    differs = rebuild(data, tmp_path / "wrong", wrong).differences
    assert {(d.kind.value, d.subject) for d in differs if d.kind.value == "inventory"} == {
        ("inventory", "GPU-0"),
        ("inventory", "GPU-1"),
    }


def a_health_message(offset: int, health: GpuHealth) -> ConsumedMessage:
    return ConsumedMessage(
        REPORTS, 0, offset, encode_health(health, "nvml://node-01"), health.node.encode()
    )


def xid(code: int, at_us: int, uuid: str = "GPU-0") -> GpuHealth:
    return GpuHealth(
        "node-01", uuid, 0, HealthKind.XID_ERROR, f"XID {code}", at_us, SampleSource.NVML, code
    )


def test_health_events_fold_into_the_record_and_are_published_once(store):
    ingest = an_ingestor(store)
    ingest.apply([a_message(0, a_report())])
    store.mark_sent([m.id for m in store.pending_outbox()])
    result = ingest.apply([a_health_message(1, xid(79, T0_US + 1))])
    assert result.dead_letters == ()
    record = store.inventory()["GPU-0"]
    assert (record.health, record.health_since_us, record.faults) == (
        GpuHealthState.UNHEALTHY,
        T0_US + 1,
        1,
    )
    message, alert = sorted(store.pending_outbox(), key=lambda m: m.topic != INVENTORY)
    assert decode_record(message.value) == record
    raised = decode_any_alert(alert.value)
    assert isinstance(raised, HealthAlert) and alert.key == b"GPU-0"
    assert (raised.state, raised.reason) == ("unhealthy", "XID 79: GPU has fallen off the bus")
    store.mark_sent([message.id, alert.id])
    ingest.apply([a_health_message(2, xid(79, T0_US + 1))])  # the collector's resend
    assert store.pending_outbox() == [] and store.inventory()["GPU-0"] == record


def test_both_stores_fold_health_alike_and_the_rebuild_is_identical(tmp_path):
    batches = [
        [a_message(0, a_report("node-01", a_gpu("GPU-0"), a_gpu("GPU-1", 1)))],
        [a_health_message(1, xid(74, T0_US + 1)), a_health_message(2, xid(79, T0_US + 2, "GPU-1"))],
        [a_message(3, a_report("node-01", a_gpu("GPU-0"), a_gpu("GPU-1", 1), at_us=LATER))],
    ]
    seen = []
    for store in (DuckDBStore(tmp_path / "ledger"), MemoryStore()):
        ingest = an_ingestor(store)
        for batch in batches:
            ingest.apply(batch)
        seen.append(store.inventory())
        if isinstance(store, DuckDBStore):
            store.seal()
        store.close()
    duck, memory = seen
    assert memory == duck
    assert (duck["GPU-0"].health, duck["GPU-1"].health) == (
        GpuHealthState.DEGRADED,
        GpuHealthState.UNHEALTHY,
    )
    settings = ReplaySettings(PRICES, {}, inputs=InputTopics(inventory=REPORTS))
    report = rebuild(tmp_path / "ledger", tmp_path / "rebuilt", settings)
    assert report.identical, report.differences


def cordon_message(offset: int, event) -> ConsumedMessage:
    key, value = encode_admin(admin_envelope(event))
    return ConsumedMessage(ADMIN, 0, offset, value, key)


def a_full_ingestor(store) -> Ingestor:
    return Ingestor(
        store,
        INC,
        PRICES,
        {},
        topics=OutputTopics(inventory=INVENTORY),
        inputs=InputTopics(inventory=REPORTS, admin=ADMIN),
    )


def cordoned(store) -> dict[str, tuple[bool, str | None, str | None]]:
    return {u: (g.cordoned, g.cordoned_by, g.cordon_reason) for u, g in store.inventory().items()}


def test_a_cordon_marks_the_gpus_it_names_and_covers_a_nodes_later_gpus(store):
    ingest = a_full_ingestor(store)
    ingest.apply([a_message(0, a_report("node-01", a_gpu("GPU-0"), a_gpu("GPU-1", 1)))])
    ingest.apply([a_message(1, a_report("node-02", a_gpu("GPU-2")))])
    store.mark_sent([m.id for m in store.pending_outbox()])
    ingest.apply([cordon_message(0, GpuCordoned("node-01", "ops", "fan", T0_US + 1))])
    assert {m.key for m in store.pending_outbox()} == {b"GPU-0", b"GPU-1"}
    ingest.apply([cordon_message(1, GpuCordoned("GPU-2", "ops", "flaky", T0_US + 2))])
    assert cordoned(store) == {
        "GPU-0": (True, "ops", "fan"),
        "GPU-1": (True, "ops", "fan"),
        "GPU-2": (True, "ops", "flaky"),
    }
    # node-01 reports a new GPU: the node's standing cordon covers it
    later = a_report("node-01", a_gpu("GPU-0"), a_gpu("GPU-1", 1), a_gpu("GPU-3", 3), at_us=LATER)
    ingest.apply([a_message(2, later)])
    assert cordoned(store)["GPU-3"] == (True, "ops", "fan")
    ingest.apply([cordon_message(2, GpuUncordoned("GPU-2", "bob", "fixed", T0_US + 3))])
    assert cordoned(store)["GPU-2"] == (False, None, None)
    log = [(e.envelope.data.KIND.value, e.outcome) for e in store.admin_entries()]
    assert log[-1] == ("tally.admin.gpu_uncordoned", "applied")


def test_cordons_fold_alike_in_both_stores_and_the_rebuild_replays_them(tmp_path):
    batches = [
        [a_message(0, a_report("node-01", a_gpu("GPU-0"), a_gpu("GPU-1", 1)))],
        [cordon_message(0, GpuCordoned("node-01", "ops", "fan", T0_US + 1))],
        [cordon_message(1, GpuUncordoned("GPU-1", "ops", "one is fine", T0_US + 2))],
    ]
    seen = []
    for store in (DuckDBStore(tmp_path / "ledger"), MemoryStore()):
        ingest = a_full_ingestor(store)
        for batch in batches:
            ingest.apply(batch)
        seen.append(cordoned(store))
        if isinstance(store, DuckDBStore):
            store.seal()
        store.close()
    assert seen[0] == seen[1] == {"GPU-0": (True, "ops", "fan"), "GPU-1": (False, None, None)}
    settings = ReplaySettings(PRICES, {}, inputs=InputTopics(inventory=REPORTS, admin=ADMIN))
    report = rebuild(tmp_path / "ledger", tmp_path / "rebuilt", settings)
    assert report.identical, report.differences
    with DuckDBStore(tmp_path / "rebuilt") as rebuilt:
        assert cordoned(rebuilt) == seen[0]
