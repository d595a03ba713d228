"""Holds: usage reserved for an admitted job until it is metered, as events and as postings.

The scheduler puts `HoldPlaced` and `HoldReleased` on the `jobs` topic, keyed by job id, beside
its job events (`ledger.jobs_message` reads a jobs message). The ledger books them:

- placing a hold debits `hold:<team>` and credits `holds-outstanding:<team>` (kind `hold`); a
  second placement for the same job and unit adds to the open hold;
- metered usage settles it: the consumer postings of usage transactions carrying the job's id
  reduce the open hold by at most what is left (kind `hold_settle`, the opposite postings),
  in the same commit as the usage;
- `HoldReleased` (completion or cancel) releases what is left in every unit (kind
  `hold_release`); so does the hold's expiry, once the ledger has folded an event at or after
  `expires_us`.

In a sharded ledger the global shard holds no usage: there a release only ends the job's holds
and each is settled once, from the union's usage, when a shards' watermark that gives its job's
usage passes its end (`HoldBook.end`, `HoldBook.settle_ended`, `ledger.ingest.sealed`).

So a team's open holds are the balance of `hold:<team>` over all periods, never a stored number;
`OpenHold` rows are the per-job projection the settlement needs, kept in the same commits.

Hold events travel in the generic envelope and codec (`ledger.envelope`); `HOLDS` is their
family. Schemas of hold event data:
- v1 (current): the fields of `HoldPlaced` / `HoldReleased` as `hold_to_dict` writes them;
- v0: holds were in money only: `tally.hold.placed` carried `amount_micros` where v1 has `unit`
  and `amount` (v1 added GPU-ms holds); `tally.hold.released` had the shape it has now.
  `hold_v0_to_v1` upcasts both. An upcast event's id is the one its v1 form derives.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, ClassVar

import orjson

from ledger.accounts import AccountKind, hold_account, holds_outstanding_account
from ledger.envelope import (
    REGISTRY,
    Envelope,
    Family,
    decode_envelope,
    event_id,
    family_to_dict,
)
from ledger.errors import EventError
from ledger.events import MAX_TIME_US
from ledger.postings import Posting, Transaction, TransactionKind
from ledger.units import Unit

HOLD_SOURCE = "tally://scheduler"
LEDGER_HOLDS_SOURCE = "tally://ledger/holds"
MAX_HOLD = 1 << 62
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

HoldKey = tuple[str, Unit]  # (job id, unit)
BookPeriod = Callable[[int], str]  # time → the open period a posting at that time is booked into


class HoldKind(StrEnum):
    PLACED = "tally.hold.placed"
    RELEASED = "tally.hold.released"


@dataclass(frozen=True, slots=True)
class HoldPlaced:
    """Reserve `amount` of `unit` of `team`'s budget for `job_id` from `time_us` on."""

    KIND: ClassVar[HoldKind] = HoldKind.PLACED
    job_id: str
    team: str
    project: str | None
    unit: Unit
    amount: int
    expires_us: int
    time_us: int


@dataclass(frozen=True, slots=True)
class HoldReleased:
    """`job_id` ended (`reason`: completed, cancelled, …): release what is left of its holds."""

    KIND: ClassVar[HoldKind] = HoldKind.RELEASED
    job_id: str
    time_us: int
    reason: str = ""


HoldEvent = HoldPlaced | HoldReleased
HoldEnvelope = Envelope[HoldEvent]  # keyed (subject) by job id
HOLD_SCHEMA = 1


@dataclass(frozen=True, slots=True)
class OpenHold:
    """What is left of one job's hold in one unit; `placed_by` is its first placement.

    A sharded ledger's global shard settles a hold from its job's usage, which is kept per job
    id, not per attempt (a retried job keeps its id): `baseline` is the job's usage its earlier
    holds' settlements accounted already (`HoldBook.settle_ended`), so the hold is settled and
    projected by the usage past it; `earlier` is how much of `amount` earlier attempts placed
    and ended before a retry's placement joined them, still awaiting settlement (0: none), which
    readers project apart (`ledger.hold_projection`). Both 0 in a whole ledger's fold.
    `final`: the job ended for good (`ended_for_good`) while the hold was open, so no hold of
    the job follows it and settling it drops the job's baseline instead of moving it."""

    job_id: str
    unit: Unit
    team: str
    project: str | None
    amount: int
    expires_us: int
    placed_by: str
    baseline: int = 0
    earlier: int = 0
    final: bool = False

    @property
    def key(self) -> HoldKey:
        return (self.job_id, self.unit)


