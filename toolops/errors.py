"""Errors the executor raises to its callers (CLI, tasks, API). Messages are one clear line."""

from __future__ import annotations


class ToolopsError(Exception):
    """A refused request: nothing was half-written."""


class SubmitRefused(ToolopsError):
    pass


class ServerNotFound(ToolopsError):
    pass


class SubmissionKeyTaken(ToolopsError):
    """An operation with this submission key already exists (an Idempotency-Key replay or race)."""


class LedgerUnavailable(ToolopsError):
    """The ledger could not be written (the database is away); retry with the same key.

    Raised only where the outcome is known: before a send (nothing reached the server), or after a
    reply whose remote id is kept in the evidence (toolops/services/remote_ids.py)."""
