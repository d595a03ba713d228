"""A team's statement for one accounting period: what it cost, where, what was wasted, and its
budget.

The statement reads the postings *booked into* the period (see `ledger.read.reports`): the team's
consumer postings by project and by user, its allocated-but-idle waste, corrections (other kinds
than usage, and usage booked late from an earlier period), and — when idle sharing is asked
for — its share of unallocated capacity, exactly as `report cost --by team` would show it.

Budget: grants are `budget_grant` postings on `budget:<team>` booked into the period, one
budget per unit (GPU-ms or money). A grant credits the budget account, so its amount is
negative by the ledger's sign convention; the statement reports the magnitude of the net grant.
Used is the team's consumer postings in the same unit for the period (all kinds, so credits
lower it); remaining = granted − used, and may be negative (overspent). Open holds are not part
of a statement. With no grant the statement says there is no budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ledger.periods import Period
from ledger.read.reports import (
    CONSUMER_SQL,
    IDLE_LEG_SQL,
    IdleSharing,
    ReportQueries,
    cost_report,
    gpu_hours,
    period_of,
)
from ledger.read.texts import N_, Translate, english
from ledger.units import Unit, format_micros

BUDGET_ACCOUNT_PREFIX = "budget:"
BUDGET_GRANT_KIND = "budget_grant"


def budget_account(team: str) -> str:
    return f"{BUDGET_ACCOUNT_PREFIX}{team}"


@dataclass(frozen=True, slots=True)
class StatementLine:
    """One project or user of the team (`name` None: postings without that dimension)."""

    name: str | None
    gpu_ms: int
    money_micros: int
    idle_gpu_ms: int
    idle_waste_micros: int


@dataclass(frozen=True, slots=True)
class Budget:
    unit: Unit
    granted: int
    used: int

    @property
    def remaining(self) -> int:
        return self.granted - self.used


@dataclass(frozen=True, slots=True)
class TeamStatement:
    team: str
    period: str
    currency: str
    cost_centres: tuple[str, ...]
    gpu_ms: int
    money_micros: int
    idle_gpu_ms: int
    idle_waste_micros: int
    corrections_micros: int  # postings of any kind other than usage
    prior_period_micros: int  # usage and corrections whose interval began before the period
    sharing: IdleSharing
    shared_idle_micros: int
    by_project: tuple[StatementLine, ...]
    by_user: tuple[StatementLine, ...]
    budgets: tuple[Budget, ...]

    @property
    def total_micros(self) -> int:
        """The team's own cost plus its share of unallocated capacity."""
        return self.money_micros + self.shared_idle_micros

    def to_dict(self) -> dict[str, Any]:
        """The statement for JSON: integers exact, decimals as text beside them."""

        def money(micros: int) -> dict[str, Any]:
            return {"micros": micros, "amount": format_micros(micros, 6)}

        def line(item: StatementLine) -> dict[str, Any]:
            return {
                "name": item.name,
                "gpu_ms": item.gpu_ms,
                "gpu_hours": str(gpu_hours(item.gpu_ms, 6)),
                "cost": money(item.money_micros),
                "idle_gpu_ms": item.idle_gpu_ms,
                "idle_waste": money(item.idle_waste_micros),
            }

        return {
            "team": self.team,
            "period": self.period,
            "currency": self.currency,
            "cost_centres": list(self.cost_centres),
            "gpu_ms": self.gpu_ms,
            "gpu_hours": str(gpu_hours(self.gpu_ms, 6)),
            "cost": money(self.money_micros),
            "idle_gpu_ms": self.idle_gpu_ms,
            "idle_waste": money(self.idle_waste_micros),
            "corrections": money(self.corrections_micros),
            "prior_period": money(self.prior_period_micros),
            "idle_sharing": str(self.sharing),
            "shared_unallocated": money(self.shared_idle_micros),
            "total": money(self.total_micros),
            "by_project": [line(p) for p in self.by_project],
            "by_user": [line(u) for u in self.by_user],
            "budget": [
                {
                    "unit": str(b.unit),
                    "granted": b.granted,
                    "used": b.used,
                    "remaining": b.remaining,
                }
                for b in self.budgets
            ]
            or None,
        }

    def rows(self) -> tuple[list[str], list[list[Any]]]:
        """The statement flattened to one table for CSV: a total, projects, users, corrections,
        shared idle (when sharing), and budget lines (granted, used, remaining)."""
        headers = ["section", "name", "gpu_hours", "cost", "idle_gpu_hours", "idle_waste"]

        def figures(name: str | None, ms: int, money: int, idle_ms: int, waste: int) -> list[Any]:
            return [
                name,
                str(gpu_hours(ms, 6)),
                format_micros(money, 6),
                str(gpu_hours(idle_ms, 6)),
                format_micros(waste, 6),
            ]

        rows: list[list[Any]] = [
            [
                "total",
                *figures(
                    self.team,
                    self.gpu_ms,
                    self.money_micros,
                    self.idle_gpu_ms,
                    self.idle_waste_micros,
                ),
            ]
        ]
        for section, lines in (("project", self.by_project), ("user", self.by_user)):
            rows += [
                [
                    section,
                    *figures(i.name, i.gpu_ms, i.money_micros, i.idle_gpu_ms, i.idle_waste_micros),
                ]
                for i in lines
            ]
        rows.append(["corrections", None, None, format_micros(self.corrections_micros, 6)])
        rows.append(["prior_period", None, None, format_micros(self.prior_period_micros, 6)])
        if self.sharing is not IdleSharing.NONE:
            rows.append(
                [
                    "shared_unallocated",
                    str(self.sharing),
                    None,
                    _amount(Unit.MONEY, self.shared_idle_micros, 6),
                ]
            )
        for b in self.budgets:
            for name, amount in (
                ("granted", b.granted),
                ("used", b.used),
                ("remaining", b.remaining),
            ):
                value = _amount(b.unit, amount, 6)
                rows.append(
                    [
                        f"budget_{name}",
                        str(b.unit),
                        *((value, None) if b.unit is Unit.GPU_MS else (None, value)),
                    ]
                )
        return headers, [row + [None] * (len(headers) - len(row)) for row in rows]

    def render_text(self, tr: Translate = english) -> str:
        """The statement as a person reads it in a terminal (in English, or in the language
        `tr` translates into: `ledger.read.texts`)."""
        cur = self.currency

        def figure(label: str, text: str) -> str:
            return f"{tr(label).ljust(15)}{text}"

        out = [
            tr("Statement for team {team}, {period} ({currency})").format(
                team=self.team, period=self.period, currency=cur
            )
        ]
        if self.cost_centres:
            out.append(tr("Cost centre: {centres}").format(centres=", ".join(self.cost_centres)))
        out.append("")
        out.append(
            figure(
                N_("Cost:"),
                tr("{money} {currency} for {hours} GPU-hours").format(
                    money=format_micros(self.money_micros),
                    currency=cur,
                    hours=gpu_hours(self.gpu_ms),
                ),
            )
        )
        out.append(
            figure(
                N_("Idle waste:"),
                tr("{money} {currency} for {hours} GPU-hours allocated but idle").format(
                    money=format_micros(self.idle_waste_micros),
                    currency=cur,
                    hours=gpu_hours(self.idle_gpu_ms),
                ),
            )
        )
        if self.corrections_micros or self.prior_period_micros:
            out.append(
                figure(
                    N_("Corrections:"),
                    tr(
                        "{corrections} {currency}; prior-period postings {prior} {currency} "
                        "(included above)"
                    ).format(
                        corrections=format_micros(self.corrections_micros),
                        currency=cur,
                        prior=format_micros(self.prior_period_micros),
                    ),
                )
            )
        if self.sharing is not IdleSharing.NONE:
            out.append(
                figure(
                    N_("Shared idle:"),
                    tr("{money} {currency} of unallocated capacity ({sharing})").format(
                        money=format_micros(self.shared_idle_micros),
                        currency=cur,
                        sharing=self.sharing,
                    ),
                )
            )
            out.append(figure(N_("Total:"), f"{format_micros(self.total_micros)} {cur}"))
        for title, heading, lines in (
            ("project", N_("By project"), self.by_project),
            ("user", N_("By user"), self.by_user),
        ):
            out += ["", tr(heading), _table(title, lines, tr)]
        out.append("")
        if not self.budgets:
            out.append(
                tr("Budget: no budget granted to {team} for {period}").format(
                    team=self.team, period=self.period
                )
            )
        else:
            out.append(tr("Budget"))
            out.append(
                _simple_table(
                    [N_("UNIT"), N_("GRANTED"), N_("USED"), N_("REMAINING")],
                    [
                        [
                            _unit_label(b.unit, cur, tr),
                            _amount(b.unit, b.granted),
                            _amount(b.unit, b.used),
                            _amount(b.unit, b.remaining),
                        ]
                        for b in self.budgets
                    ],
                    tr,
                )
            )
        return "\n".join(out)


