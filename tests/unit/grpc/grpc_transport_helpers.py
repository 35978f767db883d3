"""What the gRPC transport's test modules (test_grpc_transport_*.py) share: the layer in
process, over a fake socket (`_Socket`) between an h2 client and the server's connection
object, with echo methods (`_echo`, `_echo_stream`) or one that never answers (`_stay`) behind
it; `_Client`, such a client with its frames pumped by hand; and `_compressed`, a message with
the compressed flag set."""

import asyncio

import h2.config
import h2.connection
import h2.events

from shmserve.grpc.connection import Connection


ECHO = "/test.Echo/Unary"
STREAM = "/test.Echo/Stream"


class _Socket(asyncio.Transport):
    def __init__(self):
        super().__init__()
        self.out = bytearray()
        self.closed = False
        self.reading = True

    def write(self, data) -> None:
        self.out += data

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


async def _echo(request, call):
    return bytes(request)


async def _echo_stream(requests, call):
    async for request in requests:
        yield bytes(request)


def _compressed(message: bytes) -> bytes:
    return b"\1" + len(message).to_bytes(4, "big") + message


class _Client:
    """An h2 client on an in-process connection (over _Socket), frames pumped by hand."""

    def __init__(self, server, sock=None):
        self.sock = sock or _Socket()
        self.conn = Connection(server)
        self.conn.connection_made(self.sock)
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True,
                                                                       header_encoding="utf-8"))
        self.h2.initiate_connection()
        self.events: list = []
        self.pump()

    def open(self, path: str = ECHO, headers=()) -> int:
        sid = self.h2.get_next_available_stream_id()
        self.h2.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":path", path),
                                   (":authority", "x"), ("content-type", "application/grpc"),
                                   *headers])
        return sid

    async def send(self, sid: int, body: bytes) -> None:
        """`body`, as the windows let it go, then the end of the stream."""
        view = memoryview(body)
        while view:
            room = min(self.h2.local_flow_control_window(sid), self.h2.max_outbound_frame_size,
                       len(view))
            if not room:
                await self.settle()
                continue
            self.h2.send_data(sid, view[:room].tobytes())
            view = view[room:]
            self.pump()
        self.h2.end_stream(sid)
        self.pump()

    def ended(self) -> list:
        """The streams whose answers ended, in order."""
        return [e.stream_id for e in self.events if isinstance(e, h2.events.StreamEnded)]

    def pump(self) -> None:
        """Client to server, then what the server wrote back to the client."""
        data = self.h2.data_to_send()
        if data:
            self.conn.data_received(data)
        self.conn.flush()
        if self.sock.out:
            data, self.sock.out[:] = bytes(self.sock.out), b""
            self.events += self.h2.receive_data(data)

    async def settle(self) -> None:
        for _ in range(5):
            await asyncio.sleep(0)
            self.pump()

    def status(self, sid: int) -> str | None:
        for event in self.events:
            if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)) \
                    and event.stream_id == sid:
                headers = dict(event.headers)
                if "grpc-status" in headers:
                    return headers["grpc-status"]
        return None


async def _stay(request, call):
    await asyncio.Event().wait()
