"""The `approvals:` section: who approves a quota or budget request (`tally request`,
`POST /v1/requests`) and when it expires.

    approvals:
      budget: {finance_over: "1000.00"}   # money increases above this need finance
      quota: {admin_for_borrowing: true}  # raising a borrowing limit needs an admin
      expire_after_hours: 72

The section becomes `ledger.admin.requests.ApprovalPolicy`; whoever opens a request records
the roles it names then (`approvers_for`), so changing the section changes new requests only.
"""

from __future__ import annotations

from pydantic import Field

from ledger.admin.requests import HOUR_US, ApprovalPolicy
from tally.config_fields import Micros, Strict


class BudgetApprovals(Strict):
    """Without `finance_over`, finance or an admin approves any budget change."""

    finance_over: Micros | None = None  # a money budget increase above this needs finance


class QuotaApprovals(Strict):
    admin_for_borrowing: bool = True  # raising a borrowing limit needs an admin


class ApprovalsConfig(Strict):
    budget: BudgetApprovals = BudgetApprovals()
    quota: QuotaApprovals = QuotaApprovals()
    expire_after_hours: int = Field(72, ge=1, le=24 * 366)

    def policy(self) -> ApprovalPolicy:
        return ApprovalPolicy(
            finance_over=self.budget.finance_over,
            admin_for_borrowing=self.quota.admin_for_borrowing,
            expire_after_us=self.expire_after_hours * HOUR_US,
        )
