"""The messages a gRPC connection's clients send, as they come in: the length-prefixed framing
and its size limit, flow control (how much of each call's messages the connection takes, and
when), large messages received into mappings of their own, and compressed ones inflated a
slice at a time. connection.py's connection owns one Inbound, and hands it each call's DATA.

Flow control bounds what a connection buffers. A stream may be sent STREAM_WINDOW bytes
(HTTP/2's default) before its call grants more: a message being received gets a window as large
as what is left of it (at most MESSAGE_WINDOW at a time, so large tensors arrive without
waiting) once the connection has room for it, that is while the unfinished messages admitted
stay within MESSAGE_BUDGET, or it is alone (`_admit`); other streams wait their turn at
STREAM_WINDOW. So a connection holds at most its streams x STREAM_WINDOW bytes beyond the
messages it admitted. (The connection's own window is given back as data comes: http2.py.)
"""

import asyncio
import collections
import mmap
import zlib

from shmserve.grpc import http2
from shmserve.grpc.status import (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNIMPLEMENTED,
                                  RpcError)
from shmserve.ipc.malloc import release_mapping

STREAM_WINDOW = 65535
MESSAGE_WINDOW = 16 * 1024 * 1024
MESSAGE_BUDGET = 64 * 1024 * 1024
# An unfinished message this long is looked at (the method's check_partial) before its window
# grows: garbage ends its call at once instead of filling memory. A client always has this
# much of STREAM_WINDOW left for a message's first bytes (refill keeps at least half of it).
CHECK_PARTIAL_FROM = 16 * 1024
# A message this large is received into a mapping of its own size: its pages are faulted in as
# its frames come, nothing is copied as it grows (a bytearray grows by eighths, and copied a
# 2 GiB message about eight times over, holding the loop a third of a second at the last
# steps), and it is unmapped off the loop (release_mapping) once nothing uses it.
LARGE_MESSAGE = 64 * 1024 * 1024
# A compressed message is inflated this much at a time, the loop serving others in between.
INFLATE_SLICE = 1024 * 1024
_INFLATE_INPUT = 256 * 1024
# The grpc-encoding values a message may come in, and their zlib wbits.
WBITS = {b"gzip": 31, b"deflate": 15}


class Compressed:
    """A message as it came, compressed: it is inflated when its handler takes it."""

    __slots__ = ("data",)

    def __init__(self, data):
        self.data = data


class _Incoming:
    """A large message being received (LARGE_MESSAGE), straight into its own mapping."""

    __slots__ = ("store", "size")

    def __init__(self, size: int, first):
        self.store = mmap.mmap(-1, size)
        self.size = size
        self.store.write(first)

    def fill(self, data) -> int:
        """Takes what of `data` belongs to the message: how much that is."""
        taken = min(len(data), self.size - self.store.tell())
        self.store.write(data if taken == len(data) else memoryview(data)[:taken])
        return taken

    def full(self) -> bool:
        return self.store.tell() == self.size

    def received(self) -> int:
        return self.store.tell()

    def message(self):
        """The message (past its 5-byte prefix), as a view; the mapping goes once no view of
        it is left."""
        view = memoryview(self.store)[5:]
        release_mapping(self.store)
        return view


