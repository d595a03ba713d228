"""The ledger's exception tree: every error the domain core raises is a `LedgerError`.

    LedgerError
    ├── EventError            an event or message that cannot be decoded or fails validation
    │   └── UnknownSchemaError   a schema version no upcaster leads from
    ├── TransactionError      a transaction that breaks a posting rule (balance, units, types)
    ├── PricingError          no price for a GPU model at a time
    └── StoreError            the ledger store cannot do what was asked
        ├── SealError         sealing could not write its files (disk full, I/O error)
        └── SegmentError      a sealed segment or manifest is missing, corrupt or overlaps

Errors that are part of normal processing (a malformed event in a batch) are returned as values
(`DeadLetter`), not raised; these exceptions are for callers that asked for one thing.
"""

from __future__ import annotations


class LedgerError(Exception):
    """Base class of every error raised by `ledger`."""


class EventError(LedgerError):
    """An event or a Kafka message that cannot be decoded, or whose fields are invalid."""


class UnknownSchemaError(EventError):
    """An event whose type or schema version this build cannot read or upcast."""


class TransactionError(LedgerError):
    """A transaction that breaks a posting rule."""


class PricingError(LedgerError):
    """No price is known for a GPU model at the requested time."""


class StoreError(LedgerError):
    """The ledger store cannot do what was asked (bad state, closed store, I/O)."""


class SealError(StoreError):
    """Sealing could not write a file (the disk is full, an I/O error): `path` is the file it
    was writing and `reason` what the system said. Nothing half-written is visible to readers
    and the committed rows stay in the hot tables, so a later seal can succeed."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class SegmentError(StoreError):
    """A sealed Parquet segment or a manifest is missing, damaged, or overlaps another: readers
    refuse it rather than return totals without it."""