def _unit_label(unit: Unit, currency: str, tr: Translate = english) -> str:
    return {Unit.GPU_MS: tr("GPU-hours"), Unit.MONEY: currency}.get(unit, str(unit))


def _amount(unit: Unit, amount: int, places: int = 2) -> str:
    if unit is Unit.MONEY:
        return format_micros(amount, places)
    if unit is Unit.GPU_MS:
        return str(gpu_hours(amount, max(places, 3)))
    return str(amount)


TABLE_HEADINGS = {  # a statement table's column headings (msgids, translated where shown)
    "project": N_("PROJECT"),
    "user": N_("USER"),
    "gpu_hours": N_("GPU_HOURS"),
    "cost": N_("COST"),
    "idle_gpu_hours": N_("IDLE_GPU_HOURS"),
    "idle_waste": N_("IDLE_WASTE"),
}


def _table(title: str, lines: tuple[StatementLine, ...], tr: Translate = english) -> str:
    if not lines:
        return tr("  (no usage)")
    return _simple_table(
        [TABLE_HEADINGS[h] for h in (title, "gpu_hours", "cost", "idle_gpu_hours", "idle_waste")],
        [
            [
                item.name or "-",
                str(gpu_hours(item.gpu_ms)),
                format_micros(item.money_micros),
                str(gpu_hours(item.idle_gpu_ms)),
                format_micros(item.idle_waste_micros),
            ]
            for item in lines
        ],
        tr,
    )


