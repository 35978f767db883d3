"""Answers a model's worker writes itself on a gRPC connection (the fast path; see
shmserve/fastpath/connection_loans.py), on a real socket pair: a lent connection holds its own
frames until the answers are back, it is lent to one worker at a time, and an answer the worker
did not write is answered by this side.
"""

import asyncio
import os

import h2.config
import h2.connection
import h2.events

from shmserve.fastpath.prepared_answers import WRITTEN_BY_WORKER
from shmserve.grpc.connection import Connection
from shmserve.grpc.transport import GrpcServer, Method
from tests.unit.grpc.grpc_transport_helpers import ECHO


# -- answers a model's worker writes (the fast path; see shmserve/fastpath/connection_loans.py) --

class _LendableSocket(asyncio.Transport):
    """A transport on a real socket, whose descriptor a 'worker' (the handler below) writes
    to as well: the client reads both in the order they were written."""

    def __init__(self, sock):
        super().__init__()
        self.sock = sock
        self.closed = False

    def get_extra_info(self, name, default=None):
        return {"socket": self.sock, "sslcontext": None}.get(name, default)

    def get_write_buffer_size(self) -> int:
        return 0

    def write(self, data) -> None:
        self.sock.sendall(data)

    def writelines(self, chunks) -> None:
        self.write(b"".join(bytes(c) for c in chunks))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def _lending_call(release: asyncio.Event, loans: list):
    """A unary method whose request is `holder|how`: it lends its answer (an echo) to
    `holder`, writes it there as a worker would unless `how` is `unwritten`, and returns it
    once `release` is set."""
    async def handler(request, call):
        message = bytes(request)
        holder, how = message.split(b"|")
        lent = call.conn.loans.lend(holder, call, len(message))
        loans.append(lent is not None)
        if lent is None:
            return message
        fd, before, after = lent
        if how != b"unwritten":
            os.write(fd, before + message + after)
        await release.wait()
        call.conn.loans.returned(call, None if how == b"unwritten" else b"")
        return message if how == b"unwritten" else WRITTEN_BY_WORKER
    return Method(handler, None, bytes, False)


def _lending(steps) -> tuple:
    """Runs `steps(send, settle, release)` on a connection lent as the calls ask; returns
    what the client saw, in order: ("answer", sid, data, status) per call and ("ping_ack",);
    and each lend's outcome."""
    import socket as socketlib

    async def main():
        release = asyncio.Event()
        loans = []
        server = GrpcServer({ECHO: _lending_call(release, loans)}, 1 << 16)
        ours, theirs = socketlib.socketpair()
        theirs.setblocking(False)
        conn = Connection(server)
        conn.connection_made(_LendableSocket(ours))
        client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True,
                                                                      header_encoding="utf-8"))
        client.initiate_connection()
        seen = []
        data = {}

        async def settle():
            for _ in range(20):
                await asyncio.sleep(0)
            conn.flush()
            try:
                received = theirs.recv(1 << 20)
            except BlockingIOError:
                received = b""
            for event in client.receive_data(received):
                if isinstance(event, h2.events.DataReceived):
                    data[event.stream_id] = data.get(event.stream_id, b"") + event.data
                elif isinstance(event, h2.events.TrailersReceived):
                    seen.append(("answer", event.stream_id, data.pop(event.stream_id, b""),
                                 dict(event.headers)["grpc-status"]))
                elif isinstance(event, h2.events.PingAckReceived):
                    seen.append(("ping_ack",))
            conn.data_received(client.data_to_send())

        def send(body: bytes = b"", ping: bool = False):
            if ping:
                client.ping(b"12345678")
            else:
                sid = client.get_next_available_stream_id()
                client.send_headers(sid, [(":method", "POST"), (":scheme", "http"),
                                          (":path", ECHO), (":authority", "x"),
                                          ("content-type", "application/grpc")])
                client.send_data(sid, b"\0" + len(body).to_bytes(4, "big") + body,
                                 end_stream=True)
            conn.data_received(client.data_to_send())

        conn.data_received(client.data_to_send())
        await settle()
        send(b"w|first")  # the first answer restates the table size: never lent
        await settle()
        await steps(send, settle, release)
        conn.connection_lost(None)
        ours.close()
        theirs.close()
        return seen, loans
    return asyncio.run(main())


def _grpc_message(body: bytes) -> bytes:
    return b"\0" + len(body).to_bytes(4, "big") + body


def test_a_lent_connection_holds_its_own_frames_until_the_answers_are_back():
    async def steps(send, settle, release):
        send(b"w|hold")
        await settle()
        send(ping=True)  # its ACK waits: the worker may be writing
        send(b"w|hold")  # frames wait, so no loan: this side answers it after the loans
        await settle()
        release.set()
        await settle()
    seen, loans = _lending(steps)
    assert loans == [False, True, False]
    assert seen == [("answer", 1, _grpc_message(b"w|first"), "0"),
                    ("answer", 3, _grpc_message(b"w|hold"), "0"),
                    ("ping_ack",),
                    ("answer", 5, _grpc_message(b"w|hold"), "0")]


def test_a_connection_is_lent_to_one_worker_at_a_time():
    async def steps(send, settle, release):
        send(b"w|hold")
        await settle()
        send(b"w|hold")  # the same worker: its batches write in turn
        send(b"v|hold")  # another one could write at the same time: not lent
        await settle()
        release.set()
        await settle()
    seen, loans = _lending(steps)
    assert loans == [False, True, True, False]
    assert sorted(seen)[1:] == [("answer", sid, _grpc_message(b), "0")
                                for sid, b in ((3, b"w|hold"), (5, b"w|hold"), (7, b"v|hold"))]


def test_an_answer_the_worker_did_not_write_is_answered_here():
    async def steps(send, settle, release):
        send(b"w|unwritten")
        await settle()
        release.set()
        await settle()
        send(b"w|now")
        await settle()
    seen, loans = _lending(steps)
    assert loans == [False, True, True]
    assert seen[1:] == [("answer", 3, _grpc_message(b"w|unwritten"), "0"),
                        ("answer", 5, _grpc_message(b"w|now"), "0")]
