"""Balance messages for the outbox: after a commit, one message per changed account (and per
affected team's budget account) for the compacted balances topic (`ledger.balances` says what
a message holds). A sharded ledger's shard (stamped) also lists, in a consumer account's
message, the account's usage so far per job (`job_usage`) of the jobs the commit charged and
those holding a GPU now, and in a team's budget its open holds per job (`open_holds`), what
readers project open holds with (`ledger.hold_projection`); at most `MAX_LISTED` of either,
else none (a budget's holds then project whole, on the safe side).

What a commit's messages need of the whole balances table (the current period, whether it
moved since the last messages, which teams have a budget) is kept between commits
(`BalanceFigures`, read once in one query, then moved by the rows each commit reads of its
changed accounts: the writer is the only one that moves the table, and its keys only grow);
the store forgets it when a commit rolls back. A commit then reads its changed accounts' rows,
and the budget rows only when a budget's status is published: one or two reads, not five.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, replace

import duckdb

from ledger.accounts import AccountKind, budget_account
from ledger.balances import (
    BalanceRow,
    JobAmount,
    ShardStamp,
    account_team,
    account_update,
    balance_key,
    balance_message_id,
    encode_balance_update,
    fold_rows,
)
from ledger.store.hot_tables import insert_rows, read_job_usage
from ledger.store.layout import first_row


@dataclass(frozen=True, slots=True)
class BalanceFigures:
    """What the balance messages need of the whole balances table: the newest period of a
    capacity account (`capacity_newest`) and of any account (`newest`), the teams with a budget
    account, and the current period the queued messages last named (`announced`, kept in
    `ledger_meta`)."""

    capacity_newest: str | None = None
    newest: str | None = None
    budgeted: frozenset[str] = frozenset()
    announced: str | None = None

    @property
    def current(self) -> str | None:
        """The ledger's current period: the newest a capacity account has, else the newest."""
        return self.capacity_newest or self.newest


def _newest(known: str | None, periods: Iterable[str]) -> str | None:
    return max((p for p in (known, *periods) if p is not None), default=None)


def moved_by(figures: BalanceFigures, rows: Iterable[BalanceRow]) -> BalanceFigures:
    """`figures` once the balances table holds `rows` (a commit's changed accounts, read back)."""
    rows = list(rows)
    capacity = f"{AccountKind.CAPACITY}:"
    budget = f"{AccountKind.BUDGET}:"
    return replace(
        figures,
        capacity_newest=_newest(
            figures.capacity_newest, (r.period for r in rows if r.account.startswith(capacity))
        ),
        newest=_newest(figures.newest, (r.period for r in rows)),
        budgeted=figures.budgeted
        | {r.account.partition(":")[2] for r in rows if r.account.startswith(budget)},
    )


@dataclass(frozen=True, slots=True)
class Publication:
    """Which accounts a commit publishes: its changed accounts and the budgets of the teams
    they touch, or of every budgeted team when the current period moved (`moved`)."""

    current: str | None
    moved: bool
    teams: frozenset[str]
    accounts: tuple[str, ...]


def publication(figures: BalanceFigures, changed: Collection[str]) -> Publication:
    """What a commit whose changed accounts are `changed` publishes, `figures` including its
    moves."""
    current = figures.current
    moved = current is not None and figures.announced != current
    touched = {
        account_team(a)
        for a in changed
        if a.split(":", 1)[0] in (AccountKind.CONSUMER, AccountKind.BUDGET, AccountKind.HOLD)
    }
    teams = figures.budgeted if moved else figures.budgeted & {t for t in touched if t}
    accounts = tuple(sorted(set(changed) | {budget_account(t) for t in teams}))
    return Publication(current, moved, frozenset(teams), accounts)


def read_figures(con: duckdb.DuckDBPyConnection) -> BalanceFigures:
    """The figures as the balances table and `ledger_meta` hold them now (one query)."""
    row = first_row(
        con.execute(
            "SELECT max(period) FILTER (account LIKE 'capacity:%'), max(period), "
            "list(DISTINCT account) FILTER (account LIKE 'budget:%'), "
            "(SELECT value FROM ledger_meta WHERE key = 'current_period') FROM balances"
        )
    )
    if row is None:
        return BalanceFigures()
    capacity, newest, budgets, announced = row
    return BalanceFigures(
        capacity,
        newest,
        frozenset(str(a).partition(":")[2] for a in budgets or ()),
        None if announced is None else str(announced),
    )


