"""The `type` attribute of every event on the `admin` topic (`AdminKind`), in a module of its
own so both event modules (`events`, `request_events`) can name their kinds."""

from __future__ import annotations

from enum import StrEnum


class AdminKind(StrEnum):
    """The `type` attribute of every event on the `admin` topic."""

    BUDGET_GRANTED = "tally.admin.budget_granted"
    PRICE_SET = "tally.admin.price_set"
    TEAM_DEFINED = "tally.admin.team_defined"
    QUOTA_SET = "tally.admin.quota_set"
    ADJUSTMENT_RECORDED = "tally.admin.adjustment_recorded"
    PERIOD_CLOSED = "tally.admin.period_closed"
    BUDGET_POLICY_SET = "tally.admin.budget_policy_set"
    BUDGET_ALLOWANCE_GRANTED = "tally.admin.budget_allowance_granted"
    GPU_CORDONED = "tally.admin.gpu_cordoned"
    GPU_UNCORDONED = "tally.admin.gpu_uncordoned"
    REQUEST_OPENED = "tally.admin.request_opened"
    REQUEST_APPROVED = "tally.admin.request_approved"
    REQUEST_REJECTED = "tally.admin.request_rejected"
    REQUEST_EXPIRED = "tally.admin.request_expired"
    SHARDS_SEALED_THROUGH = "tally.admin.shards_sealed_through"
