"""Framed message channels over a Unix stream socket.

`AsyncChannel` is the front's end (an asyncio protocol on the event loop); `SyncChannel` is
the worker's end (blocking socket; `send` may be called from several threads).
"""

import asyncio
import collections
import os
import socket
import threading
import time
from typing import Callable, Optional

from shmserve.ipc import codec
from shmserve.ipc.idle_spin import IdleSpin


# Frames handled per turn of the event loop. A streaming worker can deliver hundreds of frames
# in one read; handling them all at once would hold back the tasks the first ones woke (the
# readers that forward responses), and so the time to first response.
FRAMES_PER_TURN = 8


class AsyncChannel(asyncio.Protocol):
    def __init__(self, on_message: Callable[[object], None], on_closed: Callable[[Optional[Exception]], None]):
        self._on_message = on_message
        self._on_closed = on_closed
        self._splitter = codec.FrameSplitter()
        self._transport: Optional[asyncio.Transport] = None
        self._backlog: collections.deque = collections.deque()
        self._paused = False

    def connection_made(self, transport):
        self._transport = transport

    def data_received(self, data):
        try:
            self._backlog.extend(self._splitter.feed(data))
        except Exception as exc:  # a corrupt frame means the worker is unusable
            self._fail(exc)
            return
        if not self._paused:
            self._handle_backlog()

    def _handle_backlog(self):
        backlog = self._backlog
        try:
            for _ in range(FRAMES_PER_TURN):
                if not backlog:
                    break
                self._on_message(codec.decode_body(backlog.popleft()))
        except Exception as exc:
            self._fail(exc)
            return
        transport = self._transport
        if transport is None:
            return
        if backlog:
            if not self._paused:
                self._paused = True
                transport.pause_reading()
            asyncio.get_running_loop().call_soon(self._handle_backlog)
        elif self._paused:
            self._paused = False
            transport.resume_reading()

    def _fail(self, exc):
        self._backlog.clear()
        if self._transport is not None:
            self._transport.abort()
        self._on_closed(exc)

    def connection_lost(self, exc):
        self._transport = None
        self._on_closed(exc)

    def send(self, message) -> None:
        if self._transport is None or self._transport.is_closing():
            raise ConnectionError("worker channel is closed")
        self._transport.writelines(codec.encode(message))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class SyncChannel:
    def __init__(self, sock: socket.socket, spin: Optional[IdleSpin] = None):
        """`spin`: when to poll for the next frame before blocking (see idle_spin.py)."""
        self._sock = sock
        self._splitter = codec.FrameSplitter()
        self._pending: list = []
        self._send_lock = threading.Lock()
        self._spin = spin
        self._ended = False  # the peer closed the socket, as has_data found

    def recv(self):
        """Next message, or None when the peer closed the socket."""
        while not self._pending:
            if self._ended:
                return None
            spin = self._spin
            data = self._poll(spin) if spin is not None and spin.should_spin() else None
            if data is None:
                data = self._sock.recv(1 << 16)
            if not data:
                return None
            self._pending.extend(self._splitter.feed(data))
        return codec.decode_body(self._pending.pop(0))

    def has_data(self) -> bool:
        """Whether recv would return without waiting (a frame, part of one, or the end). What
        has come is read here, for recv to take."""
        if self._pending or self._ended:
            return True
        try:
            data = self._sock.recv(1 << 16, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        if data:
            self._pending.extend(self._splitter.feed(data))
        else:
            self._ended = True
        return True

    def _poll(self, spin: IdleSpin):
        """The next bytes if they come within the spin time and while the machine has a core
        to spare, else None. MSG_DONTWAIT rather than a non-blocking socket: model threads may
        be sending on it meanwhile."""
        deadline = time.perf_counter() + spin.spin_s
        while True:
            try:
                return self._sock.recv(1 << 16, socket.MSG_DONTWAIT)
            except BlockingIOError:
                if time.perf_counter() >= deadline or not spin.should_spin():
                    return None
                os.sched_yield()  # a thread or process that has work runs first

    def send(self, message) -> None:
        header, body = codec.encode(message)
        with self._send_lock:
            sent = self._sock.sendmsg((header, body))
            if sent < len(header) + len(body):  # the socket buffer was full: a large frame
                if sent < len(header):
                    self._sock.sendall(header[sent:])
                    sent = len(header)
                self._sock.sendall(memoryview(body)[sent - len(header):])

    def close(self) -> None:
        self._sock.close()