# ---------------------------------------------------------------------------- codec


def hold_envelope(event: HoldEvent, source: str = HOLD_SOURCE) -> HoldEnvelope:
    unit = event.unit.value if isinstance(event, HoldPlaced) else ""
    return Envelope(
        id=event_id(source, f"{event.job_id}/{event.KIND}/{unit}", event.time_us),
        type=event.KIND,
        source=source,
        subject=event.job_id,
        time_us=event.time_us,
        schema=HOLD_SCHEMA,
        data=event,
    )


def hold_to_dict(event: HoldEvent) -> dict[str, Any]:
    if isinstance(event, HoldPlaced):
        return {
            "job_id": event.job_id,
            "team": event.team,
            "project": event.project,
            "unit": event.unit.value,
            "amount": event.amount,
            "expires_us": event.expires_us,
            "time_us": event.time_us,
        }
    return {"job_id": event.job_id, "time_us": event.time_us, "reason": event.reason}


def encode_hold(envelope: HoldEnvelope) -> tuple[bytes, bytes]:
    """(key, value) of the jobs-topic message: keyed by job id."""
    return envelope.subject.encode(), orjson.dumps(family_to_dict(HOLDS, envelope))


def _text(name: str, value: Any, max_len: int = 256) -> str:
    if type(value) is not str or not value:
        raise EventError(f"{name}: expected a non-empty string")
    if len(value) > max_len:
        raise EventError(f"{name}: longer than {max_len} characters")
    return value


def _name(name: str, value: Any) -> str:
    if type(value) is not str or not _NAME.match(value):
        raise EventError(f"{name}: expected a name of letters, digits, '.', '_' and '-'")
    return value


