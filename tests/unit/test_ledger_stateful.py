"""The ledger's invariants under a random life: a Hypothesis state machine over a real
`DuckDBStore` (DuckDB file, Parquet segments) fed like the worker feeds it.

A simulated broker holds per-partition logs of the samples, admin and jobs topics. Rules
produce samples (owners or none, shared GPUs, MIG slices, malformed messages), admin events
(grants, recurring budget policies, adjustments, reversals, price changes, period closes),
holds and collector resends;
consume batches in Kafka's order (per partition, interleaved across partitions); redeliver
what was applied; crash inside a commit and restart; restart the broker empty (a new
incarnation); seal and compact, and prune the dedupe window as the worker does after a seal.
After every step that touched the store:
- every committed transaction sums to zero per unit;
- the balances table equals the fold of every posting, hot and sealed;
- no posting is applied twice: redelivered offsets and resent events change nothing, and a
  crashed commit leaves nothing behind;
- the open holds are exactly what the `hold:` accounts hold;
- a closed period's checksum never changes.
At the end of every example the ledger is sealed, verified, and rebuilt from its archive, and
the rebuild must equal it.

Settings: 50 examples × 100 steps (TALLY_STATEFUL_EXAMPLES changes the examples; `make soak`
runs 140), derandomized so CI is reproducible. Hypothesis ends examples early at random (about
80–90 % of the nominal steps run: 4,154 of 5,000 at the default, 6,698 of 7,500 at 75), so the test
counts the steps that ran and requires five sevenths of the nominal (3,572 of 5,000; 10,000 of
14,000 at 140 examples): enough to catch a machine whose rules stopped running, with room for
the random early ends. Steps are kept cheap: most produce messages (no I/O); consuming, sealing,
outages and the redelivery checks rest a few steps after running; the invariants read the sealed
segments again only when they changed.
`test_the_machine_catches_*` break the ledger on purpose and require the machine to fail.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from ledger.admin import (
    AdjustmentRecorded,
    BudgetGranted,
    BudgetPolicySet,
    Cadence,
    CarryOver,
    PeriodClosed,
    PriceSet,
    admin_envelope,
    admin_envelope_to_dict,
)
from ledger.events import MigInstance, Owner
from ledger.holds import HoldPlaced, HoldReleased, encode_hold, hold_envelope
from ledger.idle import IdlePolicy
from ledger.ingest import ConsumedMessage, Ingestor, InputTopics, OutputTopics
from ledger.job_events import GpuAssigned, GpuReleased, encode_job_event, job_envelope
from ledger.pricing import Price, PriceBook
from ledger.store.hot import DuckDBStore
from ledger.store.rebuild import ReplaySettings, rebuild
from ledger.store.side_files import period_checksum
from ledger.store.verify import verify_ledger
from ledger.units import Unit
from tests.builders import INTERVAL_US, a_process, an_envelope
from tests.ledger_harness import SCRATCH, an_ingestor, jobs_value, samples_value

EXAMPLES = int(os.environ.get("TALLY_STATEFUL_EXAMPLES", "50"))
STEPS = 100
MODEL = "NVIDIA H100 80GB HBM3"
DEC_US = 1_796_083_200_000_000  # 2026-12-01T00:00:00Z
BASE_US = DEC_US - 12 * INTERVAL_US  # sample times straddle the end of November
TIMES = 24
SETTINGS = ReplaySettings(
    prices=PriceBook((Price(MODEL, 3_600_000),)),
    cost_centres={"vision": "research", "language": "research"},
    idle_policy=IdlePolicy(5, 3 * INTERVAL_US, 10, 2 * INTERVAL_US),
    inputs=InputTopics("admin", "jobs"),
)
REGRESSIONS = replace(SETTINGS, idle_policy=IdlePolicy())  # the machine's finds, folded plainly
OWNERS = (
    None,
    Owner("vision", "detection", "ada", "job-1"),
    Owner("language", "pretraining", "cy", "job-2"),
    Owner("vision", "segmentation", "bob", None),
)
MIGS = (
    MigInstance(1, 0, "3g.40gb", 3),
    MigInstance(2, 0, "2g.20gb", 2),
    MigInstance(0xFFFF, 0, "unconfigured", 2),
)
GARBAGE = (b"{not json", b"[]", b'{"type": "tally.gpu.sample"}', b'[{"id": 1}]', None)
META = ("alice", "stateful")
TOTAL_STEPS = {"n": 0}


def at(index: int) -> int:
    return BASE_US + index * INTERVAL_US


# what runs on a shared GPU: split by SM utilisation, by memory, equally, with an unowned process
SHARED = (
    (a_process(1, 10, 60, OWNERS[1]), a_process(2, 30, 20, OWNERS[2])),
    (a_process(1, 10, None, OWNERS[1]), a_process(2, 30, None, OWNERS[3])),
    (a_process(1, 0, 0, OWNERS[2]), a_process(2, 0, 0, OWNERS[1]), a_process(3, 0, 0, None)),
    (a_process(1, 5, 50, None), a_process(2, 5, 50, OWNERS[1])),
)


@st.composite
def a_sample(draw: st.DrawFn) -> bytes:
    """One message of one or two samples: a whole GPU (owned or not), a shared GPU, or a MIG
    slice (an instance, or the slices no instance occupies)."""
    envelopes = []
    for _ in range(draw(st.integers(1, 2))):
        kind = draw(st.sampled_from(("whole", "shared", "mig")))
        variant = draw(st.integers(0, 3))
        mig = MIGS[variant % len(MIGS)] if kind == "mig" else None
        if kind == "shared":
            processes = SHARED[variant]
        elif mig is not None and mig.gpu_instance_id == 0xFFFF:
            processes = ()
        else:
            processes = (a_process(owner=OWNERS[variant]),)
        envelopes.append(
            an_envelope(
                gpu_uuid=f"GPU-{kind}",
                sample_time_us=at(draw(st.integers(1, TIMES))),
                util_gpu_pct=draw(st.sampled_from((0, 3, 50, 95))),
                energy_mj=1_234 if variant == 2 else None,
                mig=mig,
                processes=processes,
            )
        )
    return samples_value(envelopes)


PERIODS = st.sampled_from(("2026-11", "2026-12"))
ADMIN = st.one_of(
    st.builds(
        lambda team, period, unit, amount, when: BudgetGranted(
            team, period, unit, amount, *META, at(when)
        ),
        st.sampled_from(("vision", "language")),
        PERIODS,
        st.sampled_from((Unit.MONEY, Unit.GPU_MS)),
        st.integers(-50_000, 1_000_000),
        st.integers(0, TIMES),
    ),
    st.builds(
        lambda account, amount, period, when: AdjustmentRecorded(
            account, Unit.MONEY, amount, period, *META, at(when)
        ),
        st.sampled_from(("consumer:vision/detection", "consumer:language/pretraining")),
        st.integers(-5_000, 5_000).filter(bool),
        PERIODS,
        st.integers(0, TIMES),
    ),
    st.builds(
        lambda price, when: PriceSet(MODEL, None, price, *META, at(when)),
        st.sampled_from((1_800_000, 3_600_000, 7_200_000)),
        st.integers(0, TIMES),
    ),
    st.builds(lambda period: PeriodClosed(period, *META, DEC_US + 86_400_000_000), PERIODS),
    # recurring budgets: the samples reaching a month grant their allowances and carry-over
    st.builds(
        lambda team, unit, amount, carry, when: BudgetPolicySet(
            team,
            unit,
            amount,
            Cadence.MONTH,
            None,
            None,
            carry,
            50 if carry is CarryOver.PERCENT else None,
            *META,
            at(when),
        ),
        st.sampled_from(("vision", "language")),
        st.sampled_from((Unit.MONEY, Unit.GPU_MS)),
        st.integers(0, 1_000_000),
        st.sampled_from((CarryOver.NONE, CarryOver.ALL, CarryOver.PERCENT)),
        st.integers(0, TIMES),
    ),
)
HOLDS = st.one_of(
    st.builds(
        lambda job, unit, amount, when, length: HoldPlaced(
            job,
            "vision" if job == "job-1" else "language",
            None,
            unit,
            amount,
            at(when + length),
            at(when),
        ),
        st.sampled_from(("job-1", "job-2")),
        st.sampled_from((Unit.GPU_MS, Unit.MONEY)),
        st.integers(1, 40_000),
        st.integers(0, TIMES),
        st.integers(1, 8),
    ),
    st.builds(
        lambda job, when: HoldReleased(job, at(when), "completed"),
        st.sampled_from(("job-1", "job-2")),
        st.integers(0, TIMES),
    ),
    # the scheduler's GPU assignments: who holds a GPU when its samples name no owner
    st.builds(
        lambda gpu, job, when, held: (GpuAssigned if held else GpuReleased)(
            f"GPU-{gpu}",
            "node-01",
            "h100",
            MODEL,
            job,
            "vision" if job == "job-1" else "language",
            "detection" if job == "job-1" else "pretraining",
            "ada" if job == "job-1" else "cy",
            at(when),
        ),
        st.sampled_from(("whole", "shared", "mig")),
        st.sampled_from(("job-1", "job-2")),
        st.integers(0, TIMES),
        st.booleans(),
    ),
)


# what a `produce` step sends: (topic, partition or flag, payload); samples weigh the most
MESSAGES = st.one_of(
    st.tuples(st.just("samples"), st.integers(0, 1), a_sample()),
    st.tuples(st.just("samples"), st.integers(0, 1), a_sample()),
    st.tuples(st.just("samples"), st.integers(0, 1), st.sampled_from(GARBAGE)),
    st.tuples(st.just("admin"), st.integers(0, 1), st.lists(ADMIN, min_size=1, max_size=2)),
    st.tuples(st.just("jobs"), st.just(0), HOLDS),
    st.tuples(st.just("resend"), st.integers(0, 1_000), st.none()),
)


@dataclass(frozen=True, slots=True)
class Sealed:
    """What the invariants need of the sealed segments (immutable until the next seal)."""

    key: tuple[object, ...]
    postings: int
    fold: dict[tuple[str, str, str], int]
    legs: frozenset[tuple[str, int]]
    doubled: tuple[object, ...]
    unbalanced: tuple[object, ...]
    checksums: dict[str, tuple[int, str]]

    @classmethod
    def read(cls, store: DuckDBStore, key: tuple[object, ...], closed: list[str]) -> Sealed:
        files = store.manifest.files()
        if not files:
            empty = (0, hashlib.sha256(b"").hexdigest())
            return cls(key, 0, {}, frozenset(), (), (), {p: empty for p in closed})
        con = store._con
        source = "read_parquet([" + ", ".join(f"'{f}'" for f in files) + "])"
        legs = con.execute(f"SELECT txn_id, leg FROM {source}").fetchall()
        return cls(
            key,
            len(legs),
            {
                (a, u, p): int(b)
                for a, u, p, b in con.execute(
                    f"SELECT account, unit, period, sum(amount) FROM {source} GROUP BY ALL"
                ).fetchall()
            },
            frozenset(legs),
            tuple(leg for leg, n in Counter(legs).items() if n > 1),
            tuple(
                con.execute(
                    f"SELECT txn_id, unit FROM {source} GROUP BY ALL HAVING sum(amount) <> 0"
                ).fetchall()
            ),
            {p: period_checksum(con, source, p) for p in closed},
        )


class Crash(Exception):
    """The process died inside a commit."""


# Hypothesis seeds a derandomized state machine from its class's source: any edit below re-rolls
# every example (and the steps and time they take), so the machine's plumbing stays its own.
class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="tally-stateful-", dir=SCRATCH))
        self.incarnation = 1
        self.logs: dict[tuple[str, int], list[ConsumedMessage]] = {}
        self.position: dict[tuple[str, int], int] = {}
        self.applied_samples: list[bytes] = []  # sample messages whose events were all applied
        self.txn_ids: list[str] = []
        self.checksums: dict[str, tuple[int, str]] = {}
        # ids the dedupe window forgot: as the window assumes, nothing sends them again
        self.forgotten: set[str] = set()
        self.dirty = True  # the store changed since the invariants last looked
        self.step = 0
        self.last: dict[str, int] = {}  # the step each rule with a rest last ran at
        self.sealed: Sealed | None = None
        self.store = DuckDBStore(self.root / "live")
        self.ingestor = self._ingestor()

    # ------------------------------------------------------------------ plumbing

    def _ingestor(self) -> Ingestor:
        return Ingestor(
            self.store,
            f"broker-{self.incarnation}",
            SETTINGS.prices,
            SETTINGS.cost_centres,
            SETTINGS.idle_policy,
            OutputTopics(balances=None),  # the outbox is not under test here: keep steps cheap
            SETTINGS.inputs,
        )

    def _produce(self, topic: str, partition: int, value: bytes | None) -> None:
        log = self.logs.setdefault((topic, partition), [])
        log.append(ConsumedMessage(topic, partition, len(log), value, f"k{partition}".encode()))

    def _pending(self) -> list[tuple[str, int]]:
        return sorted(k for k, log in self.logs.items() if self.position.get(k, 0) < len(log))

    def _take(self, picks: list[int]) -> list[ConsumedMessage]:
        """The next batch as the consumer fetches it: in order per partition, interleaved."""
        batch = []
        for pick in [*picks, 0]:
            pending = self._pending()
            if not pending:
                break
            key = pending[pick % len(pending)]
            batch.append(self.logs[key][self.position.get(key, 0)])
            self.position[key] = self.position.get(key, 0) + 1
        return batch

    def _rested(self, name: str, gap: int) -> bool:
        """Whether `gap` steps passed since rule `name` last ran (slow rules run now and then)."""
        return self.step - self.last.get(name, -gap) >= gap

    def _ran(self, name: str) -> None:
        self.last[name] = self.step

    def _sealed(self) -> Sealed:
        """The sealed ledger's folds, read again only when the manifest changed."""
        key = (
            tuple((s.path, s.sha256) for s in self.store.manifest.load()),
            tuple(sorted(self.checksums)),
        )
        if self.sealed is None or self.sealed.key != key:
            self.sealed = Sealed.read(self.store, key, sorted(self.checksums))
        return self.sealed

    def _state(self) -> tuple[object, ...]:
        """What a batch can change: balances, postings, holds, admin log, archive, offsets."""
        hot = self.store._con.execute("SELECT count(*) FROM postings").fetchall()[0][0]
        return (
            tuple(self.store.balance_rows()),
            hot + self._sealed().postings,
            tuple(sorted(self.store.open_holds().items())),
            len(self.store.admin_entries()),
            self.store.batch_seq,
            tuple(sorted(self.store.applied_offsets(self.ingestor.incarnation).items())),
        )

    def _unforgotten(self, value: object) -> bytes | None:
        """`value` less the events the dedupe window forgot (None: nothing left)."""
        if not isinstance(value, bytes) or not self.forgotten:
            return value if isinstance(value, bytes) else None
        try:
            items = orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
        listed = items if isinstance(items, list) else [items]
        kept = [i for i in listed if not (isinstance(i, dict) and i.get("id") in self.forgotten)]
        if len(kept) == len(listed):
            return value
        return orjson.dumps(kept) if kept else None

    def _reopen(self) -> None:
        self.store.close()
        self.store = DuckDBStore(self.root / "live")
        self.ingestor = self._ingestor()
        applied = self.store.applied_offsets(self.ingestor.incarnation)
        self.position = {k: applied.get(k, 0) for k in self.logs}

    def _apply(self, batch: list[ConsumedMessage]) -> None:
        self.dirty = True
        result = self.ingestor.apply(batch)
        assert result.skipped_messages == 0
        for message in batch:
            if message.topic == "samples" and message.value not in GARBAGE:
                self.applied_samples.append(message.value or b"")
        for closed in self.store.closed_periods():  # the first record of a period stands
            self.checksums.setdefault(closed.period, (closed.rows, closed.sha256))

    # ------------------------------------------------------------------ rules

    @rule(messages=st.lists(MESSAGES, min_size=1, max_size=2))
    def produce(self, messages: list[tuple[str, int, object]]) -> None:
        """Collectors, the scheduler and admins send messages; a resend repeats an earlier one
        at a new offset (the same events)."""
        for topic, number, payload in messages:
            if topic == "samples":
                value = self._unforgotten(payload)
                if value is not None or payload is None:
                    self._produce(topic, number, value)
            elif topic == "admin":
                events = list(payload)
                if number and self.txn_ids:  # a reversal of something committed
                    events.append(AdjustmentRecorded.reversal(self.txn_ids[-1], *META, at(0)))
                value = orjson.dumps([admin_envelope_to_dict(admin_envelope(e)) for e in events])
                self._produce(topic, 0, value)
            elif topic == "jobs" and isinstance(payload, GpuAssigned | GpuReleased):
                if job_envelope(payload, "tally://scheduler").id not in self.forgotten:
                    self._produce(topic, 0, encode_job_event(payload, "tally://scheduler"))
            elif topic == "jobs":
                envelope = hold_envelope(payload)
                if envelope.id not in self.forgotten:
                    self._produce(topic, 0, encode_hold(envelope)[1])
            else:
                earlier = [m for key in sorted(self.logs) for m in self.logs[key]]
                if earlier:
                    again = earlier[number % len(earlier)]
                    partition = number % 2 if again.topic == "samples" else 0
                    if again.value == self._unforgotten(again.value):
                        self._produce(again.topic, partition, again.value)

    @precondition(lambda self: bool(self._pending()) and self._rested("consume", 5))
    @rule(picks=st.lists(st.integers(0, 5), max_size=4))
    def consume(self, picks: list[int]) -> None:
        self._ran("consume")
        self._apply(self._take(picks))
        rows = self.store._con.execute(
            "SELECT DISTINCT txn_id FROM postings WHERE kind = 'usage' ORDER BY 1 DESC LIMIT 3"
        ).fetchall()
        self.txn_ids += [str(r[0]) for r in rows]

    @precondition(lambda self: bool(self.applied_samples) and self._rested("resent", 20))
    @rule(data=st.data())
    def resent_events_change_nothing(self, data: st.DataObject) -> None:
        self._ran("resent")
        if self._pending():
            self._apply(self._take([0] * sum(len(log) for log in self.logs.values())))
        last = len(self.applied_samples) - 1
        picked = data.draw(st.lists(st.integers(0, last), min_size=1, max_size=3), "resent")
        values = [self.applied_samples[i] for i in picked]
        values = [v for v in values if v == self._unforgotten(v)]
        if not values:
            return
        before = self._state()
        for value in values:
            self._produce("samples", 0, value)
        batch = self._take([0] * (len(values) - 1))
        self.dirty = True
        result = self.ingestor.apply(batch)
        assert result.commit.transactions == 0, result.commit
        after = self._state()
        # only the offsets and the archive move: every event was applied before
        names = ("balances", "postings", "holds", "admin")
        for name, was, now in zip(names, before[:4], after[:4], strict=True):
            assert was == now, (name, was, now)

    @precondition(
        lambda self: (
            any(self.position.get(k, 0) for k in self.logs) and self._rested("redelivered", 12)
        )
    )
    @rule(back=st.integers(1, 4))
    def redelivered_offsets_change_nothing(self, back: int) -> None:
        self._ran("redelivered")
        consumed = sorted(k for k in self.logs if self.position.get(k, 0))
        saved = dict(self.position)
        for key in consumed:
            self.position[key] = max(0, self.position[key] - back)
        replayed = []
        for key in consumed:
            replayed += self.logs[key][self.position[key] : saved[key]]
        before = self._state()
        self.dirty = True
        result = self.ingestor.apply(replayed)
        assert result.skipped_messages == len(replayed)
        assert self._state() == before
        self.position = saved

    @precondition(lambda self: self._rested("outage", 25))
    @rule(
        outage=st.sampled_from(("crash inside a commit", "restart", "broker restarts empty")),
        picks=st.lists(st.integers(0, 5), max_size=4),
    )
    def outage(self, outage: str, picks: list[int]) -> None:
        """The worker dies inside a commit (the batch is handed out again after the restart),
        restarts cleanly, or the embedded broker restarts empty (a new incarnation)."""
        self.dirty = True
        self._ran("outage")
        if outage == "broker restarts empty":
            if self.incarnation < 3:
                self.incarnation += 1
                self.logs, self.position = {}, {}
                self.ingestor = self._ingestor()
            return
        if outage == "restart" or not self._pending():
            self._reopen()
            return
        before = self._state()
        batch = self._take(picks)

        def die(*_args: object, **_kwargs: object) -> None:
            raise Crash

        self.store._apply_changes = die
        try:
            self.ingestor.apply(batch)
            raise AssertionError("the commit should have died")
        except Crash:
            pass
        self._reopen()  # the broker hands the uncommitted batch out again
        assert self._state() == before

    @precondition(lambda self: self._rested("seal", 10))
    @rule(
        min_segments=st.integers(2, 4),
        window=st.sampled_from((None, None, None, 4, 16)),
    )
    def seal(self, min_segments: int, window: int | None) -> None:
        """Seal and compact, then (as the worker does after sealing) prune the dedupe window.

        The window is the promise that nothing older comes again: what it forgets is never
        sent again here (a forgotten event applied twice is what `verify` reports)."""
        self.dirty = True
        self._ran("seal")
        self.store.seal(compact_below_rows=400, compact_min_segments=min_segments)
        if window is not None:
            con = self.store._con
            before = {r[0] for r in con.execute("SELECT event_id FROM seen_events").fetchall()}
            self.store.prune_seen_events(window * INTERVAL_US)
            after = {r[0] for r in con.execute("SELECT event_id FROM seen_events").fetchall()}
            self.forgotten |= before - after
            for key, log in self.logs.items():  # nor is anything still unread
                for index in range(self.position.get(key, 0), len(log)):
                    message = log[index]
                    kept = self._unforgotten(message.value)
                    if kept != message.value:
                        log[index] = replace(message, value=kept or b"[]")

    # ------------------------------------------------------------------ invariants

    @invariant()
    def ledger_invariants(self) -> None:
        self.step += 1
        if not self.dirty:
            return  # only the simulated broker changed
        self.dirty = False
        con, sealed = self.store._con, self._sealed()
        # every transaction sums to zero per unit
        assert sealed.unbalanced == ()
        unbalanced = con.execute(
            "SELECT txn_id, unit, sum(amount) FROM postings GROUP BY ALL "
            "HAVING sum(amount) <> 0 LIMIT 3"
        ).fetchall()
        assert unbalanced == []
        # the balances table is the fold of every posting, hot and sealed
        folded = dict(sealed.fold)
        for account, unit, period, amount in con.execute(
            "SELECT account, unit, period, sum(amount) FROM postings GROUP BY ALL"
        ).fetchall():
            key = (account, unit, period)
            folded[key] = folded.get(key, 0) + int(amount)
        table = {(r.account, r.unit, r.period): r.balance for r in self.store.balance_rows()}
        assert table == folded
        # nothing is applied twice
        assert sealed.doubled == ()
        hot = con.execute("SELECT txn_id, leg FROM postings").fetchall()
        assert len(set(hot)) == len(hot)
        assert not sealed.legs & set(hot)
        # open holds are what the hold accounts hold
        held = con.execute(
            "SELECT substr(account, 6), unit, sum(balance) FROM balances "
            "WHERE account LIKE 'hold:%' GROUP BY ALL HAVING sum(balance) <> 0 ORDER BY ALL"
        ).fetchall()
        open_holds: dict[tuple[str, str], int] = {}
        for hold in self.store.open_holds().values():
            key2 = (hold.team, hold.unit.value)
            open_holds[key2] = open_holds.get(key2, 0) + hold.amount
        on_accounts = {(t, u): int(b) for t, u, b in held}
        assert on_accounts == {k: v for k, v in open_holds.items() if v}
        # a closed period never changes (a batch that closes one may book into it before the
        # close: those postings are still hot until the next seal)
        for period, recorded in self.checksums.items():
            hot_rows = con.execute("SELECT count(*) FROM postings WHERE period = ?", [period])
            if hot_rows.fetchall() == [(0,)]:
                assert sealed.checksums.get(period) == recorded, period
            else:
                every = self.store._all_postings_sql()
                assert period_checksum(con, every, period) == recorded, period

    def teardown(self) -> None:
        TOTAL_STEPS["n"] += self.step - 1  # the invariants also ran once before any step
        try:
            self.store.seal(compact_below_rows=400, compact_min_segments=3)
            batches = self.store.batch_seq
            self.store.close()
            report = verify_ledger(self.root / "live")
            assert report.ok, report.problems
            rebuilt = rebuild(self.root / "live", self.root / "rebuilt", SETTINGS)
            assert rebuilt.differences == (), rebuilt.differences
            assert rebuilt.batches == batches
        finally:
            self.store.close()
            shutil.rmtree(self.root, ignore_errors=True)


