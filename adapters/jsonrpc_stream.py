"""A request whose SSE reply is read on a background thread (tasks/result while a task waits
for input): the stream outlives the call that opened it, and its reader can be stopped.
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx

from adapters.errors import AdapterError
from adapters.jsonrpc import JsonRpcClient
from adapters.jsonrpc_frames import Message, RpcReply

# How long an input stream may sit silent before we give it up. Long on purpose: a live
# tasks/result stream is the only channel a Shape A server delivers follow-up input on,
# and a task may work for a long time between two input rounds.
STREAM_IDLE_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class StreamEnd:
    """Last item of a MessageStream: the response, or why there is none."""

    reply: RpcReply | None
    error: AdapterError | None


class MessageStream:
    """A request whose SSE reply is read on a background thread into a queue.

    Used for tasks/result while a task waits for input: the caller can wait with its own
    deadline (httpx timeouts are per read and cannot bound a whole stream) and can leave
    the stream open between calls. The stream owns `client` and closes it when it ends.
    """

    def __init__(self, *, client: JsonRpcClient, method: str, params: dict[str, Any]) -> None:
        self.request_id = client.new_id()
        self._client = client
        self._method = method
        self._params = params
        self._queue: queue.Queue[Message | StreamEnd] = queue.Queue()
        self._socket: socket.socket | None = None
        self._closed = threading.Event()
        self.finished = False  # the consumer has taken the StreamEnd item
        self.opened_at = time.monotonic()  # before the request goes out: see ServerRequest
        self._thread = threading.Thread(target=self._run, name=f"mcp-stream-{self.request_id}", daemon=True)

    def start(self) -> MessageStream:
        # The gate runs here, on the caller's thread: it belongs to the caller's call (its QPS
        # token and purpose), and a refusal must reach the caller, not the reader thread.
        self._client.gate(self._method)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            timeout = httpx.Timeout(self._client.timeout_s, read=STREAM_IDLE_TIMEOUT_S)
            reply = self._client.exchange(
                method=self._method,
                params=self._params,
                request_id=self.request_id,
                timeout=timeout,
                creates=False,
                on_message=self._queue.put,
                on_open=self._remember_socket,
                gated=True,
            )
            self._queue.put(StreamEnd(reply=reply, error=None))
        except AdapterError as exc:
            self._queue.put(StreamEnd(reply=None, error=exc))
        except Exception as exc:  # never let the reader thread die silently
            self._queue.put(StreamEnd(reply=None, error=AdapterError(f"stream reader failed: {exc!r}")))
        finally:
            self._client.close()

    def _remember_socket(self, response: httpx.Response) -> None:
        stream = response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        self._socket = sock if isinstance(sock, socket.socket) else None
        if self._closed.is_set():
            self._shutdown()

    def next_item(self, *, timeout_s: float) -> Message | StreamEnd | None:
        """The next message, the StreamEnd, or None if nothing came within timeout_s."""
        if self.finished:
            return None
        try:
            item = self._queue.get(timeout=max(0.0, timeout_s))
        except queue.Empty:
            return None
        if isinstance(item, StreamEnd):
            self.finished = True
        return item

    @property
    def reading(self) -> bool:
        """The reader thread is still alive (tests check that close() really stops it)."""
        return self._thread.is_alive()

    def close(self) -> None:
        """Stop reading. shutdown() wakes a thread blocked in recv; close() alone would not."""
        self._closed.set()
        self._shutdown()

    def _shutdown(self) -> None:
        if self._socket is not None:
            try:
                self._socket.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
