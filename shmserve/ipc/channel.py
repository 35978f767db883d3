"""Framed message channels over a Unix stream socket.

`AsyncChannel` is the front's end (an asyncio protocol on the event loop); `SyncChannel` is
the worker's end (blocking socket; `send` may be called from several threads).
"""

import asyncio
import socket
import threading
from typing import Callable, Optional

from shmserve.ipc import codec


class AsyncChannel(asyncio.Protocol):
    def __init__(self, on_message: Callable[[object], None], on_closed: Callable[[Optional[Exception]], None]):
        self._on_message = on_message
        self._on_closed = on_closed
        self._splitter = codec.FrameSplitter()
        self._transport: Optional[asyncio.Transport] = None

    def connection_made(self, transport):
        self._transport = transport

    def data_received(self, data):
        try:
            bodies = self._splitter.feed(data)
            for body in bodies:
                self._on_message(codec.decode_body(body))
        except Exception as exc:  # a corrupt frame means the worker is unusable
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
    def __init__(self, sock: socket.socket):
        self._sock = sock
        self._splitter = codec.FrameSplitter()
        self._pending: list = []
        self._send_lock = threading.Lock()

    def recv(self):
        """Next message, or None when the peer closed the socket."""
        while not self._pending:
            data = self._sock.recv(1 << 16)
            if not data:
                return None
            self._pending.extend(self._splitter.feed(data))
        return codec.decode_body(self._pending.pop(0))

    def send(self, message) -> None:
        header, body = codec.encode(message)
        with self._send_lock:
            sent = self._sock.sendmsg((header, body))
            if sent < len(header) + len(body):  # rare: the socket buffer was full
                self._sock.sendall((header + body)[sent:])

    def close(self) -> None:
        self._sock.close()
