"""The memory store's job identity (`ledger.job_owners`): job key → owner, and the transactions
awaiting an owner, in the order they were committed, each with its end time (as
`hot_identity`); and the store's reads of them (`MemoryIdentityReads`, a base of
`MemoryStore`)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from ledger.events import Owner
from ledger.postings import Transaction
from ledger.store.port import StateChanges


@dataclass(slots=True)
class JobIdentity:
    owners: dict[str, Owner] = field(default_factory=dict)
    awaiting: dict[tuple[str, str], int] = field(default_factory=dict)  # (key, txn) → end

    def copy(self) -> JobIdentity:
        return JobIdentity(dict(self.owners), dict(self.awaiting))

    def apply(self, changes: StateChanges) -> None:
        for key, owner in changes.job_owners.items():
            self.owners.setdefault(key, owner)  # a known key keeps its first owner
        gone = set(changes.resolved)
        cutoffs = changes.forget_awaiting
        if gone or cutoffs:
            self.awaiting = {
                (key, txn): end
                for (key, txn), end in self.awaiting.items()
                if txn not in gone and end >= cutoffs.get(key, end)
            }
        for key, txn, end in changes.awaiting:
            self.awaiting.setdefault((key, txn), end)

    def job_owners(self, keys: Collection[str]) -> dict[str, Owner]:
        return {k: self.owners[k] for k in sorted(keys) if k in self.owners}

    def awaiting_owner(self, keys: Collection[str]) -> dict[str, tuple[str, ...]]:
        wanted = set(keys)
        found: dict[str, list[str]] = {}
        for key, txn in self.awaiting:
            if key in wanted:
                found.setdefault(key, []).append(txn)
        return {k: tuple(v) for k, v in sorted(found.items())}


class MemoryIdentityReads:
    """The identity reads of the store port, over the store's `JobIdentity` and transactions."""

    def _identity(self) -> tuple[JobIdentity, Mapping[str, Transaction]]:
        raise NotImplementedError

    def job_owners(self, keys: Collection[str]) -> dict[str, Owner]:
        return self._identity()[0].job_owners(keys)

    def awaiting_owner(self, keys: Collection[str]) -> dict[str, tuple[str, ...]]:
        return self._identity()[0].awaiting_owner(keys)

    def awaiting_transactions(self, keys: Collection[str]) -> dict[str, tuple[Transaction, ...]]:
        identity, found = self._identity()
        ids = identity.awaiting_owner(keys)
        return {k: tuple(found[t] for t in v if t in found) for k, v in ids.items()}
