"""toolops settings and their defaults, each with its reason and each overridable from the environment.

The one source of these settings: this repository's project star-imports it
(config/settings/toolops.py), and so does a host project that installs the package:

    from toolops.defaults import *  # noqa: F403   (then override what you need)
"""

from __future__ import annotations

from toolops.env import env_bool, env_float, env_int, env_str

# How long a claimed row belongs to one worker. A worker that dies stops renewing nothing; the row is
# re-claimed after this, so it bounds the stall after a crash. Longer than one poll round trip.
TOOLOPS_LEASE_SECONDS = env_float("TOOLOPS_LEASE_SECONDS", 30.0)
# Rows claimed per dispatcher transaction; one poll task per row (ids only).
TOOLOPS_CLAIM_BATCH = env_int("TOOLOPS_CLAIM_BATCH", 200)
# Poll messages the dispatcher keeps waiting in the broker at most (toolops/broker.py): enough to
# keep every worker busy between ticks, few enough that none waits out its lease in the queue.
TOOLOPS_DISPATCH_MAX_QUEUED = env_int("TOOLOPS_DISPATCH_MAX_QUEUED", 100)
# Rows per poll message (toolops.poll_batch): one broker message, one task and one prefork slot
# carry this many polls, run concurrently on the process's poll threads.
TOOLOPS_POLL_BATCH_SIZE = env_int("TOOLOPS_POLL_BATCH_SIZE", 16)
# Poll threads per worker process (toolops/services/poll_batch.py): the most polls one process
# runs at once. A poll mostly waits on the server, PostgreSQL and Redis; threads overlap those
# waits without a process each (every thread holds its own database connection, so this also
# bounds the connections). How many of them run at once adapts (TOOLOPS_POLL_ADAPTIVE).
TOOLOPS_POLL_THREADS = env_int("TOOLOPS_POLL_THREADS", 4)
# Whether the polls in flight per process follow the CPU to spare (the machine's idle CPU and the
# process's own CPU time), between one and TOOLOPS_POLL_THREADS
# (toolops/services/poll_concurrency.py): all of them while CPU is to spare, one on a saturated
# machine, where every extra poll in flight is a row polled the moment it falls due, mostly
# answered "working". Off by default: putting first polls off on a busy machine
# (TOOLOPS_POLL_DEFER_FIRST_WHEN_BUSY) removes those "working" answers at their source, and the
# gate then only queues the polls that find their task done. Toolops-only bursts of 5,000: with
# the deferral and all threads, 274 to 279 calls/s, p50 1.03 s, 1.04 to 1.06 polls per call;
# with the gate and no deferral, 247 to 272 calls/s, p50 1.27 to 1.31 s, 1.21 to 1.34 polls per
# call; with both, p50 2.4 to 4.0 s. True turns the gate on.
TOOLOPS_POLL_ADAPTIVE = env_bool("TOOLOPS_POLL_ADAPTIVE", False)
# A working row whose next poll is due within this many seconds is kept by the worker process
# that polled it and polled again there at its time (its lease kept, its schedule written as
# usual), instead of going back through the dispatcher tick and the broker, whose round trip
# adds most of a short task's latency. 0 turns holding off.
TOOLOPS_POLL_HOLD_SECONDS = env_float("TOOLOPS_POLL_HOLD_SECONDS", 2.0)
# A held row's lease runs this long past its next poll time: how late the holder may be before
# the dispatcher takes the row back, and so the longest stall if the holding process dies.
TOOLOPS_POLL_HOLD_GRACE_SECONDS = env_float("TOOLOPS_POLL_HOLD_GRACE_SECONDS", 2.0)
# Rows one worker process holds at most; beyond it, working rows are released as before, so a
# process's memory and its share of the fleet's rows stay bounded.
TOOLOPS_POLL_HOLD_MAX_ROWS = env_int("TOOLOPS_POLL_HOLD_MAX_ROWS", 1000)
# How long one dispatcher tick keeps going, waking whenever the next row falls due instead of
# only at the tick (toolops.services.dispatch.operations_dispatch_following_due). Matches the
# beat interval, so ticks follow each other; 0 makes each tick a single pass.
TOOLOPS_DISPATCH_FOLLOW_DUE_SECONDS = env_float("TOOLOPS_DISPATCH_FOLLOW_DUE_SECONDS", 0.25)
# Shortest time between two passes of that dispatcher: rows falling due closer together share
# one claim transaction and one batch message. It bounds the dispatcher's commits (at most one
# per gap) and adds at most this much to a row's first poll.
TOOLOPS_DISPATCH_MIN_GAP_SECONDS = env_float("TOOLOPS_DISPATCH_MIN_GAP_SECONDS", 0.02)
# The same gap after a pass that found the fleet behind (poll messages waiting, or the machine
# saturated). Then a row's first poll waits an interval anyway (TOOLOPS_POLL_DEFER_FIRST_WHEN_BUSY)
# and every claim, message and task is CPU taken from the calls: rows share claims five times
# longer. Toolops-only bursts of 5,000, four pairs against 0.02: 3.32 to 3.36 transactions per call
# against 3.63 to 3.68, worker CPU 2.16 to 2.50 ms per call against 2.46 to 2.66, 242 to 283
# calls/s against 252 to 278 (higher in three pairs of four), p50 unchanged (1.03 s).
TOOLOPS_DISPATCH_BUSY_GAP_SECONDS = env_float("TOOLOPS_DISPATCH_BUSY_GAP_SECONDS", 0.1)
# How far ahead the dispatcher claims free rows (toolops.services.dispatch): a row falling due
# within this time of a pass is claimed with it and held by its worker until its time, so rows
# due close together share one claim and one message, and none is polled late or early. One
# dispatcher tick: at 20 calls/s a pass takes about six rows instead of one. 0 claims due rows
# only.
TOOLOPS_DISPATCH_AHEAD_SECONDS = env_float("TOOLOPS_DISPATCH_AHEAD_SECONDS", 0.25)
# While the fleet is behind (the dispatcher's test for claiming ahead) and the worker's machine
# has no CPU to spare, a row's first poll comes one interval later than the server suggested
# (toolops.services.poll_batch): on a saturated machine every poll costs another call's CPU, and
# the first poll of a row is the one most often answered "working". Below saturation nothing
# changes. False polls every row at its time.
TOOLOPS_POLL_DEFER_FIRST_WHEN_BUSY = env_bool("TOOLOPS_POLL_DEFER_FIRST_WHEN_BUSY", True)
# The dispatcher analyzes a ledger table (ledger/services/statistics.py) once its live rows reach
# this many times the planner's row count (plus TOOLOPS_STATS_REFRESH_MIN_ROWS): plans cached while
# the table was nearly empty otherwise read the whole table by key until autovacuum's next round.
# 2 means at each doubling; 0 leaves the statistics to autovacuum alone.
TOOLOPS_STATS_REFRESH_GROWTH = env_float("TOOLOPS_STATS_REFRESH_GROWTH", 2.0)
# Below this many rows of growth a stale plan costs little (a few hundred pages at most).
TOOLOPS_STATS_REFRESH_MIN_ROWS = env_int("TOOLOPS_STATS_REFRESH_MIN_ROWS", 500)
# How often the dispatcher checks (one catalog query).
TOOLOPS_STATS_REFRESH_INTERVAL_SECONDS = env_float("TOOLOPS_STATS_REFRESH_INTERVAL_SECONDS", 2.0)
# Bookkeeping commits that are safe to lose in a database crash (a poll answer that changed nothing
# but the schedule and counters, a held row's lease renewal, a dispatcher's claim) do not wait for
# their WAL flush (ledger/flush.py): a lost one means a row polled again or a lease made again.
# Every commit before an effect outside the database, and every acceptance, still waits. Such a
# write costs about 30 % less of the box's CPU when it does not wait (benchmarks/deferred_flush.py:
# 245 against 355 us). False makes every commit wait.
TOOLOPS_DEFERRED_FLUSH = env_bool("TOOLOPS_DEFERRED_FLUSH", True)
# Never poll faster than this, whatever the server suggests (protects servers that send 0).
TOOLOPS_POLL_FLOOR_SECONDS = env_float("TOOLOPS_POLL_FLOOR_SECONDS", 0.2)
# Used when the server suggests no interval (SDK defaults are 0.5 s to 5 s).
TOOLOPS_POLL_DEFAULT_SECONDS = env_float("TOOLOPS_POLL_DEFAULT_SECONDS", 1.0)
# Fraction of the interval added as uniform jitter so a fleet does not poll in lock step.
TOOLOPS_POLL_JITTER = env_float("TOOLOPS_POLL_JITTER", 0.2)
# Intervals shorter than this get a proportionally smaller jitter share (toolops/scheduling.py,
# poll_jitter_window_seconds): at 500 ms, 25 ms of jitter instead of 100 ms on every poll.
TOOLOPS_POLL_JITTER_FULL_SECONDS = env_float("TOOLOPS_POLL_JITTER_FULL_SECONDS", 2.0)
# Total time we are willing to wait for one operation when the server gives no ttl.
TOOLOPS_WAIT_BUDGET_SECONDS = env_float("TOOLOPS_WAIT_BUDGET_SECONDS", 3600.0)
# Default task ttl requested from servers (ms).
TOOLOPS_DEFAULT_TTL_MS = env_int("TOOLOPS_DEFAULT_TTL_MS", 3_600_000)
# HTTP timeout for one protocol request.
TOOLOPS_HTTP_TIMEOUT_SECONDS = env_float("TOOLOPS_HTTP_TIMEOUT_SECONDS", 30.0)
# Largest result body accepted; larger is a protocol violation, never silently truncated.
TOOLOPS_MAX_RESULT_BYTES = env_int("TOOLOPS_MAX_RESULT_BYTES", 8 * 1024 * 1024)
# Wall-clock bound of one whole HTTP exchange with a server (headers and every body byte).
TOOLOPS_REQUEST_DEADLINE_SECONDS = env_float("TOOLOPS_REQUEST_DEADLINE_SECONDS", 30.0)
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
# The per-row error boundary (toolops/services/boundary.py): a row whose poll cycle crashes this
# many times in a row (a bug, a database error on its data) goes to the reconciliation queue
# with reason `executor_error` instead of being retried forever. Five is enough to ride out a
# short database blip (each crash backs off like a failed call) and small enough that a poison
# row reaches an operator within minutes.
TOOLOPS_EXECUTOR_MAX_CRASHES = env_int("TOOLOPS_EXECUTOR_MAX_CRASHES", 5)
# Writes that must not be lost to a database blip (a crash record, a tools/call reply carrying
# a remote id) are retried this many times, with the connection reopened between tries.
TOOLOPS_DB_WRITE_RETRIES = env_int("TOOLOPS_DB_WRITE_RETRIES", 4)
# QPS buckets: "redis" (fleet; shared by every worker) or "local" (embedded, one process). Empty
# picks by database: SQLite means embedded. The Redis URL defaults to the broker's.
TOOLOPS_QPS_BACKEND = env_str("TOOLOPS_QPS_BACKEND", "")
TOOLOPS_QPS_REDIS_URL = env_str("TOOLOPS_QPS_REDIS_URL", "")
# Bucket capacity. 1 spaces requests 1/qps apart, so no one-second window exceeds the cap; a larger
# burst lets a second see up to burst-1 more requests than the configured QPS.
TOOLOPS_QPS_BURST = env_float("TOOLOPS_QPS_BURST", 1.0)
# Most grants one take of the fleet bucket brings back for its process (toolops/qps_redis.py,
# "prefetched grants"): only at caps of 1,000/s and more, never past the process's own demand in
# the last send deadline. 8 already turns a Redis round trip per request into one per several;
# more would only leave more grants unused when a process slows down. 1 turns it off.
TOOLOPS_QPS_PREFETCH = env_int("TOOLOPS_QPS_PREFETCH", 8)
# The cap holds at the server's door (toolops/qps.py): a grant older than the send deadline when
# its request is about to leave is not used, and grants are spaced so that the allowance (>= the
# deadline plus the gate-to-server latency) still keeps every sliding second at the cap.
TOOLOPS_QPS_SEND_DEADLINE_SECONDS = env_float("TOOLOPS_QPS_SEND_DEADLINE_SECONDS", 0.05)
TOOLOPS_QPS_WIRE_ALLOWANCE_SECONDS = env_float("TOOLOPS_QPS_WIRE_ALLOWANCE_SECONDS", 0.1)
# A submit refused a QPS token waits at most this long for one (the caller is blocked on it);
# beyond that the row is closed as never sent (NOT_FOUND_SAFE) and the caller may try again.
TOOLOPS_SUBMIT_MAX_TOKEN_WAIT_SECONDS = env_float("TOOLOPS_SUBMIT_MAX_TOKEN_WAIT_SECONDS", 5.0)
# A refused token due within this long is waited for in place, once (never in a loop): cheaper
# than re-scheduling through the ledger (a guarded UPDATE, a new claim). Longer waits re-schedule.
TOOLOPS_QPS_INLINE_WAIT_SECONDS = env_float("TOOLOPS_QPS_INLINE_WAIT_SECONDS", 0.05)
# Prefix of a ledger's bucket keys in Redis; empty means the database's host, port and name, so
# every worker of one ledger shares the buckets and no other ledger does.
TOOLOPS_QPS_NAMESPACE = env_str("TOOLOPS_QPS_NAMESPACE", "")