def _simple_table(headers: list[str], rows: list[list[str]], tr: Translate = english) -> str:
    """`headers` (English headings, `TABLE_HEADINGS`' style) translated, left column
    left-aligned, the others right-aligned."""
    headers = [tr(h) for h in headers]
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    head = [headers[0].ljust(widths[0])]
    head += [h.rjust(w) for h, w in zip(headers[1:], widths[1:], strict=True)]
    out = ["  ".join(head).rstrip()]
    for row in rows:
        cells = [row[0].ljust(widths[0])]
        cells += [v.rjust(w) for v, w in zip(row[1:], widths[1:], strict=True)]
        out.append("  ".join(cells).rstrip())
    return "\n".join(out)


# One scan of the team's consumer postings in the period (their rollups,
# `ledger.store.rollup_files`: hours never straddle a month's edge), grouped three ways;
# GROUPING says which: 1 by project ("user" rolled up), 2 by user ("project" rolled up), 3 the
# team's total.
_STATEMENT_SQL = (
    'SELECT GROUPING("project", "user") AS grouping_set, "project", "user", '
    "coalesce(sum(amount) FILTER (unit = 'gpu_ms'), 0), "
    "coalesce(sum(amount) FILTER (unit = 'money_micros'), 0), "
    f"coalesce(sum(amount) FILTER (unit = 'gpu_ms' AND {IDLE_LEG_SQL}), 0), "
    f"coalesce(sum(amount) FILTER (unit = 'money_micros' AND {IDLE_LEG_SQL}), 0), "
    "coalesce(sum(amount) FILTER (unit = 'energy_mj'), 0), "
    "coalesce(sum(amount) FILTER (unit = 'money_micros' AND kind <> 'usage'), 0), "
    "coalesce(sum(amount) FILTER (unit = 'money_micros' AND NOT "
    "(start_us >= ? AND start_us < ?)), 0), "
    "coalesce(string_agg(DISTINCT cost_centre, ',' ORDER BY cost_centre), '') "
    f"FROM {{rollups}} WHERE {CONSUMER_SQL} AND team = ? AND period = ? "
    'GROUP BY GROUPING SETS (("project"), ("user"), ())'
)


