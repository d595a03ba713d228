"""The scheduler's desk for quota and budget requests (`ledger.admin.requests`): the API opens,
approves and rejects requests here, and reads them back.

Requests are admin events: the desk writes each step on the `admin` topic (`AdminPublisher`)
and folds the topic as the ledger does (`fold_request`, read from the beginning by the
service's feeds, a resent event counted once), so a step is checked here before it is sent —
the caller's permission, the request open and unexpired, an approver the request names, never
the requester — and again by the ledger, which alone applies an approval's grant or quota. The
desk folds what it sent at once, so a caller reads its own step back before the feed brings it.
The desk's view is the topic's: an approval the ledger refuses (its grant falls in a period
closed meanwhile) shows as approved here; the ledger's request projection is the record.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ledger.admin import QuotaKey, QuotaSet, admin_envelope, decode_admin_message, encode_admin
from ledger.admin.events import ACTION_OF, AdminEnvelope, AdminEvent
from ledger.admin.request_events import REQUEST_CLASSES, RequestEvent
from ledger.admin.requests import ApprovalPolicy, RequestState, fold_request, refusal
from ledger.roles import admin_event_refusal


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
            made, _ = fold_request(self.states, event)
            if made is not None and isinstance(made.data, QuotaSet):
                self._fold(made)

    def refusal(self, event: RequestEvent) -> str | None:
        """Why the ledger would refuse `event` as the requests stand, or None."""
        return refusal(self.states, event)

    async def send(self, event: AdminEvent) -> AdminEnvelope:
        """Publish `event` (raises `BrokerUnavailable`), then fold it."""
        envelope = admin_envelope(event)
        await self.publisher.publish_admin([encode_admin(envelope)])
        self._fold(envelope)
        return envelope
