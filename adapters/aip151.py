"""Google AIP-151 long-running operations (`google.longrunning`) over HTTP/JSON.

Facts this module relies on (docs lro-shapes.md section 1):
* the handle is the server-assigned operation `name`, an opaque (possibly nested) path;
* `done:false` = running; `done:true` with exactly one of `response` / `error`; an `error`
  with code 1 (CANCELLED) is a cancellation, any other code a failure;
* cancel is best effort: the operation is not deleted, may end CANCELLED, or may still
  succeed; DELETE does not cancel; after delete or expiry Get answers NOT_FOUND (404);
* idempotent create is AIP-155 `request_id`: we send OUR submission key, persisted before
  the first send, unchanged on every resend, and the server answers with the same operation.
  That resend is also the lookup by key;
* AIP-194 allows automatic in-call retry only on UNAVAILABLE (and transport trouble); a 429
  (RESOURCE_EXHAUSTED) is pacing for the scheduler, not an in-call retry;
* HTTP errors use the AIP-193 envelope `{"error": {"code": <http>, "status": <NAME>, ...}}`;
  logic keys on `status`, never on message text.
No LRO client library is used: they keep pollers in process memory (section 3.1). The
Operation JSON stays a plain dict (`@type` kept).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import httpx

from adapters import decode, limits
from adapters.aip151_operations import remote_task, status_name
from adapters.base import (
    KEY_DEDUP_RESEND,
    FetchedResult,
    InputWindow,
    Negotiated,
    RemoteTask,
    RequestGate,
    ResendRequest,
    SubmitOutcome,
    ToolDescriptor,
)
from adapters.deadline import install_deadline, request_deadline
from adapters.errors import (
    AdapterError,
    LostResponseError,
    NotFoundError,
    ProtocolViolationError,
    TaskNotSupportedError,
    TransientError,
)
from adapters.jsonrpc_frames import parse_retry_after

VERSION = "aip-151/v1"
# In-call attempts for calls AIP-194 lets us repeat (UNAVAILABLE, transport errors): Get,
# Cancel, and Create under the same request_id. Small: the scheduler is the durable retry.
IN_CALL_ATTEMPTS = 3
# Cap on one in-call wait: a Retry-After of minutes belongs to the scheduler, not a worker.
MAX_IN_CALL_WAIT_S = 2.0
# AIP-155: request_id is at most 36 ASCII characters.
MAX_REQUEST_ID = 36
RESULT_CACHE_SIZE = 256


def _deadline_passed(at: float | None) -> bool:
    # This module's clock: the simulation replaces this module's `time` with a virtual one.
    return at is not None and time.monotonic() >= at


class Aip151Adapter:
    version = VERSION
    # no_input: the shape has no input channel; the executor refuses answers up front.
    capabilities: frozenset[str] = frozenset({"cancel", "cancel_ack_only", "inline_result",
                                              "lookup_by_key", "delete", "no_input"})

    def __init__(
        self,
        *,
        url: str,
        options: dict[str, Any] | None = None,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        max_response_bytes: int = limits.DEFAULT_MAX_RESPONSE_BYTES,
        request_deadline_s: float | None = None,
    ) -> None:
        """`url`: the service root. `options`: {"operations_prefix": "v1", "methods":
        {tool: {"http_method": "POST", "path": "v1/...:verb"}}, "list_path": ...} (the tools'
        configured methods; ListOperations is only probed, never relied on)."""
        opts = dict(options or {})
        self._base = url.rstrip("/")
        self._prefix = str(opts.get("operations_prefix", "v1")).strip("/")
        self._methods: dict[str, dict[str, Any]] = dict(opts.get("methods") or {})
        # Services rebind ListOperations (e.g. under a parent): take its path from config.
        self._list_path = str(opts.get("list_path") or f"{self._prefix}/operations").strip("/")
        self._options = {"operations_prefix": self._prefix, "methods": self._methods,
                         "list_path": self._list_path}
        self._transport = transport
        self._client = httpx.Client(transport=transport, timeout=timeout_s, follow_redirects=False)
        if transport is None:
            install_deadline(self._client)
        self._max_response_bytes = max_response_bytes
        # One adapter call (its in-call retries included) ends within this many seconds.
        self._deadline_s = request_deadline_s or limits.DEFAULT_REQUEST_DEADLINE_S
        self._results: OrderedDict[str, FetchedResult] = OrderedDict()
        self._lock = threading.Lock()
        self._gate: RequestGate | None = None  # passed before every request, retries included

    # -- plumbing ----------------------------------------------------------------------------

    def set_request_gate(self, gate: RequestGate | None) -> None:
        self._gate = gate

    def _pass_gate(self, what: str) -> None:
        if self._gate is not None:
            self._gate(what)

    def _operation_url(self, name: str) -> str:
        return f"{self._base}/{self._prefix}/{name.lstrip('/')}"

    def _classify(self, response: httpx.Response, *, what: str, creates: bool = False) -> AdapterError:
        name, detail = status_name(response)
        detail["call"] = what
        text = f"{what}: HTTP {response.status_code} {name}"
        if name in ("UNAVAILABLE", "RESOURCE_EXHAUSTED") or response.status_code in (429, 503):
            retry_after = parse_retry_after(response.headers.get("retry-after"))
            detail["retry_after"] = retry_after
            return TransientError(text, detail=detail, retry_after=retry_after)
        if name == "NOT_FOUND" and not creates:
            return NotFoundError(text, detail=detail)
        if name == "UNIMPLEMENTED":
            return TaskNotSupportedError(text, detail=detail)
        if response.status_code >= 500:
            # INTERNAL / UNKNOWN: AIP-194 says "generally no" in-call retry; for a read the
            # scheduler tries later. A create may have acted: maybe-created.
            if creates:
                return LostResponseError(text, detail=detail)
            return TransientError(text, detail=detail)
        return AdapterError(text, detail=detail)

    def _send(self, method: str, url: str, *, what: str, json: Any = None, creates: bool = False,
              repeatable: bool = True) -> httpx.Response:
        """One call with AIP-194 in-call retries (UNAVAILABLE and transport trouble only).

        Only called for requests safe to repeat: reads, cancel, and a create carrying the
        same request_id.
        """
        last: AdapterError | None = None
        deadline = time.monotonic() + self._deadline_s
        maybe_sent = False  # a create whose earlier attempt may have reached the server
        for attempt in range(IN_CALL_ATTEMPTS if repeatable else 1):
            if attempt and last is not None:
                hinted = last.retry_after if isinstance(last, TransientError) else None
                wait = min(hinted if hinted else 0.1 * 2**attempt, MAX_IN_CALL_WAIT_S)
                if time.monotonic() + wait >= deadline:
                    break  # no time left for another attempt
                time.sleep(wait)
            detail: dict[str, Any] = {"call": what}
            # Each in-call retry is a request of its own: it passes the gate (QPS) again.
            self._pass_gate(what)
            try:
                with request_deadline(deadline):
                    response = self._bounded_request(method, url, json=json, detail=detail,
                                                     deadline=deadline)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
                if _deadline_passed(deadline):
                    last = self._timed_out(what, detail, creates=creates)
                    maybe_sent = maybe_sent or creates
                    break
                last = TransientError(f"{what}: connection failed: {type(exc).__name__}", detail=detail)
                continue
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                # Sent, no answer read. Repeating is safe here (see docstring); if every
                # attempt ends so, a create is "maybe created" and a read is transient.
                maybe_sent = maybe_sent or creates
                if _deadline_passed(deadline):
                    last = self._timed_out(what, detail, creates=creates)
                    break
                cls = LostResponseError if creates else TransientError
                last = cls(f"{what}: sent, but no answer was read: {type(exc).__name__}", detail=detail)
                continue
            if response.status_code < 400:
                return response
            error = self._classify(response, what=what, creates=creates)
            status = error.detail.get("status")
            if status == "UNAVAILABLE" or response.status_code == 503:
                last = error
                continue  # the only code AIP-194 retries in-call
            raise error
        assert last is not None
        if maybe_sent and not isinstance(last, LostResponseError):
            # An earlier attempt may have created the operation: never report "not sent".
            raise LostResponseError(str(last), detail=last.detail)
        if creates and isinstance(last, TransientError) and last.detail.get("status") == "UNAVAILABLE":
            # A proxy's 503 does not prove the create was not accepted (section 2.3).
            raise LostResponseError(str(last), detail=last.detail)
        raise last

    @staticmethod
    def _timed_out(what: str, detail: dict[str, Any], *, creates: bool) -> AdapterError:
        cls = LostResponseError if creates else TransientError
        return cls(f"{what}: no complete answer within the request deadline",
                   detail={**detail, "deadline": True})

    def _bounded_request(self, method: str, url: str, *, json: Any, detail: dict[str, Any],
                         deadline: float) -> httpx.Response:
        """One request whose body is read as it arrives: never more than the size cap, never
        past the deadline (checked per chunk too, for transports without the deadline backend)."""
        limit = self._max_response_bytes
        with self._client.stream(method, url, json=json) as response:
            length = response.headers.get("content-length")
            too_big = {**detail, "violation": "response body over the size limit",
                       "max_response_bytes": limit, "http_status": response.status_code}
            if length is not None and length.isdigit() and int(length) > limit:
                raise ProtocolViolationError(f"{detail['call']}: response body over the size limit",
                                             detail=too_big)
            chunks: list[bytes] = []
            seen = 0
            for chunk in response.iter_bytes():
                if _deadline_passed(deadline):
                    raise httpx.ReadTimeout("request deadline passed", request=response.request)
                seen += len(chunk)
                if seen > limit:
                    raise ProtocolViolationError(f"{detail['call']}: response body over the size limit",
                                                 detail=too_big)
                chunks.append(chunk)
        return httpx.Response(response.status_code, headers=response.headers, content=b"".join(chunks),
                              request=response.request)

    def _json(self, response: httpx.Response, *, what: str) -> Any:
        return decode.json_loads(response.content, what=what)

    def _remember(self, task: RemoteTask) -> RemoteTask:
        if task.result is not None:
            with self._lock:
                self._results[task.remote_id] = task.result
                self._results.move_to_end(task.remote_id)
                while len(self._results) > RESULT_CACHE_SIZE:
                    self._results.popitem(last=False)
        return task

    # -- interface ---------------------------------------------------------------------------

    @property
    def session_id(self) -> str | None:
        return None

    def negotiate(self) -> Negotiated:
        """AIP-151 has no handshake: check the configuration and that the service answers."""
        if not self._methods:
            raise AdapterError("no methods configured: aip-151/v1 needs {tool: {http_method, path}}")
        for tool, method in self._methods.items():
            if not isinstance(method, dict) or not isinstance(method.get("path"), str):
                raise AdapterError(f"method for tool {tool!r} needs a path", detail={"tool": tool})
        self._pass_gate("ListOperations probe")
        deadline = time.monotonic() + self._deadline_s
        try:
            with request_deadline(deadline):
                # Only the status matters: the body is never read.
                with self._client.stream("GET", f"{self._base}/{self._list_path}") as probe:
                    pass
        except httpx.TransportError as exc:
            raise TransientError(f"service unreachable: {type(exc).__name__}", detail={}) from exc
        return Negotiated(
            protocol_version=VERSION, session_id=None,
            capabilities={"adapter_options": self._options,
                          "list_operations": probe.status_code < 400},
            server_info={}, supports_task_tools_call=True, supports_cancel=True,
            supports_list=probe.status_code < 400,
        )

    def list_tools(self) -> list[ToolDescriptor]:
        # A configured LRO method always answers with an Operation: "required".
        return [ToolDescriptor(name=tool, task_support="required", raw={"name": tool, **method})
                for tool, method in sorted(self._methods.items())]

    def _create(self, *, tool: str, arguments: dict[str, Any], submission_key: str) -> RemoteTask:
        method = self._methods.get(tool)
        if method is None:
            raise AdapterError(f"tool {tool!r} has no configured method", detail={"tool": tool})
        if not submission_key.isascii() or not 0 < len(submission_key) <= MAX_REQUEST_ID:
            raise AdapterError("submission key does not fit AIP-155 request_id (<= 36 ASCII)")
        body = {**arguments, "requestId": submission_key}
        url = f"{self._base}/{str(method['path']).lstrip('/')}"
        response = self._send(str(method.get("http_method", "POST")), url, what=f"create {tool}",
                              json=body, creates=True)
        return self._remember(remote_task(self._json(response, what="create"), expect_name=None))

    def submit(
        self, *, tool: str, arguments: dict[str, Any], ttl_ms: int | None, submission_key: str
    ) -> SubmitOutcome:
        # ttl_ms has no AIP-151 counterpart (expiry is the service's); it is not sent.
        task = self._create(tool=tool, arguments=arguments, submission_key=submission_key)
        return SubmitOutcome(task=task, sync_result=None, raw=task.raw)

    def key_resolution_modes(self, *, server_capabilities: Mapping[str, Any]) -> frozenset[str]:
        # AIP-155: the service deduplicates on request_id, so resending the identical create is
        # the lookup by key. No list filter exists, so there is no candidate scan.
        return frozenset({KEY_DEDUP_RESEND})

    def lookup_by_key(
        self,
        *,
        submission_key: str,
        created_after: datetime,
        server_capabilities: Mapping[str, Any] | None = None,
        submitted_session: str | None = None,
        resend: ResendRequest | None = None,
    ) -> RemoteTask | None:
        """Resend the identical create with the same request_id: the same operation comes back.

        Only within the server's dedupe window; after a long outage the caller should not
        rely on it (it could create a second operation) but reconcile instead. Without the
        original request there is nothing to resend, so no proof either way.
        """
        if resend is None:
            return None
        return self._create(tool=resend.tool, arguments=resend.arguments,
                            submission_key=submission_key)

    def candidates_by_window(
        self, *, created_after: datetime, created_before: datetime
    ) -> list[RemoteTask]:
        return []

    def call_sync(
        self, *, tool: str, arguments: dict[str, Any], timeout_s: float, submission_key: str
    ) -> FetchedResult:
        raise TaskNotSupportedError("AIP-151 methods always answer with an operation", detail={"tool": tool})

    def get(self, *, remote_id: str) -> RemoteTask:
        response = self._send("GET", self._operation_url(remote_id), what="GetOperation")
        return self._remember(remote_task(self._json(response, what="GetOperation"), expect_name=remote_id))

    def fetch_result(self, *, remote_id: str, timeout_s: float) -> FetchedResult:
        with self._lock:
            cached = self._results.pop(remote_id, None)
        if cached is not None:
            return cached
        task = self.get(remote_id=remote_id)
        with self._lock:
            self._results.pop(remote_id, None)
        if task.result is None:
            raise ProtocolViolationError("operation is not done", detail={"name": remote_id})
        return task.result

    def read_input(self, *, remote_id: str, wait_s: float) -> InputWindow:
        raise TaskNotSupportedError("AIP-151 operations take no input", detail={})

    def answer_input(self, *, request_id: str | int, result: dict[str, Any], remote_id: str) -> None:
        raise TaskNotSupportedError("AIP-151 operations take no input", detail={})

    def cancel(self, *, remote_id: str) -> RemoteTask:
        """`:cancel` (best effort, an ack), then Get: the operation may still be running, and
        may end CANCELLED, SUCCEEDED or FAILED. Cancel of a done operation is harmless."""
        try:
            self._send("POST", self._operation_url(remote_id) + ":cancel", what="CancelOperation", json={})
        except AdapterError as exc:
            if exc.detail.get("status") != "FAILED_PRECONDITION":
                raise
            # Some services refuse to cancel a done operation: read what it became.
        return self.get(remote_id=remote_id)

    def delete(self, *, remote_id: str) -> None:
        """DeleteOperation, only after the result is stored. 404 = already gone = success."""
        try:
            self._send("DELETE", self._operation_url(remote_id), what="DeleteOperation")
        except NotFoundError:
            return

    def list_tasks(self) -> list[RemoteTask]:
        raise TaskNotSupportedError("ListOperations is not used: no filter by request_id", detail={})

    def close(self) -> None:
        if self._transport is None:
            self._client.close()

    def __enter__(self) -> Aip151Adapter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