class Inbound:
    """One connection's messages in. A call (call.Call) keeps its own part: `buffer`
    (bytes of messages not complete yet), `messages` (complete, not taken yet), `incoming` (a
    large message being received), `reserved` (the size of its message admitted), `queued`
    (waiting for room), `checked` (its message's start was looked at). `fail(call, code,
    message)` ends a call with a status; `flush_soon()` has the frames queued written."""

    def __init__(self, http2_conn: http2.ServerConnection, max_message_size: int,
                 max_decompressed_size: int, fail, flush_soon):
        self.http2 = http2_conn
        self.max_message_size = max_message_size
        self.max_decompressed_size = max_decompressed_size
        self._fail = fail
        self._flush_soon = flush_soon
        self.reserved = 0  # bytes of the unfinished messages admitted (_admit)
        self._waiting: collections.deque = collections.deque()  # calls waiting for room

    def data(self, call, data) -> None:
        """DATA of `call`'s stream: complete messages are appended to `call.messages` (and
        its waiter woken), the rest kept for the next."""
        incoming = call.incoming
        if incoming is not None:
            taken = incoming.fill(data)
            if not incoming.full():
                self.refill(call)
                return
            call.incoming = None
            self._release(call)
            compressed = incoming.store[0]
            message = incoming.message()
            call.messages.append(Compressed(message) if compressed else message)
            call.wake()
            data = memoryview(data)[taken:]
        buffer = call.buffer
        buffer += data
        limit = self.max_message_size
        while len(buffer) >= 5:
            length = int.from_bytes(buffer[1:5], "big")
            if length > limit:
                self._fail(call, RESOURCE_EXHAUSTED,
                           f"Received message larger than max ({length} vs. {limit})")
                return
            end = 5 + length
            if len(buffer) < end:
                break
            compressed = buffer[0]
            if len(buffer) == end:
                # The usual case: the buffer is one message, handed on without a copy.
                message = memoryview(buffer)[5:]
                buffer = call.buffer = bytearray()
            else:
                with memoryview(buffer) as view:
                    message = bytes(view[5:end])
                del buffer[:end]
            if call.reserved:
                self._release(call)
            call.messages.append(Compressed(message) if compressed else message)
            call.wake()
        if call.method.streaming:
            if not call.messages:
                self.refill(call)
        elif call.messages and (buffer or len(call.messages) > 1):
            self._fail(call, UNIMPLEMENTED, "a unary call takes exactly one request message")
        else:
            # A unary call's message does not wait to be taken: the client may go on (with
            # the end of its stream; anything more is refused above).
            self.refill(call)

    def refill(self, call) -> None:
        """Grows `call`'s stream window as far as the call can take what comes, once it has
        taken every message that came: to the rest of the message being received when the
        connection has room for it (_admit), else (between messages) to STREAM_WINDOW."""
        if call.remote_ended or call.finished:
            return
        if call.incoming is not None:
            self.http2.ensure_window(call.stream_id, min(
                call.incoming.size - call.incoming.received(), MESSAGE_WINDOW))
            return
        buffer = call.buffer
        if len(buffer) < 5:
            self.http2.ensure_window(call.stream_id, STREAM_WINDOW)
            return
        length = int.from_bytes(buffer[1:5], "big")
        check = call.method.check_partial
        if not call.checked and check is not None and not buffer[0]:  # not compressed
            if len(buffer) < CHECK_PARTIAL_FROM:
                return  # its first bytes are looked at before the window grows
            call.checked = True
            error = check(bytes(buffer[5:]), length)
            if error is not None:
                self._fail(call, INVALID_ARGUMENT, error)
                return
        if call.reserved or self._admit(call, 5 + length):
            if 5 + length >= LARGE_MESSAGE:
                call.incoming = _Incoming(5 + length, buffer)
                call.buffer = bytearray()
            self.http2.ensure_window(call.stream_id, min(5 + length - len(buffer),
                                                         MESSAGE_WINDOW))

    def _admit(self, call, size: int) -> bool:
        """Room for an unfinished message of `size` bytes: the messages admitted stay within
        MESSAGE_BUDGET, but for a larger one admitted alone. Calls are admitted in the order
        they asked; one that must wait is queued, and its client stops at STREAM_WINDOW."""
        waiting = self._waiting
        if (waiting and waiting[0] is not call) or (
                self.reserved and self.reserved + size > MESSAGE_BUDGET):
            if not call.queued:
                call.queued = True
                waiting.append(call)
            return False
        if call.queued:
            waiting.popleft()
            call.queued = False
        call.reserved = size
        self.reserved += size
        return True

    def _release(self, call) -> None:
        """`call`'s admitted message is complete (or the call is over): the calls waiting
        may fit now."""
        self.reserved -= call.reserved
        call.reserved = 0
        waiting = self._waiting
        while waiting:
            head = waiting[0]
            self.refill(head)
            if head.queued:  # still waiting (or it failed: forget took it out)
                break
        self._flush_soon()

    def forget(self, call) -> None:
        """`call` is over: what it held of the connection goes."""
        if call.queued:
            call.queued = False
            self._waiting.remove(call)
        if call.incoming is not None:
            release_mapping(call.incoming.store)
            call.incoming = None
        if call.reserved:
            self._release(call)

    async def inflate_first(self, call) -> None:
        """The first of `call`'s messages, inflated in slices (the loop serves others in
        between) and no further than --grpc-max-decompressed-size (and the message size
        limit)."""
        data = call.messages[0].data
        if call.encoding is None:
            raise RpcError(INVALID_ARGUMENT, "a compressed message without grpc-encoding")
        limit = min(self.max_message_size, self.max_decompressed_size)
        inflater = zlib.decompressobj(WBITS[call.encoding])
        out = bytearray()
        view = memoryview(data)
        first = True
        for start in range(0, len(view), _INFLATE_INPUT):
            pending = view[start:start + _INFLATE_INPUT]
            while True:
                if not first:
                    await asyncio.sleep(0)
                    if call.finished:
                        raise asyncio.CancelledError
                first = False
                try:
                    chunk = inflater.decompress(pending, INFLATE_SLICE)
                except zlib.error as exc:
                    raise RpcError(INVALID_ARGUMENT,
                                   f"cannot decompress the message: {exc}") from None
                out += chunk
                if len(out) > limit:
                    raise RpcError(RESOURCE_EXHAUSTED,
                                   f"Received message larger than max (more than {limit} "
                                   f"bytes decompressed; --grpc-max-decompressed-size)")
                pending = inflater.unconsumed_tail
                if inflater.eof or (not pending and len(chunk) < INFLATE_SLICE):
                    break
            if inflater.eof:
                break
        if not inflater.eof:
            raise RpcError(INVALID_ARGUMENT, "cannot decompress the message: it is truncated")
        call.messages[0] = out
