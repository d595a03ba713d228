"""Admin events: the vocabulary of the `admin` topic, its strict codec, and their ledger effects.

Budgets, prices, teams, quotas, adjustments, period closes and GPU cordons are events like any
other, so the configuration's history is itself in the ledger. Every event carries who
(`actor`), why (`reason`) and from when (`effective_us`).

Invariants:
- every dataclass here is frozen and slotted and holds tuples, never lists;
- an envelope's `id` is derived from its content (type, entity, data and effective time) with
  `ledger.events.event_id`, so a resend is the same event; its `subject` is the entity it is
  keyed by on the topic (team, model, account or transaction, period, cordoned GPU or node);
- decoding is strict (unknown or missing fields, a float, bool or string where an integer
  belongs, an unknown unit, an invalid name or period are errors) and never raises: bad input
  becomes a `DeadLetter`; it goes through the generic codec (`ledger.envelope`), `ADMIN` being
  this family;
- effects are pure: `grant_transaction`, `adjustment_transaction` and `reversal_transaction`
  return balanced transactions; nothing is ever updated or deleted, a correction is a new
  transaction;
- `plan_admin` is the diff behind `tally admin apply`: desired state minus the applied state,
  so applying the same file twice emits nothing the second time.

Modules: `events` (the types and limits), `codec` (encoding, decoding, `ADMIN`), `effects`
(transactions), `recurring` (the grants recurring budget policies make, and carry-over),
`view` (`AppliedAdmin`, `AdminView`) and `plan` (`plan_admin`, `describe`);
this package re-exports their public names, so callers import from `ledger.admin`.

Schemas of admin event data (every `tally.admin.*` type):
- v1 (current): the fields of the event's dataclass, as `admin_event_to_dict` writes them;
- v0: the first `tally admin` named who acted `by` (not `actor`) and recorded no `reason`;
  `admin_v0_to_v1` upcasts it (`actor` ← `by`, `reason` ← `V0_REASON`). An upcast event's id
  is the one its v1 form derives. `tally.admin.shards_sealed_through` (`sealed_events`, the
  ledger's own cross-shard fact) began at v1 and has no v0.
"""

from ledger.admin.codec import (
    ADMIN,
    Decoder,
    admin_envelope,
    admin_envelope_from_dict,
    admin_envelope_to_dict,
    admin_event_from_dict,
    admin_event_to_dict,
    admin_v0_to_v1,
    decode_admin_message,
    encode_admin,
    validate_admin,
)
from ledger.admin.effects import adjustment_transaction, grant_transaction, reversal_transaction
from ledger.admin.events import (
    ACTION_OF,
    ADJUSTABLE,
    ADMIN_SOURCE,
    BUDGET_UNITS,
    CURRENT_ADMIN_SCHEMA,
    DEFAULT_ADJUSTMENTS,
    DEFAULT_FUNDING,
    EVENT_CLASSES,
    MAX_AMOUNT,
    MAX_REASON,
    REVERSIBLE,
    V0_REASON,
    AdjustmentRecorded,
    AdminEnvelope,
    AdminEvent,
    BudgetAllowanceGranted,
    BudgetGranted,
    BudgetPolicySet,
    Cadence,
    CarryOver,
    GpuCordoned,
    GpuUncordoned,
    PeriodClosed,
    PriceSet,
    QuotaSet,
    TeamDefined,
)
from ledger.admin.kinds import AdminKind
from ledger.admin.plan import (
    AdminPlan,
    BudgetSpec,
    DesiredState,
    PolicySpec,
    PriceSpec,
    QuotaSpec,
    TeamSpec,
    describe,
    plan_admin,
)
from ledger.admin.recurring import (
    AppliedPolicy,
    allowance_transaction,
    budget_figures,
    carry_amount,
    plan_allowances,
)
from ledger.admin.sealed_events import JobUsage, ShardsSealedThrough, TeamUsage
from ledger.admin.view import (
    AdminView,
    AppliedAdmin,
    BudgetKey,
    QuotaKey,
    applied_from_dict,
    applied_to_dict,
)

__all__ = [
    "ACTION_OF",
    "ADJUSTABLE",
    "ADMIN",
    "ADMIN_SOURCE",
    "BUDGET_UNITS",
    "CURRENT_ADMIN_SCHEMA",
    "DEFAULT_ADJUSTMENTS",
    "DEFAULT_FUNDING",
    "EVENT_CLASSES",
    "MAX_AMOUNT",
    "MAX_REASON",
    "REVERSIBLE",
    "V0_REASON",
    "AdjustmentRecorded",
    "AdminEnvelope",
    "AdminEvent",
    "AdminKind",
    "AdminPlan",
    "AdminView",
    "AppliedAdmin",
    "AppliedPolicy",
    "BudgetAllowanceGranted",
    "BudgetGranted",
    "BudgetKey",
    "BudgetPolicySet",
    "BudgetSpec",
    "Cadence",
    "CarryOver",
    "Decoder",
    "DesiredState",
    "GpuCordoned",
    "GpuUncordoned",
    "JobUsage",
    "PeriodClosed",
    "PolicySpec",
    "PriceSet",
    "PriceSpec",
    "QuotaKey",
    "QuotaSet",
    "QuotaSpec",
    "ShardsSealedThrough",
    "TeamDefined",
    "TeamSpec",
    "TeamUsage",
    "adjustment_transaction",
    "admin_envelope",
    "admin_envelope_from_dict",
    "admin_envelope_to_dict",
    "admin_event_from_dict",
    "admin_event_to_dict",
    "admin_v0_to_v1",
    "allowance_transaction",
    "applied_from_dict",
    "applied_to_dict",
    "budget_figures",
    "carry_amount",
    "decode_admin_message",
    "describe",
    "encode_admin",
    "grant_transaction",
    "plan_admin",
    "plan_allowances",
    "reversal_transaction",
    "validate_admin",
]
