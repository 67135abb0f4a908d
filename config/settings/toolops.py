"""toolops executor settings (all overridable from the environment)."""

from __future__ import annotations

from config.env import env_float, env_int, env_str

# How long a claimed row belongs to one worker. A worker that dies stops renewing nothing; the row is
# re-claimed after this, so it bounds the stall after a crash. Longer than one poll round trip.
TOOLOPS_LEASE_SECONDS = env_float("TOOLOPS_LEASE_SECONDS", 30.0)
# Rows claimed per dispatcher transaction; one poll task per row (ids only).
TOOLOPS_CLAIM_BATCH = env_int("TOOLOPS_CLAIM_BATCH", 200)
# Poll messages the dispatcher keeps waiting in the broker at most (toolops/broker.py): enough to
# keep every worker busy between ticks, few enough that none waits out its lease in the queue.
TOOLOPS_DISPATCH_MAX_QUEUED = env_int("TOOLOPS_DISPATCH_MAX_QUEUED", 100)
# Never poll faster than this, whatever the server suggests (protects servers that send 0).
TOOLOPS_POLL_FLOOR_SECONDS = env_float("TOOLOPS_POLL_FLOOR_SECONDS", 0.2)
# Used when the server suggests no interval (SDK defaults are 0.5 s to 5 s).
TOOLOPS_POLL_DEFAULT_SECONDS = env_float("TOOLOPS_POLL_DEFAULT_SECONDS", 1.0)
# Fraction of the interval added as uniform jitter so a fleet does not poll in lock step.
TOOLOPS_POLL_JITTER = env_float("TOOLOPS_POLL_JITTER", 0.2)
# Total time we are willing to wait for one operation when the server gives no ttl.
TOOLOPS_WAIT_BUDGET_SECONDS = env_float("TOOLOPS_WAIT_BUDGET_SECONDS", 3600.0)
# Default task ttl requested from servers (ms).
TOOLOPS_DEFAULT_TTL_MS = env_int("TOOLOPS_DEFAULT_TTL_MS", 3_600_000)
# HTTP timeout for one protocol request.
TOOLOPS_HTTP_TIMEOUT_SECONDS = env_float("TOOLOPS_HTTP_TIMEOUT_SECONDS", 30.0)
# Largest result body accepted; larger is a protocol violation, never silently truncated.
TOOLOPS_MAX_RESULT_BYTES = env_int("TOOLOPS_MAX_RESULT_BYTES", 8 * 1024 * 1024)
# Retries of a submit whose request provably never left (connection refused), same key each time.
TOOLOPS_SUBMIT_UNSENT_RETRIES = env_int("TOOLOPS_SUBMIT_UNSENT_RETRIES", 3)
# An operator must resolve a reconciliation item within this many seconds of its opening (15 min):
# the age of the oldest open item is a gate figure and must stay under it.
TOOLOPS_RECONCILIATION_DEADLINE_SECONDS = env_float("TOOLOPS_RECONCILIATION_DEADLINE_SECONDS", 900.0)
# How long automatic resolution of a SUBMISSION_UNKNOWN row (lookup by key) keeps trying before
# the row goes to the manual queue. Well under the queue deadline, so an operator still has time.
TOOLOPS_SUBMISSION_RESOLUTION_SECONDS = env_float("TOOLOPS_SUBMISSION_RESOLUTION_SECONDS", 120.0)
# Backoff after 429/503/transport errors: full jitter over base * 2**(errors-1) seconds, capped.
# The cap keeps a recovered server from waiting minutes for its first poll.
TOOLOPS_BACKOFF_BASE_SECONDS = env_float("TOOLOPS_BACKOFF_BASE_SECONDS", 1.0)
TOOLOPS_BACKOFF_CAP_SECONDS = env_float("TOOLOPS_BACKOFF_CAP_SECONDS", 60.0)
# QPS buckets: "redis" (fleet; shared by every worker) or "local" (embedded, one process). Empty
# picks by database: SQLite means embedded. The Redis URL defaults to the broker's.
TOOLOPS_QPS_BACKEND = env_str("TOOLOPS_QPS_BACKEND", "")
TOOLOPS_QPS_REDIS_URL = env_str("TOOLOPS_QPS_REDIS_URL", "")
# Bucket capacity. 1 spaces requests 1/qps apart, so no one-second window exceeds the cap; a larger
# burst lets a second see up to burst-1 more requests than the configured QPS.
TOOLOPS_QPS_BURST = env_float("TOOLOPS_QPS_BURST", 1.0)
# A submit refused a QPS token waits at most this long for one (the caller is blocked on it);
# beyond that the row is closed as never sent (NOT_FOUND_SAFE) and the caller may try again.
TOOLOPS_SUBMIT_MAX_TOKEN_WAIT_SECONDS = env_float("TOOLOPS_SUBMIT_MAX_TOKEN_WAIT_SECONDS", 5.0)
# A refused token due within this long is waited for in place, once (never in a loop): cheaper
# than re-scheduling through the ledger (a guarded UPDATE, a new claim). Longer waits re-schedule.
TOOLOPS_QPS_INLINE_WAIT_SECONDS = env_float("TOOLOPS_QPS_INLINE_WAIT_SECONDS", 0.05)
# Prefix of a ledger's bucket keys in Redis; empty means the database's host, port and name, so
# every worker of one ledger shares the buckets and no other ledger does.
TOOLOPS_QPS_NAMESPACE = env_str("TOOLOPS_QPS_NAMESPACE", "")
