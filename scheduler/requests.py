"""The scheduler's desk for quota and budget requests (`ledger.admin.requests`): the API opens,
approves and rejects requests here, and reads them back.

Requests are admin events: the desk writes each step on the `admin` topic (`AdminPublisher`)
and folds the topic as the ledger does (`fold_request`, read from the beginning by the
service's feeds, a resent event counted once), so a step is checked here before it is sent —
the caller's permission, the request open and unexpired, an approver the request names, never
the requester — and again by the ledger, which alone applies an approval's grant or quota. The
desk folds what it sent at once, so a caller reads its own step back before the feed brings it.
The ledger may still refuse a step the desk let through (an approval whose grant falls in a
period closed meanwhile): it says so on the alerts topic (`tally.request.refused`, the refused
step's event id and the reason), which the service's feeds hand to `on_alert`. The desk then
undoes that step — the request is as it was before it, with the ledger's reason (shown as
`refused`), and a quota the approval set is taken back — whichever of the step and the
refusal it reads first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from ledger.admin import QuotaKey, QuotaSet, admin_envelope, decode_admin_message, encode_admin
from ledger.admin.events import ACTION_OF, AdminEnvelope, AdminEvent
from ledger.admin.request_events import REQUEST_CLASSES, RequestEvent
from ledger.admin.requests import (
    ApprovalPolicy,
    RequestState,
    fold_request,
    refusal,
    refused_step,
)
from ledger.errors import EventError
from ledger.fleet_alerts import FleetKind, RequestAlert, decode_any_alert
from ledger.roles import admin_event_refusal

_QuotaUndo = tuple[QuotaKey, QuotaSet | None]  # a quota key and what it held before


class AdminPublisher(Protocol):
    """Publishes admin events ((key, value) messages) on the admin topic."""

    async def publish_admin(self, messages: Sequence[tuple[bytes, bytes]]) -> None:
        """Send and wait for every acknowledgement; raises `BrokerUnavailable` if not."""
        ...


class RequestDesk:
    """The requests as the admin topic says (`states`), the teams' applied quotas (`quotas`:
    to tell whether a request raises a borrowing limit, and what the scheduler admits against,
    `scheduler.applied_quotas`), the policy new requests record."""

    def __init__(self, policy: ApprovalPolicy, publisher: AdminPublisher) -> None:
        self.policy = policy
        self.publisher = publisher
        self.states: dict[str, RequestState] = {}
        self.quotas: dict[QuotaKey, QuotaSet] = {}
        self.quota_changes = 0  # how many quota changes `quotas` has taken (it grows on each)
        self._seen: set[str] = set()
        self._refused: dict[str, str] = {}  # step event id → the ledger's reason
        # step event id → (the request before it, the quota its effect replaced), the latest
        # step of each request only (`_latest`): what undoing a refused step restores
        self._undo: dict[str, tuple[RequestState, _QuotaUndo | None]] = {}
        self._latest: dict[str, str] = {}  # request id → its latest step's event id

    def on_admin(self, value: bytes | None) -> None:
        """Fold one `admin` message (other events and what does not decode are passed over)."""
        envelopes, _ = decode_admin_message(value)
        for envelope in envelopes:
            self._fold(envelope)

    def _fold(self, envelope: AdminEnvelope) -> None:
        if envelope.id in self._seen:
            return
        self._seen.add(envelope.id)
        event = envelope.data
        action = ACTION_OF.get(event.KIND)
        if action is None or admin_event_refusal(action, event.role) is not None:
            return  # the ledger refuses it too
        if isinstance(event, QuotaSet):
            self.quotas[(event.team, event.pool, event.model)] = event
            self.quota_changes += 1
        elif isinstance(event, REQUEST_CLASSES):
            reason = self._refused.get(envelope.id)
            if reason is not None:  # the ledger's refusal came first
                refused_step(self.states, event, reason)
                return
            before = self.states.get(event.request_id)
            made, problem = fold_request(self.states, event)
            if problem is not None:
                return
            quota: _QuotaUndo | None = None
            if made is not None and isinstance(made.data, QuotaSet):
                key = (made.data.team, made.data.pool, made.data.model)
                quota = (key, self.quotas.get(key))
                self._fold(made)
            old = self._latest.pop(event.request_id, None)
            self._undo.pop(old or "", None)
            if before is not None:
                self._latest[event.request_id] = envelope.id
                self._undo[envelope.id] = (before, quota)

    def on_alert(self, value: bytes | None) -> None:
        """Fold one `alerts` message: a `tally.request.refused` undoes the step it names (other
        alerts and what does not decode are passed over)."""
        if not value:
            return
        try:
            alert = decode_any_alert(value)
        except EventError:
            return
        if not isinstance(alert, RequestAlert) or alert.kind is not FleetKind.REQUEST_REFUSED:
            return
        if not alert.step or alert.step in self._refused:
            return
        self._refused[alert.step] = alert.comment
        undo = self._undo.pop(alert.step, None)
        if undo is None:
            return  # not folded yet (or not the request's latest step): nothing to take back
        before, quota = undo
        self._latest.pop(before.request_id, None)
        self.states[before.request_id] = replace(before, refused=alert.comment)
        if quota is not None:
            key, replaced = quota
            if replaced is None:
                self.quotas.pop(key, None)
            else:
                self.quotas[key] = replaced
            self.quota_changes += 1

    def refusal(self, event: RequestEvent) -> str | None:
        """Why the ledger would refuse `event` as the requests stand, or None."""
        return refusal(self.states, event)

    async def send(self, event: AdminEvent) -> AdminEnvelope:
        """Publish `event` (raises `BrokerUnavailable`), then fold it."""
        envelope = admin_envelope(event)
        await self.publisher.publish_admin([encode_admin(envelope)])
        self._fold(envelope)
        return envelope
