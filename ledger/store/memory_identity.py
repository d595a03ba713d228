"""The memory store's job identity (`ledger.job_owners`): job key → owner, and the suspense
transactions awaiting an owner, in the order they were committed (as `hot_identity`)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from ledger.events import Owner
from ledger.store.port import StateChanges


@dataclass(slots=True)
class JobIdentity:
    owners: dict[str, Owner] = field(default_factory=dict)
    awaiting: dict[tuple[str, str], None] = field(default_factory=dict)  # (key, txn), ordered

    def copy(self) -> JobIdentity:
        return JobIdentity(dict(self.owners), dict(self.awaiting))

    def apply(self, changes: StateChanges) -> None:
        for key, owner in changes.job_owners.items():
            self.owners.setdefault(key, owner)  # a known key keeps its first owner
        gone = set(changes.resolved)
        if gone:
            self.awaiting = {pair: None for pair in self.awaiting if pair[1] not in gone}
        for pair in changes.awaiting:
            self.awaiting.setdefault(pair, None)

    def job_owners(self, keys: Collection[str]) -> dict[str, Owner]:
        return {k: self.owners[k] for k in sorted(keys) if k in self.owners}

    def awaiting_owner(self, keys: Collection[str]) -> dict[str, tuple[str, ...]]:
        wanted = set(keys)
        found: dict[str, list[str]] = {}
        for key, txn in self.awaiting:
            if key in wanted:
                found.setdefault(key, []).append(txn)
        return {k: tuple(v) for k, v in sorted(found.items())}
