"""One gRPC call (an RPC, on one HTTP/2 stream): what its handler sees as `context`, the
request iterator of a streaming method, and the call's deadline as the client sent it
(grpc-timeout).

The connection (connection.py) makes a Call for each stream the client opens and keeps it in
`calls` until it ends; its parts read and update it (call_dispatch.py as the client's frames
come, call_answers.py as the handler answers, inbound.py as its messages arrive).
"""

import asyncio
from typing import TYPE_CHECKING

from shmserve.grpc.inbound import Compressed
from shmserve.grpc.status import RpcError

if TYPE_CHECKING:
    from shmserve.grpc.connection import Connection
    from shmserve.grpc.transport import Method

# Headers that are HTTP/2 or gRPC machinery, not the caller's metadata.
_RESERVED = frozenset((b"content-type", b"te", b"grpc-timeout", b"grpc-encoding",
                       b"grpc-accept-encoding", b"user-agent"))
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


class Call:
    """One RPC: what its handler sees as `context`, and as the request iterator of a
    streaming method."""

    __slots__ = ("conn", "stream_id", "method", "headers", "encoding", "response_encoding",
                 "buffer", "messages", "remote_ended", "waiter", "task", "deadline",
                 "expired", "headers_sent", "finished", "lent", "reserved", "queued",
                 "checked", "incoming")

    def __init__(self, conn: "Connection", stream_id: int, method: "Method", headers: list,
                 encoding: bytes | None, response_encoding: bytes | None = None):
        self.conn = conn
        self.stream_id = stream_id
        self.method = method
        self.headers = headers
        self.encoding = encoding  # of the client's messages
        self.response_encoding = response_encoding  # of ours, None: not compressed
        # Its messages coming in (inbound.Inbound's): bytes of the next one, whole ones not
        # taken yet, and how the connection's flow control stands with them.
        self.buffer = bytearray()
        self.messages: list = []
        self.remote_ended = False
        self.waiter: asyncio.Future | None = None
        self.task: asyncio.Task | None = None
        self.deadline: asyncio.TimerHandle | None = None
        self.expired = False
        self.headers_sent = False
        self.finished = False
        self.lent = 0  # the DATA size of its answer while another writer has it, else 0
        self.reserved = 0  # the size of the unfinished message admitted
        self.queued = False  # its unfinished message waits for room
        self.checked = False  # its unfinished message's start was looked at
        self.incoming = None  # a large message being received

    # The handler's context.
    def invocation_metadata(self) -> tuple:
        return tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in self.headers
                     if k[:1] != b":" and k not in _RESERVED)

    # The request iterator of a streaming method.
    def __aiter__(self):
        return self

    async def __anext__(self):
        while not self.messages:
            if self.remote_ended or self.finished:
                raise StopAsyncIteration
            self.waiter = self.conn.loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        if type(self.messages[0]) is Compressed:
            try:
                await self.conn.inbound.inflate_first(self)
            except RpcError as exc:  # the call ends with it, not only the iteration
                self.conn._fail(self, exc.code, exc.message)
                raise StopAsyncIteration from None
        return self.conn.take(self)

    def wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    # The handler's way past its own iteration (a streaming handler only).
    def send_now(self, data: bytes) -> bool:
        """Writes message `data` at once, when nothing makes it wait (the socket keeps up,
        it fits the flow-control window and one frame, no compression); False when it must
        be yielded like the others. The handler says when: nothing it yielded may still be
        on its way out."""
        return self.conn.send_now(self, data)


def timeout_seconds(value: bytes) -> float | None:
    """grpc-timeout: up to 8 digits and a unit (H, M, S, m, u, n)."""
    digits, unit = value[:-1], value[-1:]
    if not digits.isdigit() or len(digits) > 8 or unit not in _TIMEOUT_UNITS:
        return None
    return int(digits) * _TIMEOUT_UNITS[unit]