# --- Tool output defense (toolops/services/output_defense.py) ---
# Largest canonical-JSON size of one result we accept as a success; larger goes to the policy below.
# Smaller than TOOLOPS_MAX_RESULT_BYTES (the transport cap) so a big-but-whole body is still recorded.
TOOLOPS_OUTPUT_MAX_BYTES = env_int("TOOLOPS_OUTPUT_MAX_BYTES", 1024 * 1024)
# MCP content block types a result may carry.
TOOLOPS_OUTPUT_ALLOWED_CONTENT_TYPES = env_str(
    "TOOLOPS_OUTPUT_ALLOWED_CONTENT_TYPES", "text,image,audio,resource_link,resource"
).split(",")
# Dotted paths of extra checks: `check(*, operation, result) -> list[str]` (problems; empty = ok).
TOOLOPS_OUTPUT_VALIDATORS: list[str] = [
    p for p in env_str("TOOLOPS_OUTPUT_VALIDATORS", "").split(",") if p
]
# "reconcile": a rejected result goes to the reconciliation queue (an operator decides);
# "fail": it is accepted as a failed terminal state carrying the rejection reasons.
TOOLOPS_OUTPUT_DEFENSE_POLICY = env_str("TOOLOPS_OUTPUT_DEFENSE_POLICY", "reconcile")

