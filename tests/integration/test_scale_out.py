"""The scale-out test of issue #12: several `tally worker` processes with `ledger.sharded: true`
in one consumer group keep ONE exact ledger through every way the group changes mid-ingest.

Three workers share a 6-partition samples topic (real broker, real processes, the shards on one
segments store: a local directory, as the two-worker test uses). While `SAMPLES` samples are
ingested (produced packed, as the collector backfills): one worker is SIGKILLed and restarted;
another is SIGSTOPped past its session timeout while it holds unsealed rows (it seals only
when it hands its shards over), its shards are taken up by the others from their heads, and on
SIGCONT it is fenced — it drops those shards, writes nothing that is read, and rejoins; a
fourth worker joins; the paused one is then stopped cleanly (SIGTERM: it seals what it holds).

Then the union readers see must hold every sample once: GPU-ms exact per team and GPU against
what was produced, every balance exactly the produced samples' fold and the fold of the
union's own postings, `tally ledger verify` passing on the union and `tally ledger rebuild`
passing on the union (each shard replayed from its own archive). `TALLY_SCALE_SAMPLES` sets
the count: the issue's 500,000 by default (183 s on two cores at load average 4). Every move
takes the shard up from its head's snapshot (the log says so, and no
move replays an archive), so a change of the group no longer grows with the shard's history:
200,000 samples pass in 144 s on two busy cores, 212 s when each move replayed the archive;
what still grows with the count is the ingest and the final `verify` and rebuilds."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path

import duckdb
import pytest

from ledger.admin import BudgetGranted, admin_envelope, encode_admin
from ledger.admin.effects import grant_transaction
from ledger.events import Envelope
from ledger.read.balances import sealed_balances
from ledger.read.queries import LedgerQueries
from ledger.store.layout import SEGMENTS_DIR
from ledger.store.segments import Manifest
from ledger.store.union import union_shards
from ledger.units import Unit
from tests.builders import T0_US
from tests.conftest import child_env, create_topics, tally_command
from tests.integration.sharded_support import (
    covered,
    held_now,
    holding,
    sealed_samples,
    sharded_config,
    union_of,
)
from tests.integration.support import (
    Expected,
    WorkerProcess,
    fleet_of,
    gpu_ms_by_team_and_gpu,
    load,
    produce,
    rounds,
    send_messages,
    wait_until,
)

pytestmark = [pytest.mark.broker, pytest.mark.slow]

SAMPLES = int(os.environ.get("TALLY_SCALE_SAMPLES", "500000"))  # the count
PARTITIONS = 6
NODES = 4  # per pool: 64 GPUs, so every partition has GPUs
# how long one change of the group may take (samples keep arriving: it grows with the count)
WAIT_S = 60 + SAMPLES // 2_000
PACK = 30  # rounds per message per GPU: the collector's backfill
CHUNK = 150  # rounds generated and sent at a time (memory stays bounded)
GRANT_META = ("alice", "scale-out", T0_US)
ALL_SAMPLES_SHARDS = {f"samples-{p}" for p in range(PARTITIONS)}


def say(message: str) -> None:
    print(f"[scale-out {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Producer(threading.Thread):
    """Sends `total` rounds of the fleet, generated a chunk at a time, adding each to the
    expected ledger as it goes; only the rounds `release` has let go so far, so each change
    of the group happens while samples are still arriving."""

    def __init__(self, bootstrap: str, topic: str, fleet, expected: Expected, total: int):
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.fleet, self.expected = bootstrap, topic, fleet, expected
        self.total_rounds = total
        self.released = 0
        self.gate = threading.Condition()
        self.failure: list[BaseException] = []

    def release(self, fraction: float) -> None:
        with self.gate:
            self.released = max(self.released, round(self.total_rounds * fraction))
            self.gate.notify_all()

    def chunks(self) -> Iterator[list[Envelope]]:
        first = 0
        while first < self.total_rounds:
            with self.gate:
                self.gate.wait_for(lambda first=first: self.released > first)
                last = min(first + CHUNK, self.released)
            for envelopes in rounds(self.fleet, first, last - first):
                self.expected.add(envelopes)
                yield envelopes
            first = last

    def run(self) -> None:
        try:
            asyncio.run(produce(self.bootstrap, self.topic, self.chunks(), PACK))
        except BaseException as exc:  # surfaced by the test
            self.failure.append(exc)


def rejoined_after_fence(worker: WorkerProcess) -> bool:
    """Whether the worker's log says it holds samples shards after it last dropped one."""
    text = worker.log.read_text(errors="replace")
    return bool(re.search(r"holding shards .*samples-", text[text.rfind("dropped") :]))


def cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        tally_command(*args),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env(),
    )


def posting_fold(union: Path) -> Counter:
    """Every posting of the union, folded here per (account, unit): not by the readers' SQL."""
    files = [str(f) for f in Manifest(union / SEGMENTS_DIR).files()]
    folded: Counter = Counter()
    con = duckdb.connect(":memory:")
    try:
        cursor = con.execute("SELECT account, unit, amount FROM read_parquet(?)", [files])
        while rows := cursor.fetchmany(100_000):
            for account, unit, amount in rows:
                folded[(account, unit)] += amount
    finally:
        con.close()
    return folded


def grant(bootstrap: str, topic: str, team: str, amount: int) -> BudgetGranted:
    """A budget grant on the admin topic: the global shard's, whichever worker holds it."""
    granted = BudgetGranted(team, "2026-11", Unit.MONEY, amount, *GRANT_META)
    asyncio.run(send_messages(bootstrap, topic, [encode_admin(admin_envelope(granted))]))
    return granted


def nonzero(balances: Mapping[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    return {key: amount for key, amount in balances.items() if amount}


def test_workers_scaled_out_and_in_mid_ingest_keep_one_exact_ledger(broker, tmp_path):
    store, cache = tmp_path / "store", tmp_path / "union"
    store.mkdir()
    paths: dict[str, Path] = {}
    for name in ("a", "b", "c", "d", "reader"):
        (tmp_path / f"{name}-config").mkdir()
        # b seals only when it hands its shards over: paused, it holds unsealed rows
        data = sharded_config(
            tmp_path, name, store, 600.0 if name == "b" else 0.5,
            nodes=NODES, partitions=PARTITIONS,
        )  # fmt: skip
        config, paths[name] = load(tmp_path / f"{name}-config", data)
    create_topics(broker.bootstrap, list(config.topics.all().values()), PARTITIONS)
    fleet = fleet_of(config)
    expected = Expected(config)
    total_rounds = -(-SAMPLES // len(fleet.gpus))
    workers = {n: WorkerProcess(paths[n], broker.bootstrap, tmp_path / f"{n}.log") for n in "abcd"}
    a, b, c, d = (workers[n] for n in "abcd")
    producer = Producer(broker.bootstrap, config.topics.samples, fleet, expected, total_rounds)
    sealed = {"n": 0}

    def sealed_at_least(count: int) -> bool:
        sealed["n"] = sealed_samples(store, cache)
        return sealed["n"] >= count

    def event(what: str) -> None:
        sealed["n"] = sealed_samples(store, cache)
        say(f"{what} at {sealed['n']} of {total_rounds * len(fleet.gpus)} samples sealed")

    started = time.monotonic()
    try:
        for w in (a, b, c):
            w.start()
        wait_until(lambda: all(holding(w) for w in (a, b, c)), 90, "three to hold shards", a)
        grants = [grant(broker.bootstrap, config.topics.admin, "vision", 500_000_000)]
        producer.release(0.4)
        producer.start()
        wait_until(lambda: sealed_at_least(SAMPLES // 10), 4 * WAIT_S, "a tenth sealed", a)
        event("SIGKILL a")
        a.kill()  # its unsealed rows are lost with it, refolded by their next owner
        wait_until(lambda: covered(PARTITIONS, b, c), WAIT_S, "b and c to take a's shards up", c)
        kept = len(holding(a))
        a.start()
        wait_until(lambda: len(holding(a)) > kept, WAIT_S, "a to hold shards again", a)
        event("a restarted and holding")
        grants.append(grant(broker.bootstrap, config.topics.admin, "search", 70_000_000))
        producer.release(0.7)
        commits = b.commits()
        wait_until(lambda: b.commits() > commits, WAIT_S, "b to commit unsealed rows", b)
        assert b.proc is not None
        event("SIGSTOP b")
        os.killpg(b.proc.pid, signal.SIGSTOP)
        wait_until(lambda: covered(PARTITIONS, a, c), WAIT_S, "a and c to take b's shards up", c)
        os.killpg(b.proc.pid, signal.SIGCONT)
        wait_until(lambda: "dropped" in b.log.read_text(), WAIT_S, "b to find itself fenced", b)
        event("SIGCONT b: fenced")
        wait_until(lambda: rejoined_after_fence(b), WAIT_S, "b to rejoin with shards", b)
        rejoined = len(holding(b))
        d.start()
        wait_until(lambda: holding(d), WAIT_S, "d to hold shards", d)
        event("d joined")
        grants.append(grant(broker.bootstrap, config.topics.admin, "language", 20_000_000))
        producer.release(1.0)
        # d's join moved shards: b hands its own over and takes up its new ones
        wait_until(
            lambda: len(holding(b)) > rejoined and held_now(b) & ALL_SAMPLES_SHARDS,
            WAIT_S,
            "b to hold shards after d joined",
            b,
        )
        event("SIGTERM b")
        assert b.stop(WAIT_S) == 0  # a clean stop seals and publishes what it holds
        assert "sealed at stop" in b.log.read_text()
        producer.join(600)
        assert not producer.is_alive() and not producer.failure, producer.failure
        wait_until(
            lambda: sealed_at_least(expected.samples + len(grants)),
            4 * WAIT_S,
            f"all {expected.samples} samples and {len(grants)} grants in the union",
            a,
            interval_s=1.0,
        )
        say(f"all {expected.samples} sealed {time.monotonic() - started:.0f} s after start")
        time.sleep(1.0)  # anything counted twice would show in a later seal
        for w in (a, c, d):
            w.assert_alive()
    finally:
        for w in workers.values():
            if w.proc is not None and w.proc.poll() is None:
                os.killpg(w.proc.pid, signal.SIGCONT)
            w.stop(WAIT_S)
    moved = a.log.read_text() + c.log.read_text() + d.log.read_text()
    assert "restored from its snapshot" in moved  # every move: from the head's snapshot
    assert "by replaying its archive" not in moved
    union = union_of(store, cache)
    shards = union_shards(union)
    assert shards == ["global", *sorted(ALL_SAMPLES_SHARDS)]
    assert LedgerQueries(union).transaction_count() == expected.samples + len(grants)
    assert gpu_ms_by_team_and_gpu(union) == expected.gpu_ms_by_team_and_gpu()
    balances: Counter = Counter()
    for row in sealed_balances(union):  # what `tally report balances` shows, per period
        balances[(row.account, row.unit)] += row.balance
    produced = Counter(expected.balances())
    for granted in grants:
        txn = grant_transaction(admin_envelope(granted), expected.centres.get(granted.team))
        for p in txn.postings:
            produced[(p.account, p.unit.value)] += p.amount
    assert nonzero(balances) == nonzero(produced)
    assert nonzero(balances) == nonzero(posting_fold(union))
    reader = paths["reader"]
    checks = {
        "verify": cli("ledger", "verify", "--config", str(reader)),
        "rebuild": cli("ledger", "rebuild", "--config", str(reader), "--data-dir", str(union)),
    }
    outputs: dict[str, str] = {}
    try:
        for what, proc in checks.items():
            out, _ = proc.communicate(timeout=4 * WAIT_S)
            assert proc.returncode == 0, f"{what} exited {proc.returncode}:\n{out[-3000:]}"
            outputs[what] = out
    finally:
        for proc in checks.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert f"shard by shard: {', '.join(shards)}" in outputs["rebuild"]  # every shard replayed
    say(f"verified and rebuilt {time.monotonic() - started:.0f} s after start")