def _int(name: str, value: Any, lo: int, hi: int) -> int:
    if type(value) is not int:
        raise EventError(f"{name}: expected an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise EventError(f"{name}: {value} is out of range [{lo}, {hi}]")
    return value


def _fields(data: Any, required: set[str], optional: set[str]) -> dict[str, Any]:
    if type(data) is not dict:
        raise EventError("data: expected an object")
    unknown = data.keys() - required - optional
    if unknown:
        raise EventError(f"data: unknown fields {sorted(unknown)}")
    missing = required - data.keys()
    if missing:
        raise EventError(f"data: missing {sorted(missing)}")
    return data


def hold_from_dict(kind: HoldKind, data: Any) -> HoldEvent:
    """Decode the data of a hold event; raises EventError."""
    if kind is HoldKind.PLACED:
        d = _fields(
            data, {"job_id", "team", "unit", "amount", "expires_us", "time_us"}, {"project"}
        )
        unit = d["unit"]
        if type(unit) is not str or unit not in (Unit.MONEY, Unit.GPU_MS):
            raise EventError(f"data.unit: a hold is in {Unit.MONEY} or {Unit.GPU_MS}")
        time_us = _int("data.time_us", d["time_us"], 1, MAX_TIME_US)
        return HoldPlaced(
            job_id=_text("data.job_id", d["job_id"]),
            team=_name("data.team", d["team"]),
            project=None if d.get("project") is None else _name("data.project", d["project"]),
            unit=Unit(unit),
            amount=_int("data.amount", d["amount"], 1, MAX_HOLD),
            expires_us=_int("data.expires_us", d["expires_us"], time_us, MAX_TIME_US),
            time_us=time_us,
        )
    d = _fields(data, {"job_id", "time_us"}, {"reason"})
    reason = d.get("reason") or ""
    if type(reason) is not str or len(reason) > 2048:
        raise EventError("data.reason: expected a string of at most 2048 characters")
    return HoldReleased(
        job_id=_text("data.job_id", d["job_id"]),
        time_us=_int("data.time_us", d["time_us"], 1, MAX_TIME_US),
        reason=reason,
    )


def hold_v0_to_v1(data: dict[str, Any]) -> dict[str, Any]:
    """v0 hold data → v1: a placement's `amount_micros` becomes `unit` money and `amount`."""
    if "amount_micros" not in data:
        return data
    out = {k: v for k, v in data.items() if k != "amount_micros"}
    out["unit"] = Unit.MONEY.value
    out["amount"] = data["amount_micros"]
    return out


HOLDS: Family[HoldEvent] = Family(
    name="hold",
    kinds={kind.value: kind for kind in HoldKind},
    to_data=hold_to_dict,
    from_data=hold_from_dict,
    wrap=hold_envelope,
    schema=HOLD_SCHEMA,
    label="jobs-topic event type",
    subject_is="job id",
    time_is="time_us",
)
REGISTRY.add(HOLDS, {(kind, 0): hold_v0_to_v1 for kind in HoldKind})


def hold_envelope_from_dict(obj: Any) -> HoldEnvelope:
    return decode_envelope(obj, HOLDS)


# ---------------------------------------------------------------------------- the fold


def _hold_postings(hold: OpenHold, amount: int) -> tuple[Posting, Posting]:
    """`amount` moved onto the hold (negative: off it)."""
    team = hold.team
    return (
        Posting(hold_account(team), hold.unit, amount, team, hold.project, None, hold.job_id),
        Posting(
            holds_outstanding_account(team),
            hold.unit,
            -amount,
            team,
            hold.project,
            None,
            hold.job_id,
        ),
    )


def _txn(
    txn_id: str,
    kind: TransactionKind,
    start_us: int,
    end_us: int,
    postings: Sequence[Posting],
    cause: tuple[str, ...],
    period: str,
) -> Transaction:
    return Transaction(
        txn_id=txn_id,
        kind=kind,
        start_us=start_us,
        end_us=max(end_us, start_us + 1),
        gpu_uuid="",
        model="",
        pool="",
        node="",
        postings=tuple(postings),
        cause=cause,
        period=period,
    )


@dataclass(frozen=True, slots=True)
class Settlement:
    """A settle transaction and the index of the last usage transaction it settles."""

    txn: Transaction
    last_usage: int


@dataclass(frozen=True, slots=True)
class HoldBookMark:
    open: Mapping[HoldKey, OpenHold]
    changed: Mapping[HoldKey, OpenHold]


class HoldBook:
    """The open holds during one batch: applies hold events, settles usage, expires holds, and
    remembers which holds changed (an amount of 0 means the hold is gone)."""

    def __init__(
        self,
        open_holds: Mapping[HoldKey, OpenHold],
        book: BookPeriod,
        baselines: Mapping[HoldKey, int] | None = None,
    ) -> None:
        self._open = dict(open_holds)
        self._book = book
        self._changed: dict[HoldKey, OpenHold] = {}
        self._baselines = dict(baselines or {})  # a global shard's: (job, unit) → usage settled
        self._moved: dict[HoldKey, int] = {}
        self._dropped: set[HoldKey] = set()

    def _set(self, hold: OpenHold) -> None:
        self._changed[hold.key] = hold
        if hold.amount:
            self._open[hold.key] = hold
        else:
            self._open.pop(hold.key, None)

    def open_amount(self, team: str, unit: Unit) -> int:
        return sum(h.amount for h in self._open.values() if h.team == team and h.unit == unit)

    def changed(self) -> list[OpenHold]:
        return list(self._changed.values())

    def baselines_changed(self) -> dict[HoldKey, int]:
        """The jobs' baselines `settle_ended` moved: (job, unit) → the usage it settled up to."""
        return dict(self._moved)

    def baselines_dropped(self) -> list[HoldKey]:
        """The baselines no placement can read any more (`finish`, `settle_ended`)."""
        return sorted(self._dropped)

    def finish(self, job_ids: Collection[str]) -> None:
        """A global shard's: `job_ids` ended for good, so no placement of theirs follows (the
        only reader of a baseline). Their open holds become `final`; their baselines with no
        open hold (of those the book was given) are dropped now."""
        for key, hold in sorted(self._open.items()):
            if key[0] in job_ids and not hold.final:
                self._set(replace(hold, final=True))
        for key in [k for k in sorted(self._baselines) if k[0] in job_ids and k not in self._open]:
            self._drop(key)

    def _drop(self, key: HoldKey) -> None:
        self._baselines.pop(key, None)
        self._moved.pop(key, None)
        self._dropped.add(key)

    def checkpoint(self) -> HoldBookMark:
        """The book as it is now, for `restore` when what follows is refused (only placements,
        releases and expiries are refused: a settlement's baselines need no mark)."""
        return HoldBookMark(dict(self._open), dict(self._changed))

    def restore(self, mark: HoldBookMark) -> None:
        self._open, self._changed = dict(mark.open), dict(mark.changed)

    def place(self, envelope: HoldEnvelope) -> Transaction | str:
        """The hold transaction, or why the placement is refused."""
        event = envelope.data
        assert isinstance(event, HoldPlaced)
        key = (event.job_id, event.unit)
        before = self._open.get(key)
        if before is not None and before.team != event.team:
            return f"job {event.job_id} already holds {event.unit} of team {before.team}"
        if before is None:  # a new hold starts past the usage earlier holds settled
            baseline, earlier = self._baselines.get(key, 0), 0
        elif before.expires_us <= event.time_us:  # a retry joins holds that ended unsettled
            baseline, earlier = before.baseline, before.amount
        else:
            baseline, earlier = before.baseline, before.earlier
        hold = OpenHold(
            event.job_id,
            event.unit,
            event.team,
            event.project,
            (before.amount if before else 0) + event.amount,
            max(event.expires_us, before.expires_us if before else 0),
            before.placed_by if before else envelope.id,
            baseline,
            earlier,
        )
        self._set(hold)
        return _txn(
            envelope.id,
            TransactionKind.HOLD,
            event.time_us,
            event.time_us + 1,
            _hold_postings(hold, event.amount),
            (envelope.id,),
            self._book(event.time_us),
        )

    def release(self, envelope: HoldEnvelope) -> Transaction | None:
        """Release what is left of every hold of the job; None when nothing is open."""
        event = envelope.data
        assert isinstance(event, HoldReleased)
        postings: list[Posting] = []
        for key, hold in sorted(self._open.items()):
            if key[0] == event.job_id:
                postings.extend(_hold_postings(hold, -hold.amount))
                self._set(replace(hold, amount=0))
        if not postings:
            return None
        return _txn(
            envelope.id,
            TransactionKind.HOLD_RELEASE,
            event.time_us,
            event.time_us + 1,
            postings,
            (envelope.id,),
            self._book(event.time_us),
        )

    def expire(self, now_us: int) -> list[Transaction]:
        """Release the holds whose expiry is not after `now_us` (the latest folded event)."""
        out = []
        for key, hold in sorted(self._open.items()):
            if hold.expires_us > now_us:
                continue
            self._set(replace(hold, amount=0))
            out.append(
                _txn(
                    event_id(
                        LEDGER_HOLDS_SOURCE,
                        f"{key[0]}/{key[1]}/{hold.placed_by}/expired",
                        hold.expires_us,
                    ),
                    TransactionKind.HOLD_RELEASE,
                    hold.expires_us,
                    hold.expires_us + 1,
                    _hold_postings(hold, -hold.amount),
                    (hold.placed_by,),
                    self._book(hold.expires_us),
                )
            )
        return out

    def end(self, envelope: HoldEnvelope) -> bool:
        """A global shard's release (`ledger.ingest.shards`): the job's holds end at the
        release's time (their `expires_us` lowered to it) and stay open until `settle_ended`
        settles them from the union's usage; whether any hold of the job is open."""
        event = envelope.data
        assert isinstance(event, HoldReleased)
        found = False
        for key, hold in sorted(self._open.items()):
            if key[0] == event.job_id:
                found = True
                if event.time_us < hold.expires_us:
                    self._set(replace(hold, expires_us=event.time_us))
        return found

    def settle_ended(
        self,
        through_us: int,
        usage: Mapping[HoldKey, int],
        covers: Collection[str] | None = None,
    ) -> list[Transaction]:
        """A global shard's settlement: each open hold that ended (released or expired) at or
        before the watermark `through_us` is settled once by its job's usage up to it past the
        hold's baseline (`min(usage − baseline, what is left)`, never below 0, kind
        `hold_settle`) and what is left released (kind `hold_release`), both booked at the
        hold's end; the job's baseline moves to that usage (`baselines_changed`), so a retry's
        hold is settled by the usage after it, not the earlier attempts' again, unless the hold
        is `final`: then no retry follows and the baseline is dropped. Only the holds
        of the jobs `covers` names (those whose usage `usage` gives; None: every job): any
        other waits for a watermark that gives its usage, never settled as if it used nothing.
        Ids derive from the hold's first placement and its end, so folding the same facts
        again makes the same ones."""
        out = []
        for key, hold in sorted(self._open.items()):
            if hold.expires_us > through_us or (covers is not None and key[0] not in covers):
                continue
            self._set(replace(hold, amount=0))
            used = usage.get(key, 0)
            settled = max(0, min(hold.amount, used - hold.baseline))
            if hold.final:  # no later placement reads it
                self._drop(key)
            elif used != hold.baseline:  # the job's, taken when the hold was first placed
                self._baselines[key] = self._moved[key] = used
            ends = f"{key[0]}/{key[1]}/{hold.placed_by}"
            parts = (
                (TransactionKind.HOLD_SETTLE, "settled", settled),
                (TransactionKind.HOLD_RELEASE, "ended", hold.amount - settled),
            )
            for kind, name, amount in parts:
                if amount:
                    out.append(
                        _txn(
                            event_id(LEDGER_HOLDS_SOURCE, f"{ends}/{name}", hold.expires_us),
                            kind,
                            hold.expires_us,
                            hold.expires_us + 1,
                            _hold_postings(hold, -amount),
                            (hold.placed_by,),
                            self._book(hold.expires_us),
                        )
                    )
        return out

    def settle(self, usage: Sequence[Transaction]) -> list[Settlement]:
        """Settle open holds with the consumer usage of their jobs in `usage`, in order: one
        transaction per (job, unit, booked period), never more than the hold has left."""
        if not self._open:
            return []
        groups: dict[tuple[str, Unit, str], list[tuple[int, Transaction, int]]] = {}
        for index, txn in enumerate(usage):
            if txn.kind is not TransactionKind.USAGE:
                continue
            for p in txn.postings:
                hold = self._open.get((p.job_id or "", p.unit))
                if hold is None or p.amount <= 0 or txn.start_us >= hold.expires_us:
                    continue  # usage after a hold expired does not settle it
                if not p.account.startswith(f"{AccountKind.CONSUMER}:"):
                    continue
                groups.setdefault((hold.job_id, p.unit, txn.period), []).append(
                    (index, txn, p.amount)
                )
        out = []
        for (job, unit, period), items in groups.items():
            hold = self._open.get((job, unit))
            if hold is None:
                continue
            amount = min(hold.amount, sum(a for _, _, a in items))
            self._set(replace(hold, amount=hold.amount - amount))
            ids = tuple(dict.fromkeys(t.txn_id for _, t, _ in items))
            digest = hashlib.blake2b(" ".join(ids).encode(), digest_size=8).hexdigest()
            end = max(t.end_us for _, t, _ in items)
            txn = _txn(
                event_id(LEDGER_HOLDS_SOURCE, f"{job}/{unit}/settle/{digest}", end),
                TransactionKind.HOLD_SETTLE,
                min(t.start_us for _, t, _ in items),
                end,
                _hold_postings(hold, -amount),
                ids,
                period,
            )
            out.append(Settlement(txn, max(i for i, _, _ in items)))
        return out


def open_holds_by_team(holds: Iterable[OpenHold]) -> dict[tuple[str, Unit], int]:
    """Open holds per (team, unit): the same numbers as the `hold:<team>` balances."""
    out: dict[tuple[str, Unit], int] = {}
    for hold in holds:
        out[(hold.team, hold.unit)] = out.get((hold.team, hold.unit), 0) + hold.amount
    return out
