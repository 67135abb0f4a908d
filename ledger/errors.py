"""Errors raised by ledger writes. Each one means: nothing was changed."""

from __future__ import annotations


class LedgerError(Exception):
    """Base class for refused ledger writes."""


class IllegalTransition(LedgerError):
    """The state table does not allow the move, or the row changed under us (CAS lost)."""


class OperationNotFound(LedgerError):
    pass


class InsertConditionFailed(LedgerError):
    """An insert made on a condition (rows it locks still as the caller read them) found the
    condition false: nothing was written, and the caller decides again from a fresh read."""


class AcceptanceRefused(LedgerError):
    """`operation_accept_terminal` refused: an identity field, the state or the digest did not match."""

    def __init__(self, reason: str, *, field: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.field = field
