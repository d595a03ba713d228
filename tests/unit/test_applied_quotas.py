"""The quotas the scheduler admits against: the configuration's with the applied quota changes
on top (`scheduler.applied_quotas`), and the request desk folding them off the admin topic —
`tally admin apply`'s `QuotaSet` and an approved request's quota alike."""

from __future__ import annotations

import pytest

from ledger.admin import QuotaSet
from scheduler.applied_quotas import with_applied
from scheduler.model import Flavor, Quota, Team

A100 = Flavor("a100", "A100")
H100 = Flavor("h100", "H100")
MIG = Flavor("a100", "A100/1g.10gb")
VISION = Team("vision", (Quota(A100, 8, 2, None), Quota(H100, 4)), cohort="research", weight=3)
LANGUAGE = Team("language", (Quota(A100, 4),), cohort="research")


def quota_set(team: str, flavor: Flavor, nominal: int, borrow: int | None = None) -> QuotaSet:
    return QuotaSet(team, flavor.pool, flavor.model, nominal, borrow, 1, "ada", "r", 0)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        pytest.param([], [VISION, LANGUAGE], id="no-change-the-configuration"),
        pytest.param(
            [quota_set("vision", A100, 10, 4)],
            [
                Team("vision", (Quota(A100, 10, 4, 1), Quota(H100, 4)), "research", 3),
                LANGUAGE,
            ],
            id="replaces-the-flavor-in-place",
        ),
        pytest.param(
            [quota_set("language", MIG, 7)],
            [VISION, Team("language", (Quota(A100, 4), Quota(MIG, 7, None, 1)), "research")],
            id="adds-a-flavor-the-team-had-not",
        ),
        pytest.param(
            [quota_set("physics", A100, 2)],
            [VISION, LANGUAGE],
            id="a-team-the-scheduler-does-not-know-is-passed-over",
        ),
        pytest.param(
            [quota_set("vision", H100, 0)],
            [
                Team("vision", (Quota(A100, 8, 2, None), Quota(H100, 0, None, 1)), "research", 3),
                LANGUAGE,
            ],
            id="down-to-zero",
        ),
    ],
)
def test_applied_changes_on_top_of_the_configuration(changes, expected):
    applied = {(c.team, c.pool, c.model): c for c in changes}
    assert with_applied([VISION, LANGUAGE], applied) == expected


def test_the_desk_keeps_the_newest_change_and_counts_each():
    from ledger.admin.codec import admin_envelope, encode_admin
    from ledger.admin.requests import ApprovalPolicy
    from scheduler.requests import RequestDesk

    desk = RequestDesk(ApprovalPolicy(), publisher=None)  # type: ignore[arg-type]  # reads only
    first = quota_set("vision", A100, 10)
    second = QuotaSet("vision", "a100", "A100", 12, None, None, "ada", "more", 1)
    for event in (first, second, first):  # the first again: resent, counted once
        desk.on_admin(encode_admin(admin_envelope(event))[1])
    assert desk.quota_changes == 2
    [team, _] = with_applied([VISION, LANGUAGE], desk.quotas)
    assert team.quotas[0] == Quota(A100, 12, None, None)
