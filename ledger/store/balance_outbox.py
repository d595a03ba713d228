"""Balance messages for the outbox: after a commit, one message per changed account (and per
affected team's budget account) for the compacted balances topic (`ledger.balances` says what
a message holds). A sharded ledger's shard (stamped) also lists, in a consumer account's
message, the account's usage so far per job (`job_usage`) of the jobs the commit charged and
those holding a GPU now, and in a team's budget its open holds per job (`open_holds`), what
readers project open holds with (`ledger.hold_projection`); at most `MAX_LISTED` of either,
else none (a budget's holds then project whole, on the safe side)."""

from __future__ import annotations

from collections.abc import Collection

import duckdb
import pyarrow as pa

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


def queue_balance_messages(
    con: duckdb.DuckDBPyConnection,
    accounts: set[str],
    topic: str,
    now: int,
    closed: frozenset[str],
    stamp: ShardStamp | None = None,
    jobs: Collection[str] = (),
) -> int:
    """Queue one message per changed account (and per affected team's budget account);
    a queued message not yet sent for the same account is superseded. `stamp`: a sharded
    ledger's shard, whose messages are keyed by account and shard and list jobs lines and
    holds (module docstring); `jobs`: the jobs the commit charged."""
    row = first_row(
        con.execute(
            "SELECT max(period) FILTER (account LIKE 'capacity:%'), max(period) FROM balances"
        )
    )
    current = (row[0] or row[1]) if row else None
    meta = first_row(con.execute("SELECT value FROM ledger_meta WHERE key = 'current_period'"))
    moved = current is not None and (meta is None or meta[0] != current)
    budgeted = {
        str(a).partition(":")[2]
        for (a,) in con.execute(
            "SELECT DISTINCT account FROM balances WHERE account LIKE 'budget:%'"
        ).fetchall()
    }
    touched = {
        account_team(a)
        for a in accounts
        if a.split(":", 1)[0] in (AccountKind.CONSUMER, AccountKind.BUDGET, AccountKind.HOLD)
    }
    teams = budgeted if moved else budgeted & {t for t in touched if t}
    publish = sorted(accounts | {budget_account(t) for t in teams})
    if not publish:  # e.g. a period closed on a ledger with no postings yet
        return 0
    con.register("publish_accounts", pa.table({"account": publish}))
    rows = fold_rows(
        con.execute(
            "SELECT b.account, b.unit, b.period, b.balance FROM balances b "
            "SEMI JOIN publish_accounts p USING (account)"
        ).fetchall()
    )
    con.unregister("publish_accounts")
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
    con.execute(
        'DELETE FROM outbox WHERE NOT sent AND topic = ? AND "key" IN (SELECT unnest(?))',
        [topic, [m[2] for m in messages]],
    )
    insert_rows(con, "outbox", [(*m, False) for m in messages])
    if moved:
        con.execute(
            "INSERT INTO ledger_meta VALUES ('current_period', ?) "
            "ON CONFLICT DO UPDATE SET value = excluded.value",
            [current],
        )
    return len(messages)
