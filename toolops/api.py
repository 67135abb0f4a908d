"""`toolops.api`: the stable import path of the Python embedding API (toolops/python_api.py).

Host applications write `from toolops import api`; the functions and types live in
`toolops.python_api` (the in-process API), beside `toolops.rest` (the HTTP API built on it).
"""

from toolops.python_api import (
    CancelRefused,
    IdempotencyInProgress,
    IdempotencyMismatch,
    InputAnswerRefused,
    InputRequestView,
    OperationNotVisible,
    OperationView,
    ReceiptView,
    RelayStats,
    ToolopsError,
    answer_input,
    cancel_operation,
    consume_outbox,
    get_operation,
    list_open_input_requests,
    submit_call,
)

__all__ = [
    "CancelRefused",
    "IdempotencyInProgress",
    "IdempotencyMismatch",
    "InputAnswerRefused",
    "InputRequestView",
    "OperationNotVisible",
    "OperationView",
    "ReceiptView",
    "RelayStats",
    "ToolopsError",
    "answer_input",
    "cancel_operation",
    "consume_outbox",
    "get_operation",
    "list_open_input_requests",
    "submit_call",
]