# --- Outbox relay (toolops/services/outbox.py) ---
# `handler(*, event: dict, idempotency_key: str) -> None`; default: a Django signal.
TOOLOPS_OUTBOX_HANDLER = env_str("TOOLOPS_OUTBOX_HANDLER", "toolops.services.outbox.outbox_handler_signal")
# Rows one relay pass claims; each is delivered outside any transaction.
TOOLOPS_OUTBOX_BATCH = env_int("TOOLOPS_OUTBOX_BATCH", 100)
# A claimed row is hidden from other relays this long: longer than one handler call.
TOOLOPS_OUTBOX_LEASE_SECONDS = env_float("TOOLOPS_OUTBOX_LEASE_SECONDS", 60.0)
# Backoff after a failed delivery: base * 2**attempts, capped.
TOOLOPS_OUTBOX_BACKOFF_BASE_SECONDS = env_float("TOOLOPS_OUTBOX_BACKOFF_BASE_SECONDS", 1.0)
TOOLOPS_OUTBOX_BACKOFF_MAX_SECONDS = env_float("TOOLOPS_OUTBOX_BACKOFF_MAX_SECONDS", 300.0)
# Task name the Celery outbox handler enqueues (toolops.services.outbox.outbox_celery_handler).
TOOLOPS_OUTBOX_CELERY_TASK = env_str("TOOLOPS_OUTBOX_CELERY_TASK", "toolops.outbox_event")

# --- Server URL policy (toolops/services/url_policy.py) ---
# Comma-separated allow-list of what tool server URLs may resolve to: "public" (any globally
# routable address), addresses/CIDRs ("10.0.0.0/8", "127.0.0.0/8", "::1") and host names
# ("tools.internal", "*.corp.example"). Link-local, metadata and unspecified addresses are refused
# whatever it says; loopback and private networks only when listed.
TOOLOPS_SERVER_HOSTS = env_str("TOOLOPS_SERVER_HOSTS", "public")

# --- /metrics (toolops/metrics_view.py, toolops/metrics.py) ---
# Bearer token a scraper must send; empty (the default) disables the endpoint (404).
TOOLOPS_METRICS_TOKEN = env_str("TOOLOPS_METRICS_TOKEN", "")
# Which server names may appear as labels: "shared" (servers shared by every tenant; each
# organisation's own are folded into "tenant"), "all", or "none".
TOOLOPS_METRICS_SERVER_LABELS = env_str("TOOLOPS_METRICS_SERVER_LABELS", "shared")
