"""The gRPC layer (shmserve/grpc/transport.py): header encodings, and generated calls."""

import asyncio
import os
import urllib.parse
import zlib

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmserve.grpc import transport
from shmserve.grpc.transport import GrpcServer, Method, _percent_encode, _timeout_seconds


@pytest.mark.parametrize("value, seconds", [
    (b"1H", 3600.0), (b"2M", 120.0), (b"3S", 3.0), (b"200m", 0.2), (b"7u", 7e-6),
    (b"99999999n", 0.099999999),
])
def test_grpc_timeout_units(value, seconds):
    assert _timeout_seconds(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", [b"", b"m", b"S1", b"123456789S", b"1x", b"-1S", b"1.5S"])
def test_malformed_grpc_timeouts_are_refused(value):
    assert _timeout_seconds(value) is None


@pytest.mark.parametrize("message", ["plain ascii", "100% sure", "modèle ✓", "tab\there\n"])
def test_grpc_message_is_percent_encoded_printable_ascii(message):
    encoded = _percent_encode(message)
    assert all(0x20 <= b <= 0x7E for b in encoded)
    assert urllib.parse.unquote(encoded.decode("ascii")) == message


def test_printable_ascii_passes_unchanged():
    assert _percent_encode("failed: 'x' is not found") == b"failed: 'x' is not found"


# The layer fed generated calls, in process: a fake socket between an h2 client and the
# server's connection object, with an echo method behind it.

ECHO = "/test.Echo/Unary"
STREAM = "/test.Echo/Stream"


class _Socket(asyncio.Transport):
    def __init__(self):
        super().__init__()
        self.out = bytearray()
        self.closed = False

    def write(self, data) -> None:
        self.out += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


async def _echo(request, call):
    return bytes(request)


async def _echo_stream(requests, call):
    async for request in requests:
        yield bytes(request)


def _exchange(streams: list, junk: bytes = b"", response_compression: str = "none") -> tuple:
    """Sends `streams` ([(path, headers, body)]) on one connection, then `junk`; returns
    ({stream id: response headers and trailers, and "data": the DATA it got}, whether the
    server closed)."""
    async def main():
        server = GrpcServer({ECHO: Method(_echo, None, bytes, False),
                             STREAM: Method(_echo_stream, None, bytes, True)}, 1 << 16,
                            response_compression=response_compression)
        sock = _Socket()
        conn = transport._Connection(server)
        conn.connection_made(sock)
        client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True,
                                                                      header_encoding="utf-8"))
        client.initiate_connection()
        ids = []
        for path, headers, body in streams:
            sid = client.get_next_available_stream_id()
            ids.append(sid)
            client.send_headers(sid, [(":method", "POST"), (":scheme", "http"),
                                      (":path", path), (":authority", "x"),
                                      ("content-type", "application/grpc"), *headers])
            client.send_data(sid, body, end_stream=True)
        conn.data_received(client.data_to_send() + junk)
        answers = {sid: {"data": b""} for sid in ids}
        for _ in range(50):  # the handlers run; what they write is read by the client
            await asyncio.sleep(0)
            conn.flush()
            if sock.out:
                data, sock.out[:] = bytes(sock.out), b""
                try:
                    events = client.receive_data(data)
                except h2.exceptions.ProtocolError:
                    break  # the junk made the server close the connection: checked below
                for event in events:
                    if isinstance(event, (h2.events.ResponseReceived,
                                          h2.events.TrailersReceived)):
                        answers[event.stream_id].update(event.headers)
                    elif isinstance(event, h2.events.DataReceived):
                        answers[event.stream_id]["data"] += event.data
            if sock.closed:
                break
        conn.connection_lost(None)
        return answers, sock.closed
    return asyncio.run(main())


def _frames(parts) -> bytes:
    return b"".join(bytes([flag]) + length.to_bytes(4, "big") + payload
                    for flag, length, payload in parts)


FRAMES = st.lists(st.tuples(st.sampled_from([0, 1, 2, 255]),
                            st.one_of(st.integers(0, 64), st.integers(0, 2**32 - 1)),
                            st.binary(max_size=64)), max_size=3).map(_frames)