PROFILE = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.mark.slow
def test_ledger_invariants_hold_under_a_random_life() -> None:
    TOTAL_STEPS["n"] = 0
    run_state_machine_as_test(LedgerMachine, settings=PROFILE)
    print(f"\n{TOTAL_STEPS['n']} steps in {EXAMPLES} examples")
    required = -(-EXAMPLES * STEPS * 5 // 7)  # five sevenths of the nominal, rounded up
    assert TOTAL_STEPS["n"] >= required, TOTAL_STEPS


def test_a_resent_sample_does_not_expire_a_hold(tmp_path: Path) -> None:
    """Found by the machine: a batch of duplicates moved the holds' clock and expired a hold."""
    with DuckDBStore(tmp_path / "l") as store:
        ingestor = an_ingestor(store, REGRESSIONS, topics=None)
        late = samples_value([an_envelope(sample_time_us=at(20))])
        placed = HoldPlaced("job-9", "vision", None, Unit.GPU_MS, 100, at(10), at(5))
        ingestor.apply([ConsumedMessage("samples", 0, 0, late)])
        ingestor.apply([ConsumedMessage("jobs", 0, 0, jobs_value(placed))])
        resent = ingestor.apply([ConsumedMessage("samples", 0, 1, late)])
        assert (resent.commit.transactions, resent.commit.duplicates) == (0, 1)
        assert [h.amount for h in store.open_holds().values()] == [100]


def test_a_hold_placed_again_after_its_id_was_forgotten_expires_with_postings(
    tmp_path: Path,
) -> None:
    """Found by the machine: a placement the dedupe window forgot was placed again; its expiry
    repeated the first expiry's id, the store dropped the postings and kept the hold change,
    and the hold account kept the amount of a hold no longer open."""
    with DuckDBStore(tmp_path / "l") as store:
        ingestor = an_ingestor(store, REGRESSIONS, topics=None)
        placed = HoldPlaced("job-9", "vision", None, Unit.GPU_MS, 100, at(3), at(1))
        hold = jobs_value(placed)
        ingestor.apply([ConsumedMessage("jobs", 0, 0, hold)])
        released = jobs_value(HoldReleased("job-8", at(20), "completed"))
        ingestor.apply([ConsumedMessage("jobs", 0, 1, released)])  # the hold expires at 3
        assert store.open_holds() == {}
        store.prune_seen_before(at(2))  # forgets the placement, not its expiry
        assert store.seen_ids([hold_envelope(placed).id]) == set()
        later = HoldReleased("job-7", at(21), "completed")
        ingestor.apply([ConsumedMessage("jobs", 0, 2, hold)])  # placed again,
        ingestor.apply([ConsumedMessage("jobs", 0, 3, jobs_value(later))])
        assert store.open_holds() == {}  # and expired again
        held = [r for r in store.balance_rows() if r.account == "hold:vision"]
        assert sum(r.balance for r in held) == 0


BROKEN = settings(PROFILE, max_examples=20, phases=[Phase.generate], print_blob=False)


def _fails(machine: type[RuleBasedStateMachine]) -> str:
    try:
        run_state_machine_as_test(machine, settings=BROKEN)
    except (AssertionError, ExceptionGroup) as failure:
        return repr(failure)
    raise AssertionError("the machine did not notice the broken ledger")


def test_the_machine_catches_a_ledger_that_forgets_what_it_applied(monkeypatch) -> None:
    """Dropping the dedupe (applied event ids are never remembered) must fail the machine."""
    monkeypatch.setattr(DuckDBStore, "_insert_seen", lambda _self, _fresh, _extra, _built: [])
    assert "AssertionError" in _fails(LedgerMachine)


def test_the_machine_catches_a_commit_that_archives_nothing(monkeypatch) -> None:
    """A commit that leaves its messages out of the archive must fail the rebuild check."""
    commit = DuckDBStore.commit

    def without_archive(self: DuckDBStore, *args: object, **kwargs: object) -> object:
        kwargs["raw"] = ()
        return commit(self, *args, **kwargs)

    monkeypatch.setattr(DuckDBStore, "commit", without_archive)
    assert _fails(LedgerMachine)
