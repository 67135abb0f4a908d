"""The documented bounds every server answer is decoded against (docs/adapter-boundary.md).

One place, so the table in the docs, the decoders and the tests agree. Column lengths mirror
the ledger columns the values end up in; adapters import nothing from the ledger, so the
numbers are repeated here and a test compares them with the models.
"""

from __future__ import annotations

# Ledger `Operation.remote_id` (CharField max_length=300).
REMOTE_ID_MAX_CHARS = 300
# Ledger `InputRequest.server_request_id` (CharField max_length=200).
SERVER_REQUEST_ID_MAX_CHARS = 200
# Ledger `Operation.tool_name` (CharField max_length=200).
TOOL_NAME_MAX_CHARS = 200
# Ledger `ToolServer.session_id` (CharField max_length=200).
SESSION_ID_MAX_CHARS = 200
# Ledger `Operation.server_state` is 64 wide; every spec status is far shorter.
STATUS_MAX_CHARS = 64
# A status message is prose for an operator: longer ones are cut with a marker.
STATUS_MESSAGE_MAX_CHARS = 4000
TRUNCATION_MARKER = "… [truncated {dropped} characters]"
# pollInterval: a hint. Above an hour it is clamped (the executor's own floor and wait budget
# still apply); negative is a violation (a server that cannot count is not trusted).
POLL_INTERVAL_MAX_MS = 3_600_000
# ttl: above 30 days clamped (the ledger computes created + ttl); negative is a violation.
TTL_MAX_MS = 30 * 24 * 3_600_000
# Timestamps must carry a zone offset and fall in these years (date arithmetic must not overflow).
TIMESTAMP_MIN_YEAR = 1970
TIMESTAMP_MAX_YEAR = 2999
TIMESTAMP_MAX_CHARS = 64
# JSON nesting of a whole reply (envelope included). Deeper answers are violations before any
# recursive code (pydantic, canonical JSON, the database encoder) sees them.
JSON_MAX_DEPTH = 100
# Canonical JSON (RFC 8785) represents integers exactly only within the IEEE 754 safe range.
JSON_MAX_SAFE_INTEGER = 2**53 - 1
# Input requests one answer may carry (the tasks extension repeats them on every read).
MAX_INPUT_REQUESTS = 64
# Server-initiated messages kept between calls on one adapter (Shape A streams).
MAX_PENDING_SERVER_REQUESTS = 256
# Defaults for what the executor passes from its settings.
DEFAULT_MAX_RESPONSE_BYTES = 8 * 1024 * 1024
DEFAULT_REQUEST_DEADLINE_S = 30.0
# How much of a hostile value an error detail may quote (after neutralising NUL and surrogates).
DETAIL_QUOTE_CHARS = 80