HEADERS = st.lists(st.sampled_from([
    ("grpc-encoding", "gzip"), ("grpc-encoding", "deflate"), ("grpc-encoding", "identity"),
    ("grpc-encoding", "zstd"), ("grpc-timeout", "1S"), ("grpc-timeout", "x"),
    ("grpc-timeout", "99999999n"), ("te", "trailers"), ("x-meta", "1")]), max_size=3)


# perf/fuzz_decoders.py runs these with many more examples.
TRANSPORT_FUZZ = settings(max_examples=int(os.environ.get("SHMSERVE_FUZZ_EXAMPLES", 300)),
                          deadline=None, database=None)


@TRANSPORT_FUZZ
@given(st.lists(st.tuples(st.sampled_from([ECHO, STREAM, "/no/Such"]), HEADERS, FRAMES),
                min_size=1, max_size=4))
def test_every_generated_call_ends_with_a_status(streams):
    answers, closed = _exchange(streams)
    assert not closed
    for (path, headers, body), answer in zip(streams, answers.values()):
        assert "grpc-status" in answer, (path, headers, body, answer)
        status = int(answer["grpc-status"])
        assert 0 <= status <= 16 and status != transport.UNKNOWN  # UNKNOWN: a handler broke
        if status == 0:
            assert path != "/no/Such"


def test_a_well_formed_call_is_echoed():
    body = b"\0\0\0\0\5hello"
    answers, closed = _exchange([(ECHO, [], body), (STREAM, [], body * 3)])
    assert [a["grpc-status"] for a in answers.values()] == ["0", "0"]


@pytest.mark.parametrize("level, accepted, chosen", [
    # As gRPC servers choose, from the client's grpc-accept-encoding: gzip then deflate.
    ("low", "identity,deflate,gzip", "gzip"), ("medium", "identity,deflate,gzip", "deflate"),
    ("high", "identity,deflate,gzip", "deflate"), ("high", "gzip", "gzip"),
    ("low", "deflate", "deflate"), ("high", "identity", None), ("high", None, None),
    ("none", "identity,deflate,gzip", None)])
def test_responses_are_compressed_at_the_level_asked_for(level, accepted, chosen):
    message = b"compress me " * 50
    body = b"\0" + len(message).to_bytes(4, "big") + message
    headers = [] if accepted is None else [("grpc-accept-encoding", accepted)]
    answers, _ = _exchange([(ECHO, headers, body)], response_compression=level)
    (answer,) = answers.values()
    assert answer["grpc-status"] == "0"
    assert answer.get("grpc-encoding") == chosen
    data = answer["data"]
    assert int.from_bytes(data[1:5], "big") == len(data) - 5
    if chosen is None:
        assert data == body
    else:
        assert data[0] == 1 and len(data) < len(body)
        wbits = 31 if chosen == "gzip" else 15
        assert zlib.decompress(data[5:], wbits) == message


def test_a_message_that_compression_would_grow_goes_as_it_is():
    body = b"\0\0\0\0\3abc"
    answers, _ = _exchange([(ECHO, [("grpc-accept-encoding", "gzip")], body)],
                           response_compression="low")
    (answer,) = answers.values()
    assert answer["grpc-encoding"] == "gzip" and answer["data"] == body  # flag 0: as it is


@TRANSPORT_FUZZ
@given(st.binary(min_size=1, max_size=300))
def test_junk_after_a_call_never_escapes_the_connection(junk):
    """Whatever follows, data_received returns: the connection goes on or is closed."""
    _exchange([(ECHO, [], b"\0\0\0\0\1x")], junk)


def test_a_connection_that_never_speaks_is_closed():
    async def main():
        server = GrpcServer({ECHO: Method(_echo, None, bytes, False)}, 1 << 16,
                            handshake_timeout=0.05)
        quiet, talking = _Socket(), _Socket()
        for sock in (quiet, talking):
            transport._Connection(server).connection_made(sock)
        conn = next(c for c in server.connections if c.transport is talking)
        client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        client.initiate_connection()
        conn.data_received(client.data_to_send())
        await asyncio.sleep(0.2)
        return quiet.closed, talking.closed
    assert asyncio.run(main()) == (True, False)