def _rows_of(con: duckdb.DuckDBPyConnection, accounts: Collection[str]) -> list[BalanceRow]:
    if not accounts:
        return []
    return fold_rows(
        con.execute(
            "SELECT account, unit, period, balance FROM balances "
            "WHERE account IN (SELECT unnest(?))",
            [sorted(accounts)],
        ).fetchall()
    )


def queue_balance_messages(
    con: duckdb.DuckDBPyConnection,
    accounts: set[str],
    topic: str,
    now: int,
    closed: frozenset[str],
    stamp: ShardStamp | None = None,
    jobs: Collection[str] = (),
    figures: BalanceFigures | None = None,
    superseding: bool = True,
) -> tuple[int, BalanceFigures]:
    """Queue one message per changed account (and per affected team's budget account);
    a queued message not yet sent for the same account is superseded. `stamp`: a sharded
    ledger's shard, whose messages are keyed by account and shard and list jobs lines and
    holds (module docstring); `jobs`: the jobs the commit charged; `figures`: as the previous
    commit left them (None: read here); `superseding`: whether the outbox may hold unsent
    messages (False: the writer knows it held none at the commit's start, and nothing of the
    commit went to `topic` before these). Returns the count queued and the figures now."""
    changed_rows = _rows_of(con, accounts)
    figures = moved_by(figures or read_figures(con), changed_rows)
    plan = publication(figures, accounts)
    teams, current = plan.teams, plan.current
    publish = list(plan.accounts)
    if not publish:  # e.g. a period closed on a ledger with no postings yet
        return 0, figures
    budget_rows: list[BalanceRow] = []
    if teams and current is not None:
        budget_rows = fold_rows(
            con.execute(
                "SELECT account, unit, period, balance FROM balances WHERE "
                "account LIKE 'budget:%' OR account LIKE 'hold:%' "
                "OR (account LIKE 'consumer:%' AND period = ?)",
                [current],
            ).fetchall()
        )
    budgets = {budget_account(t) for t in teams} - accounts
    rows = changed_rows + [r for r in budget_rows if r.account in budgets]
    lines: dict[str, list[JobAmount]] = {}
    holds: dict[str, list[JobAmount]] = {}
    if stamp is not None:
        consumers = {a for a in publish if a.startswith(f"{AccountKind.CONSUMER}:")}
        for account, job, unit, amount in read_job_usage(con, consumers, jobs):
            lines.setdefault(account, []).append(JobAmount(job, unit, amount))
        open_rows = (
            con.execute(
                "SELECT team, job_id, unit, amount, coalesce(baseline, 0), coalesce(earlier, 0) "
                "FROM open_holds WHERE list_contains(?, team) "
                "ORDER BY job_id, unit",
                [sorted(teams)],
            ).fetchall()
            if teams
            else []
        )
        for team, job, unit, amount, baseline, earlier in open_rows:
            holds.setdefault(str(team), []).append(
                JobAmount(str(job), str(unit), int(amount), int(baseline), int(earlier))
            )
    seq_row = first_row(con.execute("SELECT nextval('publish_seq')"))
    seq = int(seq_row[0]) if seq_row else 0
    messages = []
    for account in publish:
        update = account_update(
            account, rows, closed, current, seq, now, budget_rows, stamp, holds, lines
        )
        messages.append(
            (
                balance_message_id(account, seq, stamp),
                topic,
                balance_key(account, stamp),
                encode_balance_update(update),
                now,
            )
        )
    if superseding:
        con.execute(
            'DELETE FROM outbox WHERE NOT sent AND topic = ? AND "key" IN (SELECT unnest(?))',
            [topic, [m[2] for m in messages]],
        )
    insert_rows(con, "outbox", [(*m, False) for m in messages])
    if plan.moved:
        con.execute(
            "INSERT INTO ledger_meta VALUES ('current_period', ?) "
            "ON CONFLICT DO UPDATE SET value = excluded.value",
            [current],
        )
        figures = replace(figures, announced=current)
    return len(messages), figures
