"""Balances: the running balance per (account, unit, period), budgets as a projection of them,
and the messages of the compacted `balances` topic.

- The writer keeps a `balances` table in its hot database, updated in the same commit as the
  postings; it is a projection, always equal to the fold (sum) of every posting ever committed
  per (account, unit, period), and can be recomputed from them (`LedgerStore.rebuild_balances`).
- A team's budget for a period is never stored. Per budgeted unit (a unit the team was ever
  granted in):
      granted    = −balance(budget:<team>, unit, period)          grants credit the account
      consumed   = Σ balance(consumer:<team>/*, unit, period)     usage and adjustments
      open_holds = Σ balance(hold:<team>, unit, every period)     holds outlive periods
      available  = granted − consumed
      remaining  = granted − consumed − open_holds
- The *current period* is the latest period usage was booked into (the capacity accounts'
  latest period; before any usage, the latest period of anything). It follows event time, so a
  replay computes the same budgets.
- After each committed batch the writer queues, through its outbox, one message per changed
  account, keyed by the account: its balances in every open period, its totals over all periods
  and, for `budget:<team>`, the team's budget in the current period. A batch that changes a
  team's usage, holds or grants, or moves the current period, also re-publishes the team's
  `budget:` account. `seq` grows with every publishing commit, so a consumer can ignore a
  message older than one it has seen.
- A shard of a sharded ledger publishes its own balances, stamped (`ShardStamp`): keyed by
  (account, shard) (`balance_key`) with the shard and the epoch its writer holds it in in the
  value, so the shards' messages for one account do not replace each other on the compacted
  topic; a consumer sums an account over the shards and ignores a shard's message whose epoch
  is older than the newest it has seen for that shard (`ledger.shard_balances`). A whole
  ledger's messages are unstamped: keyed by the account, as they always were.
- A shard's messages also carry what readers project its open holds with
  (`ledger.hold_projection`): a budget its team's open holds per job (`BudgetStatus.holds`),
  a consumer account its usage so far per job (`BalanceUpdate.jobs`); at most `MAX_LISTED`
  of either (`listing_holds`), absent from a whole ledger's.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

import orjson

from ledger.accounts import AccountKind
from ledger.envelope import Envelope, encode_data, event_id
from ledger.errors import EventError


class BalanceType(StrEnum):
    UPDATED = "tally.balance"


BALANCE_TYPE = BalanceType.UPDATED
BALANCE_SOURCE = "tally://ledger/balances"
MAX_LISTED = 2_000  # jobs lines or holds in one message: it stays well under a broker's limit


@dataclass(frozen=True, slots=True)
class BalanceRow:
    account: str
    unit: str
    period: str
    balance: int


@dataclass(frozen=True, slots=True)
class BudgetLine:
    unit: str
    granted: int
    consumed: int
    open_holds: int

    @property
    def available(self) -> int:
        return self.granted - self.consumed

    @property
    def remaining(self) -> int:
        return self.granted - self.consumed - self.open_holds


@dataclass(frozen=True, slots=True)
class JobAmount:
    """An amount of `unit` of one job: an open hold's (in a budget) or a job's usage so far
    (in a consumer account's message). An open hold's `baseline` and `earlier` are its
    `ledger.holds.OpenHold`'s: the job's usage earlier holds' settlements accounted, and how
    much of the hold earlier attempts placed and ended (0 in a usage line, and in a message
    from before the fields)."""

    job_id: str
    unit: str
    amount: int
    baseline: int = 0
    earlier: int = 0


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    """`holds`: the team's open holds per job, which a sharded ledger's global shard lists so
    that readers can project them against the jobs' usage so far
    (`ledger.hold_projection`); None: not listed (a whole ledger's, or too many)."""

    team: str
    period: str
    lines: tuple[BudgetLine, ...]
    holds: tuple[JobAmount, ...] | None = None

    def line(self, unit: str) -> BudgetLine | None:
        return next((line for line in self.lines if line.unit == unit), None)


@dataclass(frozen=True, slots=True)
class ShardStamp:
    """The shard of a sharded ledger a balance message comes from, and the epoch its writer
    holds the shard in (a claim's epoch never goes backwards)."""

    shard: str
    epoch: int


@dataclass(frozen=True, slots=True)
class BalanceUpdate:
    """One message of the `balances` topic; `shard`: the sharded ledger's shard it is of
    (None: a whole ledger's); `jobs`: a samples shard's consumer account's usage so far per job
    (usage and reversals, every period) of the jobs its commit charged or that hold a GPU of
    the shard, what readers project open holds against (`ledger.shard_balances`)."""

    account: str
    seq: int
    as_of_us: int
    current_period: str | None
    periods: tuple[BalanceRow, ...]
    totals: tuple[tuple[str, int], ...]
    budget: BudgetStatus | None = None
    shard: ShardStamp | None = None
    jobs: tuple[JobAmount, ...] = ()


def account_team(account: str) -> str | None:
    """The team a consumer, budget or hold account belongs to."""
    kind, _, path = account.partition(":")
    if kind == AccountKind.CONSUMER:
        return path.partition("/")[0] or None
    if kind in (AccountKind.BUDGET, AccountKind.HOLD, AccountKind.HOLDS_OUTSTANDING):
        return path or None
    return None


def current_period(rows: Iterable[BalanceRow]) -> str | None:
    usage: str | None = None
    anything: str | None = None
    for row in rows:
        if anything is None or row.period > anything:
            anything = row.period
        if row.account.startswith(f"{AccountKind.CAPACITY}:") and (
            usage is None or row.period > usage
        ):
            usage = row.period
    return usage or anything


def budget_status(team: str, period: str, rows: Iterable[BalanceRow]) -> BudgetStatus | None:
    """The team's budget in `period`, from balance rows; None if it never had a grant.

    `rows` must hold the team's `budget:` and `hold:` rows of every period and its `consumer:`
    rows of `period`.
    """
    budget = f"{AccountKind.BUDGET}:{team}"
    hold = f"{AccountKind.HOLD}:{team}"
    consumer = f"{AccountKind.CONSUMER}:{team}/"
    units: set[str] = set()
    granted: dict[str, int] = {}
    consumed: dict[str, int] = {}
    held: dict[str, int] = {}
    for row in rows:
        if row.account == budget:
            units.add(row.unit)
            if row.period == period:
                granted[row.unit] = granted.get(row.unit, 0) - row.balance
        elif row.account == hold:
            held[row.unit] = held.get(row.unit, 0) + row.balance
        elif row.account.startswith(consumer) and row.period == period:
            consumed[row.unit] = consumed.get(row.unit, 0) + row.balance
    if not units:
        return None
    return BudgetStatus(
        team,
        period,
        tuple(
            BudgetLine(u, granted.get(u, 0), consumed.get(u, 0), held.get(u, 0))
            for u in sorted(units)
        ),
    )


def budget_statuses(rows: Collection[BalanceRow], period: str | None = None) -> list[BudgetStatus]:
    """Every budgeted team's budget in `period` (default: the current period)."""
    chosen = period or current_period(rows)
    if chosen is None:
        return []
    teams = sorted(
        {
            r.account.partition(":")[2]
            for r in rows
            if r.account.startswith(f"{AccountKind.BUDGET}:")
        }
    )
    found = [budget_status(team, chosen, rows) for team in teams]
    return [status for status in found if status is not None]


# ---------------------------------------------------------------------------- messages


def _budget_to_dict(status: BudgetStatus) -> dict[str, Any]:
    out: dict[str, Any] = {
        "team": status.team,
        "period": status.period,
        "lines": [
            {
                "unit": line.unit,
                "granted": line.granted,
                "consumed": line.consumed,
                "open_holds": line.open_holds,
                "available": line.available,
                "remaining": line.remaining,
            }
            for line in status.lines
        ],
    }
    if status.holds is not None:
        out["holds"] = _job_amounts_to_data(status.holds)
    return out


def _job_amounts_to_data(amounts: Iterable[JobAmount]) -> list[list[Any]]:
    """[job, unit, amount], with [baseline, earlier] after it only when either is not 0 (so a
    message without them reads as it did before the fields)."""
    return [
        [a.job_id, a.unit, a.amount, a.baseline, a.earlier]
        if a.baseline or a.earlier
        else [a.job_id, a.unit, a.amount]
        for a in amounts
    ]


def _job_amounts(value: Any) -> tuple[JobAmount, ...]:
    shape = "an array of [job, unit, amount] or [job, unit, amount, baseline, earlier]"
    if type(value) is not list:
        raise EventError(f"expected {shape}")
    out = []
    for item in value:
        if type(item) is not list or len(item) not in (3, 5):
            raise EventError(f"expected {shape}")
        job, unit, *numbers = item
        if type(job) is not str or type(unit) is not str:
            raise EventError("expected a job and a unit as strings")
        if any(type(n) is not int for n in numbers):
            raise EventError("expected an amount, a baseline and earlier as integers")
        out.append(JobAmount(job, unit, *numbers))
    return tuple(out)


def balance_message_id(account: str, seq: int, stamp: ShardStamp | None = None) -> str:
    if stamp is None:
        return event_id(BALANCE_SOURCE, account, seq)
    return event_id(BALANCE_SOURCE, f"{account}@{stamp.shard}/{stamp.epoch}", seq)


def balance_key(account: str, stamp: ShardStamp | None = None) -> bytes:
    """The message key: the account; a shard's, the JSON array [account, shard]."""
    return account.encode() if stamp is None else orjson.dumps([account, stamp.shard])


def encode_balance_update(update: BalanceUpdate) -> bytes:
    """The message value; its key is `balance_key`."""
    data: dict[str, Any] = {
        "account": update.account,
        "seq": update.seq,
        "current_period": update.current_period,
        "periods": [
            {"period": r.period, "unit": r.unit, "balance": r.balance} for r in update.periods
        ],
        "totals": [{"unit": u, "balance": b} for u, b in update.totals],
        "budget": None if update.budget is None else _budget_to_dict(update.budget),
    }
    if update.shard is not None:
        data["shard"] = {"name": update.shard.shard, "epoch": update.shard.epoch}
    if update.jobs:
        data["jobs"] = _job_amounts_to_data(update.jobs)
    return encode_data(
        Envelope(
            id=balance_message_id(update.account, update.seq, update.shard),
            type=BALANCE_TYPE,
            source=BALANCE_SOURCE,
            subject=update.account,
            time_us=update.as_of_us,
            schema=1,
            data=data,
        )
    )


def _int(obj: Any, key: str) -> int:
    value = obj.get(key) if type(obj) is dict else None
    if type(value) is not int:
        raise EventError(f"{key}: expected an integer")
    return value


def _str(obj: Any, key: str) -> str:
    value = obj.get(key) if type(obj) is dict else None
    if type(value) is not str:
        raise EventError(f"{key}: expected a string")
    return value


def decode_balance_update(value: bytes) -> BalanceUpdate:
    """Read one `balances` message; raises EventError for anything else."""
    try:
        obj = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise EventError(f"not JSON: {exc}") from exc
    if type(obj) is not dict or obj.get("type") != BALANCE_TYPE or obj.get("schema") != 1:
        raise EventError("not a schema-1 balance message")
    data = obj.get("data")
    if type(data) is not dict:
        raise EventError("data: expected an object")
    account = _str(data, "account")
    try:
        budget_obj = data.get("budget")
        budget = None
        if budget_obj is not None:
            budget = BudgetStatus(
                _str(budget_obj, "team"),
                _str(budget_obj, "period"),
                tuple(
                    BudgetLine(
                        _str(line, "unit"),
                        _int(line, "granted"),
                        _int(line, "consumed"),
                        _int(line, "open_holds"),
                    )
                    for line in budget_obj.get("lines", [])
                ),
                None if budget_obj.get("holds") is None else _job_amounts(budget_obj["holds"]),
            )
        current = data.get("current_period")
        shard = data.get("shard")
        return BalanceUpdate(
            account=account,
            seq=_int(data, "seq"),
            as_of_us=_int(obj, "time"),
            current_period=current if type(current) is str else None,
            periods=tuple(
                BalanceRow(account, _str(r, "unit"), _str(r, "period"), _int(r, "balance"))
                for r in data.get("periods", [])
            ),
            totals=tuple((_str(t, "unit"), _int(t, "balance")) for t in data.get("totals", [])),
            budget=budget,
            shard=None if shard is None else ShardStamp(_str(shard, "name"), _int(shard, "epoch")),
            jobs=_job_amounts(data.get("jobs", [])),
        )
    except (AttributeError, TypeError) as exc:
        raise EventError(f"malformed balance message: {exc}") from exc


def balance_update(
    account: str,
    rows: Iterable[BalanceRow],
    closed: Collection[str],
    current: str | None,
    seq: int,
    as_of_us: int,
    budget: BudgetStatus | None = None,
    shard: ShardStamp | None = None,
    jobs: Iterable[JobAmount] = (),
) -> BalanceUpdate:
    """The message for `account` from its balance rows (of every period); `shard`: the stamp
    of a sharded ledger's shard; `jobs`: its usage so far per job (a samples shard's)."""
    mine = sorted((r for r in rows if r.account == account), key=lambda r: (r.period, r.unit))
    totals: dict[str, int] = {}
    for row in mine:
        totals[row.unit] = totals.get(row.unit, 0) + row.balance
    return BalanceUpdate(
        account=account,
        seq=seq,
        as_of_us=as_of_us,
        current_period=current,
        periods=tuple(r for r in mine if r.period not in closed),
        totals=tuple(sorted(totals.items())),
        budget=budget,
        shard=shard,
        jobs=tuple(sorted(jobs, key=lambda a: (a.job_id, a.unit))),
    )


def listing_holds(
    status: BudgetStatus | None, stamp: ShardStamp | None, holds: Mapping[str, Sequence[JobAmount]]
) -> BudgetStatus | None:
    """A shard's budget with the team's open holds per job listed (`holds`: per team; none
    listed past `MAX_LISTED`, so readers project them whole); a whole ledger's unchanged."""
    if status is None or stamp is None:
        return status
    held = holds.get(status.team, ())
    return replace(status, holds=tuple(held)) if len(held) <= MAX_LISTED else status


def account_update(
    account: str,
    rows: Iterable[BalanceRow],
    closed: Collection[str],
    current: str | None,
    seq: int,
    as_of_us: int,
    budget_rows: Iterable[BalanceRow],
    stamp: ShardStamp | None,
    holds: Mapping[str, Sequence[JobAmount]],
    lines: Mapping[str, Sequence[JobAmount]],
) -> BalanceUpdate:
    """The outbox's message for `account`, as both stores build it: a budget account's status
    from `budget_rows` of the current period (a shard's with its team's open holds listed,
    `listing_holds`), and an account's usage so far per job from `lines` (none listed past
    `MAX_LISTED`)."""
    budget = None
    if account.startswith(f"{AccountKind.BUDGET}:") and current is not None:
        status = budget_status(account.partition(":")[2], current, budget_rows)
        budget = listing_holds(status, stamp, holds)
    listed = lines.get(account, ())
    jobs = listed if len(listed) <= MAX_LISTED else ()
    return balance_update(account, rows, closed, current, seq, as_of_us, budget, stamp, jobs)


def fold_rows(rows: Iterable[tuple[Any, ...]]) -> list[BalanceRow]:
    return [BalanceRow(str(a), str(u), str(p), int(b)) for a, u, p, b in rows]