# -- keepalive ---------------------------------------------------------------------------------

def _keepalive(without_calls: bool, answer: bool) -> tuple:
    """(PINGs the client saw, whether the server closed) after a while on a connection with
    no call, keepalive every 20 ms with a 60 ms timeout."""
    async def main():
        server = GrpcServer({ECHO: Method(_echo, None, bytes, False)}, 1 << 16,
                            keepalive_time=0.02, keepalive_timeout=0.06,
                            keepalive_without_calls=without_calls)
        sock = _Socket()
        conn = transport._Connection(server)
        conn.connection_made(sock)
        client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        client.initiate_connection()
        conn.data_received(client.data_to_send())
        pings = 0
        for _ in range(30):
            await asyncio.sleep(0.01)
            if sock.out:
                data, sock.out[:] = bytes(sock.out), b""
                for event in client.receive_data(data):
                    if isinstance(event, h2.events.PingReceived):
                        pings += 1
                if answer:  # h2 acknowledges a PING by itself
                    conn.data_received(client.data_to_send())
            if sock.closed:
                break
        closed = sock.closed
        conn.connection_lost(None)
        return pings, closed
    return asyncio.run(main())


def test_keepalive_pings_an_idle_connection_only_when_permitted():
    assert _keepalive(without_calls=False, answer=True) == (0, False)
    pings, closed = _keepalive(without_calls=True, answer=True)
    assert pings >= 3 and not closed  # answered: the PINGs go on


def test_a_keepalive_ping_left_unanswered_closes_the_connection():
    pings, closed = _keepalive(without_calls=True, answer=False)
    assert pings == 1 and closed


def test_an_old_connection_is_sent_goaway_and_closed_once_its_calls_end():
    async def main():
        gate = asyncio.Event()

        async def held(request, call):
            await gate.wait()
            return bytes(request)

        server = GrpcServer({ECHO: Method(held, None, bytes, False)}, 1 << 16,
                            max_connection_age=0.05)
        sock = _Socket()
        conn = transport._Connection(server)
        conn.connection_made(sock)
        client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        client.initiate_connection()
        sid = client.get_next_available_stream_id()
        client.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":path", ECHO),
                                  (":authority", "x"), ("content-type", "application/grpc")])
        client.send_data(sid, b"\0\0\0\0\2hi", end_stream=True)
        conn.data_received(client.data_to_send())
        await asyncio.sleep(0.1)  # past the age, the call still open
        events = client.receive_data(bytes(sock.out))
        sock.out.clear()
        assert any(isinstance(e, h2.events.ConnectionTerminated) for e in events)
        assert not sock.closed
        gate.set()  # the call ends: answered, then the connection closes
        for _ in range(20):
            await asyncio.sleep(0)
            conn.flush()
        # h2 reads nothing after a GOAWAY: the frames are read by hand.
        frames, out = [], bytes(sock.out)
        while len(out) >= 9:
            length = int.from_bytes(out[:3], "big")
            frames.append((out[3], out[4], int.from_bytes(out[5:9], "big") & 0x7FFFFFFF))
            out = out[9 + length:]
        assert (1, 0x5, sid) in frames  # the trailers: HEADERS, END_STREAM | END_HEADERS
        assert sock.closed
        conn.connection_lost(None)
    asyncio.run(main())


# -- answers a model's worker writes (lend_answer; see shmserve/grpc/prepared_answers.py) -------

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
        lent = call.conn.lend_answer(call, holder, len(message))
        loans.append(lent is not None)
        if lent is None:
            return message
        fd, before, after = lent
        if how != b"unwritten":
            os.write(fd, before + message + after)
        await release.wait()
        call.conn.answer_returned(call, None if how == b"unwritten" else b"")
        return message if how == b"unwritten" else transport.SENT
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
        conn = transport._Connection(server)
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
