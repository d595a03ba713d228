"""The quotas the scheduler admits against: the configuration's, with every quota change the
ledger applies on top — a `QuotaSet` from `tally admin apply` and the quota an approved request
makes (`scheduler.requests` folds both off the `admin` topic, as the ledger does).

A change replaces its team's quota in that flavor (pool and model; a MIG profile's flavor is
`<model>/<profile>`) or adds one the team did not have; the newest change of a flavor wins
(the topic's order). A change for a team the scheduler is not configured with is passed over:
the scheduler cannot place for a team it has no queue rules for. Pure: values in, teams out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ledger.admin import QuotaKey, QuotaSet
from scheduler.model import Flavor, Quota, Team


def with_applied(configured: Iterable[Team], applied: Mapping[QuotaKey, QuotaSet]) -> list[Team]:
    """`configured` teams with the `applied` quota changes on top (see the module)."""
    changes: dict[str, dict[Flavor, QuotaSet]] = {}
    for (name, pool, model), event in applied.items():
        changes.setdefault(name, {})[Flavor(pool, model)] = event
    teams = []
    for team in configured:
        mine = dict(changes.get(team.name, {}))
        quotas = []
        for quota in team.quotas:
            change = mine.pop(quota.flavor) if quota.flavor in mine else None
            quotas.append(quota if change is None else _quota(quota.flavor, change))
        quotas.extend(_quota(flavor, event) for flavor, event in mine.items())
        teams.append(Team(team.name, tuple(quotas), team.cohort, team.weight))
    return teams


def _quota(flavor: Flavor, event: QuotaSet) -> Quota:
    return Quota(flavor, event.nominal_gpus, event.borrowing_limit, event.lending_limit)
