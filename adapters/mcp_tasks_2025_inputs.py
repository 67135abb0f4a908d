"""Input rounds of the Shape A adapter (MCP 2025-11-25): the server's requests, read from a
held tasks/result stream, and our answers to them.

Input requests are delivered once, on an open tasks/result stream. mcp 1.30 keeps serving every
tasks/result request it received until the task ends (a client that only hangs up does not stop
it) and hands later input requests to whichever of them dequeues first; one whose client went
away drops them (round 2 of a two-round elicitation lost once the process that read round 1
exited). So a stream is held only for one bounded `read_input`, and released with
`notifications/cancelled` for its request: the server stops that handler, and what it queues
later waits for the next tasks/result, from any process. The release reads on until the stream
ends, so nothing sent before the cancel took effect is lost (docs/conformance.md, "Input rounds
across processes").
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from typing import Any

from adapters import decode, limits
from adapters.base import FetchedResult, InputWindow, ServerRequest
from adapters.errors import AdapterError, LostResponseError, ProtocolViolationError, TransientError
from adapters.jsonrpc import JsonRpcClient
from adapters.jsonrpc_frames import Message, RpcReply, message_kind
from adapters.jsonrpc_stream import MessageStream, StreamEnd

RELATED_TASK_META = "io.modelcontextprotocol/related-task"
INPUT_METHODS = frozenset({"elicitation/create", "sampling/createMessage"})
# After the first input request, wait this long for siblings before handing the batch over.
INPUT_GRACE_S = 0.3
# After cancelling a held stream, read on this long for what the server sent before the cancel.
RELEASE_DRAIN_S = 1.0
# How long a stream's release waits for its cancel to be let out (QPS gate, 429/503): an unsent
# cancel can cost a whole input round (see `_send_release`), a few seconds of one thread cannot.
RELEASE_CANCEL_WAIT_S = 10.0
# The pause between two tries when the refusal named no time: one token interval at 20 QPS.
RELEASE_CANCEL_MIN_WAIT_S = 0.05

# (endpoint, session, task) -> its open tasks/result stream; see the module docstring.
_INPUT_STREAMS: dict[tuple[str, str | None, str], MessageStream] = {}
_INPUT_STREAMS_LOCK = threading.Lock()


def close_input_streams() -> None:
    """Close every input stream this process holds open (worker shutdown, tests)."""
    with _INPUT_STREAMS_LOCK:
        streams = list(_INPUT_STREAMS.values())
        _INPUT_STREAMS.clear()
    for stream in streams:
        stream.close()


def related_task_id(container: dict[str, Any] | None) -> str | None:
    meta = (container or {}).get("_meta")
    related = meta.get(RELATED_TASK_META) if isinstance(meta, dict) else None
    task_id = related.get("taskId") if isinstance(related, dict) else None
    return task_id if isinstance(task_id, str) else None


def server_request(message: Message) -> ServerRequest:
    params = message.get("params") or {}
    if not isinstance(params, dict):
        raise ProtocolViolationError("server request params is not an object",
                                     detail={"method": decode.quote(message.get("method"))})
    return ServerRequest(
        request_id=decode.server_request_id(message["id"]),
        method=message["method"],
        params=params,
        related_task_id=related_task_id(params),
    )


class InputStreams:
    """The adapter's part that holds input streams and routes what the server asks on them.

    Mixed into McpTasks2025Adapter, which owns the client, the session and the result decoding."""

    _rpc: JsonRpcClient
    _session_id: str | None
    # Server requests that arrived on some stream but were not asked for yet.
    pending_server_requests: list[ServerRequest]
    notifications: deque[Message]

    def _payload_outcome(self, reply: RpcReply, *, remote_id: str) -> FetchedResult:
        raise NotImplementedError  # the adapter's: how a tasks/result answer is read

    def _keep_server_messages(self, messages: tuple[Message, ...] | list[Message]) -> None:
        for message in messages:
            if message_kind(message) == "request":
                self._keep_pending(server_request(message))
            else:
                self.notifications.append(message)

    def _keep_pending(self, request: ServerRequest) -> None:
        self.pending_server_requests.append(request)
        # A server may send requests without end: keep the newest, bounded.
        del self.pending_server_requests[: -limits.MAX_PENDING_SERVER_REQUESTS]

    def read_input(self, *, remote_id: str, wait_s: float) -> InputWindow:
        deadline = time.monotonic() + wait_s
        collected = [r for r in self.pending_server_requests if self._is_input_for(r, remote_id)]
        self.pending_server_requests = [r for r in self.pending_server_requests if r not in collected]
        stream, fresh = self._input_stream(remote_id)
        result: FetchedResult | None = None
        try:
            result = self._read_window(stream, fresh=fresh, remote_id=remote_id,
                                       deadline=deadline, collected=collected)
        finally:
            self._release_stream(remote_id, collected=collected)
        return InputWindow(requests=tuple(collected), result=result)

    def _read_window(self, stream: MessageStream, *, fresh: bool, remote_id: str, deadline: float,
                     collected: list[ServerRequest]) -> FetchedResult | None:
        result: FetchedResult | None = None
        while (remaining := deadline - time.monotonic()) > 0:
            item = stream.next_item(timeout_s=min(remaining, INPUT_GRACE_S) if collected else remaining)
            if item is None:
                if collected:
                    break  # the grace passed without another request
                continue
            if isinstance(item, StreamEnd):
                self._drop_stream(remote_id, only=stream)
                if isinstance(item.error, LostResponseError) and not fresh and not collected:
                    # A stream kept from an earlier call died meanwhile (idle, restart): that is
                    # no news for this call, so open one new stream and keep waiting.
                    stream, fresh = self._input_stream(remote_id)
                    continue
                try:
                    result = self._stream_outcome(item, remote_id=remote_id)
                except AdapterError:
                    if not collected:
                        raise
                    # Hand over what was read; the stream is gone, the next read opens a new one.
                break
            self._route_stream_message(item, stream=stream, remote_id=remote_id, collected=collected)
        return result

    def _release_stream(self, remote_id: str, *, collected: list[ServerRequest]) -> None:
        """Stop holding the task's stream: cancel its request on the server, then read what
        the server sent before the cancel took effect, up to the end of the stream."""
        key = (self._rpc.url, self._session_id, remote_id)
        with _INPUT_STREAMS_LOCK:
            stream = _INPUT_STREAMS.pop(key, None)
        if stream is None or stream.finished:
            return
        cancelled = {"jsonrpc": "2.0", "method": "notifications/cancelled",
                     "params": {"requestId": stream.request_id, "reason": "input read window over"}}
        self._send_release(cancelled)
        drain_until = time.monotonic() + RELEASE_DRAIN_S
        while (remaining := drain_until - time.monotonic()) > 0:
            item = stream.next_item(timeout_s=remaining)
            if item is None or isinstance(item, StreamEnd):
                break
            self._route_stream_message(item, stream=stream, remote_id=remote_id, collected=collected)
        stream.close()

    def _send_release(self, cancelled: Message) -> None:
        """Send the stream's cancel, waiting out refusals that provably sent nothing (the QPS
        gate, a 429 or 503) up to RELEASE_CANCEL_WAIT_S. Both official SDKs keep serving a
        `tasks/result` whose request was never cancelled and hand it the task's next request,
        once, into a stream nobody reads any more: that round would never open anywhere."""
        give_up = time.monotonic() + RELEASE_CANCEL_WAIT_S
        while True:
            try:
                self._rpc.post_message(message=cancelled, what="notifications/cancelled")
                return
            except TransientError as exc:
                wait = min(max(exc.retry_after or 0.0, RELEASE_CANCEL_MIN_WAIT_S),
                           give_up - time.monotonic())
                if wait <= 0:
                    return
                time.sleep(wait)
            except AdapterError:
                # Refused or unreachable: nothing more to do here; nothing read is lost, the
                # drain below still reads what the stream holds.
                return

    @staticmethod
    def _is_input_for(request: ServerRequest, remote_id: str) -> bool:
        return request.method in INPUT_METHODS and request.related_task_id == remote_id

    def _route_stream_message(
        self, message: Message, *, stream: MessageStream, remote_id: str,
        collected: list[ServerRequest],
    ) -> None:
        if message_kind(message) != "request":
            self.notifications.append(message)
            return
        request = server_request(message)
        if self._is_input_for(request, remote_id):
            # mcp 1.30 names a task's request `task-<task id>-<id(params)>`, and CPython reuses a
            # freed dict's address: round 2 may carry round 1's id. When the stream was opened
            # says whether the id can still be the old request (see ServerRequest).
            collected.append(dataclasses.replace(request, stream_opened_at=stream.opened_at))
            decode.input_request_count(len(collected), what="tasks/result input stream")
        else:
            self._keep_pending(request)

    def _stream_outcome(self, end: StreamEnd, *, remote_id: str) -> FetchedResult:
        if end.error is not None:
            raise end.error
        assert end.reply is not None  # StreamEnd carries exactly one of the two
        return self._payload_outcome(end.reply, remote_id=remote_id)

    def answer_input(self, *, request_id: str | int, result: dict[str, Any], remote_id: str) -> None:
        meta = dict(result.get("_meta") or {})
        meta[RELATED_TASK_META] = {"taskId": remote_id}  # responses that belong to a task are tagged
        message = {"jsonrpc": "2.0", "id": request_id, "result": {**result, "_meta": meta}}
        self._rpc.post_message(message=message, what="input response")

    def _input_stream(self, remote_id: str) -> tuple[MessageStream, bool]:
        """The task's open tasks/result stream, and whether it was opened just now."""
        key = (self._rpc.url, self._session_id, remote_id)
        with _INPUT_STREAMS_LOCK:
            stream = _INPUT_STREAMS.get(key)
            if stream is not None and not stream.finished:
                return stream, False
            # Own client: the stream must survive this adapter's close().
            params = {"taskId": remote_id}
            stream = MessageStream(client=self._rpc.clone(), method="tasks/result", params=params).start()
            _INPUT_STREAMS[key] = stream
            return stream, True

    def _drop_stream(self, remote_id: str, *, only: MessageStream | None = None) -> None:
        """Forget (and close) the task's stream; with `only`, just if it is still that one."""
        key = (self._rpc.url, self._session_id, remote_id)
        with _INPUT_STREAMS_LOCK:
            stream = _INPUT_STREAMS.get(key)
            if stream is None or (only is not None and stream is not only):
                return
            del _INPUT_STREAMS[key]
        stream.close()
