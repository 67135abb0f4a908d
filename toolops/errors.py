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