def team_statement(
    queries: ReportQueries,
    team: str,
    period: Period | str,
    currency: str,
    sharing: IdleSharing = IdleSharing.NONE,
) -> TeamStatement:
    """The statement of `team` for `period` (a `YYYY-MM` label, a month of the ledger's time
    zone, or a `Period`)."""
    chosen = period_of(period, queries.zone)
    assert chosen is not None
    rows = queries.rows(
        _STATEMENT_SQL, [chosen.start_us, chosen.end_us, team, chosen.label], booked=chosen.label
    )
    by_set: dict[int, list[tuple[Any, ...]]] = {1: [], 2: [], 3: []}
    for row in rows:
        by_set[int(row[0])].append(row[1:])
    # the () grouping set: the team's totals (absent when it has no postings in the period)
    totals = by_set[3][0] if by_set[3] else (None, None, 0, 0, 0, 0, 0, 0, 0, "")
    _, _, gpu_ms, money, idle_ms, idle_money, energy, corrections, prior, centres = totals
    grants = queries.rows(
        "SELECT unit, sum(amount) FROM {daily} "
        "WHERE account = ? AND kind = ? AND period = ? GROUP BY unit ORDER BY unit",
        [budget_account(team), BUDGET_GRANT_KIND, chosen.label],
        booked=chosen.label,
    )
    used_by_unit = {
        Unit.GPU_MS.value: int(gpu_ms),
        Unit.MONEY.value: int(money),
        Unit.ENERGY_MJ.value: int(energy),
    }
    budgets = tuple(
        Budget(Unit(unit), abs(int(total)), used_by_unit.get(unit, 0))
        for unit, total in grants
        if unit in {u.value for u in Unit}
    )
    shared = 0
    if sharing is not IdleSharing.NONE:
        by_team = cost_report(queries, ("team",), chosen, sharing)
        shared = sum(line.shared_idle_micros for line in by_team.lines if line.keys == (team,))

    def lines(grouped: list[tuple[Any, ...]], key: int) -> tuple[StatementLine, ...]:
        found = [
            StatementLine(row[key], int(row[2]), int(row[3]), int(row[4]), int(row[5]))
            for row in grouped
        ]
        # as `cost_report` orders its lines: most money first, then by key (None last)
        found.sort(key=lambda line: (-line.money_micros, line.name is None, line.name or ""))
        return tuple(found)

    return TeamStatement(
        team=team,
        period=chosen.label,
        currency=currency,
        cost_centres=tuple(c for c in str(centres or "").split(",") if c),
        gpu_ms=int(gpu_ms),
        money_micros=int(money),
        idle_gpu_ms=int(idle_ms),
        idle_waste_micros=int(idle_money),
        corrections_micros=int(corrections),
        prior_period_micros=int(prior),
        sharing=sharing,
        shared_idle_micros=shared,
        by_project=lines(by_set[1], 0),
        by_user=lines(by_set[2], 1),
        budgets=budgets,
    )
