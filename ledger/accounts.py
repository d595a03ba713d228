"""Account names and kinds.

An account name is `<kind>:<path>`; the path is `/`-separated and its meaning depends on the kind:

- `consumer:<team>/<project>`   who used GPU time (users and jobs are dimensions on postings)
- `capacity:<pool>/<model>`     the physical GPUs of a pool and model; credited for every GPU-ms
- `unallocated:<pool>/<model>`  GPU time nobody held (idle capacity)
- `budget:<team>`               budget grants, credited (negative) per period and unit
- `funding:<cost centre>`       the counter-account of grants, debited
- `hold:<team>`                 usage reserved for admitted jobs and not yet metered (open holds)
- `holds-outstanding:<team>`    the counter-account of holds
- `adjustments:<name>`          the counter-account of manual adjustments (`adjustments:manual`)

Invariant: for every interval, debits to consumer and unallocated accounts equal the credit to
the capacity account, so the capacity balance is minus the physical GPU time of the fleet.
"""

from __future__ import annotations

from enum import StrEnum
from functools import lru_cache

UNKNOWN_PROJECT = "-"


class AccountKind(StrEnum):
    CONSUMER = "consumer"
    CAPACITY = "capacity"
    UNALLOCATED = "unallocated"
    BUDGET = "budget"
    FUNDING = "funding"
    HOLD = "hold"
    HOLDS_OUTSTANDING = "holds-outstanding"
    ADJUSTMENTS = "adjustments"


def consumer_account(team: str, project: str | None) -> str:
    return f"{AccountKind.CONSUMER}:{team}/{project or UNKNOWN_PROJECT}"


def capacity_account(pool: str, model: str) -> str:
    return f"{AccountKind.CAPACITY}:{pool}/{model}"


def unallocated_account(pool: str, model: str) -> str:
    return f"{AccountKind.UNALLOCATED}:{pool}/{model}"


def budget_account(team: str) -> str:
    return f"{AccountKind.BUDGET}:{team}"


def funding_account(cost_centre: str) -> str:
    return f"{AccountKind.FUNDING}:{cost_centre}"


def hold_account(team: str) -> str:
    return f"{AccountKind.HOLD}:{team}"


def holds_outstanding_account(team: str) -> str:
    return f"{AccountKind.HOLDS_OUTSTANDING}:{team}"


@lru_cache(maxsize=65_536)  # a ledger names few accounts, each in many postings
def account_kind(account: str) -> AccountKind:
    """The kind of an account name; raises ValueError for a name of no known kind."""
    kind, sep, path = account.partition(":")
    if not sep or not path:
        raise ValueError(f"{account!r} is not an account name")
    return AccountKind(kind)
