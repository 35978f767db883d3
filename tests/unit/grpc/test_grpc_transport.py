"""The gRPC layer (shmserve/grpc/transport.py, its connections and calls): header encodings,
and generated calls."""

import asyncio
import os
import time
import urllib.parse
import zlib

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmserve.fastpath.prepared_answers import WRITTEN_BY_WORKER
from shmserve.grpc import call_answers, connection, inbound, transport
from shmserve.grpc.call import timeout_seconds
from shmserve.grpc.call_answers import _percent_encode
from shmserve.grpc.connection import Connection
from shmserve.grpc.transport import GrpcServer, Method
from tests.unit.bounds import peak_allocation


@pytest.mark.parametrize("value, seconds", [
    (b"1H", 3600.0), (b"2M", 120.0), (b"3S", 3.0), (b"200m", 0.2), (b"7u", 7e-6),
    (b"99999999n", 0.099999999),
])
def test_grpc_timeout_units(value, seconds):
    assert timeout_seconds(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", [b"", b"m", b"S1", b"123456789S", b"1x", b"-1S", b"1.5S"])
def test_malformed_grpc_timeouts_are_refused(value):
    assert timeout_seconds(value) is None


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


def _exchange(streams: list, junk: bytes = b"", max_message_size: int = 1 << 16,
              ended: list | None = None, **options) -> tuple:
    """Sends `streams` ([(path, headers, body)]) on one connection, then `junk`; returns
    ({stream id: response headers and trailers, and "data": the DATA it got}, whether the
    server closed). `ended`: gets the stream ids in the order their answers ended;
    `options`: the GrpcServer's."""
    async def main():
        server = GrpcServer({ECHO: Method(_echo, None, bytes, False),
                             STREAM: Method(_echo_stream, None, bytes, True)},
                            max_message_size, **options)
        sock = _Socket()
        conn = Connection(server)
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
                    elif isinstance(event, h2.events.StreamEnded) and ended is not None:
                        ended.append(event.stream_id)
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
            Connection(server).connection_made(sock)
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
        conn = Connection(server)
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
        conn = Connection(server)
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


# -- what one client may hold (perf/hostile.py runs the same against the real server) ----------

def _gzip(data_size: int) -> bytes:
    packer = zlib.compressobj(wbits=31)
    chunk = b"\0" * (1 << 20)
    return b"".join(packer.compress(chunk) for _ in range(data_size >> 20)) + packer.flush()


def _compressed(message: bytes) -> bytes:
    return b"\1" + len(message).to_bytes(4, "big") + message


@pytest.mark.parametrize("body, fragment", [
    (_compressed(b"not gzip"), "cannot decompress"),
    (_compressed(zlib.compress(b"x" * 100, wbits=31)[:-10]), "truncated"),
])
def test_a_message_that_does_not_inflate_is_the_clients_mistake(body, fragment):
    answers, _ = _exchange([(ECHO, [("grpc-encoding", "gzip")], body)])
    (answer,) = answers.values()
    assert answer["grpc-status"] == str(transport.INVALID_ARGUMENT)
    assert fragment in urllib.parse.unquote(answer["grpc-message"])


def test_a_long_status_message_is_cut():
    encoded = _percent_encode("Request for unknown model: '" + "m" * 4_000_000 + "'")
    assert len(encoded) == call_answers.MAX_STATUS_MESSAGE_BYTES + 3 and encoded.endswith(b"...")
    encoded = _percent_encode("✓" * 5000)  # cut between characters, then encoded
    assert urllib.parse.unquote(encoded.decode()) == "✓" * 341 + "..."


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


def _bomb_exchange(bomb: bytes, limits: transport.ConnectionLimits) -> tuple:
    """(status, message) of an echo call sent `bomb`, gzip-compressed."""
    async def main():
        server = GrpcServer({ECHO: Method(_echo, None, bytes, False)}, 1 << 30, limits=limits)
        client = _Client(server)
        sid = client.open(ECHO, [("grpc-encoding", "gzip")])
        await client.send(sid, _compressed(bomb))
        await client.settle()
        message = next((dict(e.headers).get("grpc-message", "") for e in client.events
                        if isinstance(e, h2.events.TrailersReceived)
                        or isinstance(e, h2.events.ResponseReceived)
                        and "grpc-status" in dict(e.headers)), "")
        client.conn.connection_lost(None)
        return client.status(sid), urllib.parse.unquote(message)
    return asyncio.run(main())


def test_a_decompression_bomb_is_refused_past_the_limit_without_being_inflated_whole():
    bomb = _gzip(64 << 20)  # 64 MiB of zeros in 64 KiB
    limits = transport.ConnectionLimits(max_decompressed_size=1 << 20)
    status, message = _bomb_exchange(bomb, limits)
    assert status == str(transport.RESOURCE_EXHAUSTED)
    assert "--grpc-max-decompressed-size" in message
    # Inflated a slice at a time, and no further than the limit (and a slice): a few MiB
    # of the 64.
    assert peak_allocation(_bomb_exchange, bomb, limits) < 8 << 20


async def _length(request, call):
    return b"%d" % len(request)


def test_a_message_is_inflated_in_slices_while_other_calls_are_served():
    async def main():
        server = GrpcServer({ECHO: Method(_length, None, bytes, False)}, 1 << 30)
        client = _Client(server)
        big = client.open(ECHO, [("grpc-encoding", "gzip")])
        await client.send(big, _compressed(_gzip(16 << 20)))
        small = client.open(ECHO)
        await client.send(small, b"\0\0\0\0\2hi")
        for _ in range(10):
            await client.settle()
        assert [client.status(big), client.status(small)] == ["0", "0"]
        assert client.ended() == [small, big]  # the small call, sent after, was answered first
        answers = {e.stream_id: e.data[5:] for e in client.events
                   if isinstance(e, h2.events.DataReceived)}
        assert answers == {big: b"%d" % (16 << 20), small: b"2"}
        client.conn.connection_lost(None)
    asyncio.run(main())


def test_unfinished_messages_wait_their_turn_for_the_connections_room(monkeypatch):
    """8 calls each announcing a message of 2 GiB: one is given a window as large as it can
    take, the others wait at STREAM_WINDOW; when it ends, the next one's turn comes."""
    monkeypatch.setattr(inbound, "MESSAGE_WINDOW", 1 << 20)

    async def main():
        server = GrpcServer({ECHO: Method(_stay, None, bytes, False)}, 2**31 - 1)
        client = _Client(server)
        sids = [client.open() for _ in range(8)]
        for sid in sids:
            client.h2.send_data(sid, b"\0" + (2**31 - 1).to_bytes(4, "big"))
        client.pump()
        for _ in range(60):  # as much as the windows let the client send
            for sid in sids:
                room = min(client.h2.local_flow_control_window(sid), 16384)
                if room:
                    client.h2.send_data(sid, b"\7" * room)
            client.pump()
        calls = client.conn.calls
        buffered = {sid: calls[sid].incoming.received() if calls[sid].incoming
                    else len(calls[sid].buffer) for sid in sids}
        assert buffered[1] > 8 * 65535  # the first one keeps going...
        assert all(buffered[sid] == inbound.STREAM_WINDOW for sid in sids[1:])  # ...alone
        assert client.conn.inbound.reserved == 5 + 2**31 - 1
        client.h2.reset_stream(1)  # the client gives up on it: the next one's turn
        client.pump()
        await client.settle()
        assert client.h2.local_flow_control_window(3) > 65535
        assert client.conn.inbound.reserved == 5 + 2**31 - 1 and calls[3].reserved
        client.conn.connection_lost(None)
    asyncio.run(main())


def test_garbage_announced_as_a_long_message_is_refused_before_its_end():
    async def main():
        from shmserve.grpc import codec
        server = GrpcServer({ECHO: Method(_stay, None, bytes, False,
                                          codec.check_partial_request)}, 2**31 - 1)
        client = _Client(server)
        sid = client.open()
        client.h2.send_data(sid, b"\0" + (1 << 30).to_bytes(4, "big"))
        sent = 0
        while client.status(sid) is None and sent < (1 << 21):
            room = min(client.h2.local_flow_control_window(sid), 16384)
            client.h2.send_data(sid, b"\0" * room)
            sent += room
            client.pump()
        assert client.status(sid) == str(transport.INVALID_ARGUMENT)
        assert sent <= inbound.STREAM_WINDOW  # its window never grew
        assert client.conn.inbound.reserved == 0
        client.conn.connection_lost(None)
    asyncio.run(main())


def test_streaming_calls_per_connection_are_bounded():
    async def main():
        limits = transport.ConnectionLimits(max_streaming_calls=2)
        server = GrpcServer({STREAM: Method(_echo_stream, None, bytes, True)}, 1 << 16,
                            limits=limits)
        first, other = _Client(server), _Client(server)
        sids = [first.open(STREAM) for _ in range(3)]
        first.pump()
        await first.settle()
        assert [first.status(sid) for sid in sids] == [None, None, str(transport.UNAVAILABLE)]
        assert "--max-open-streams-per-connection" in str(first.events)
        other_sid = other.open(STREAM)  # another client's calls are its own
        other.pump()
        await other.settle()
        assert other.status(other_sid) is None
        first.h2.end_stream(sids[0])  # one ends: room for one more
        await first.settle()
        again = first.open(STREAM)
        await first.settle()
        assert first.status(sids[0]) == "0" and first.status(again) is None
        for client in (first, other):
            client.conn.connection_lost(None)
    asyncio.run(main())


def test_connections_beyond_the_limit_are_sent_goaway():
    async def main():
        server = GrpcServer({ECHO: Method(_echo, None, bytes, False)}, 1 << 16,
                            limits=transport.ConnectionLimits(max_connections=1))
        kept, refused = _Client(server), _Client(server)
        assert not kept.sock.closed and refused.sock.closed
        (goaway,) = [e for e in refused.events if isinstance(e, h2.events.ConnectionTerminated)]
        assert b"--grpc-max-connections" in goaway.additional_data
        kept.conn.connection_lost(None)
        assert _Client(server).conn in server.connections  # room again
    asyncio.run(main())


def test_a_connection_without_calls_is_sent_goaway_after_the_idle_time():
    async def main():
        server = GrpcServer({ECHO: Method(_stay, None, bytes, False)}, 1 << 16,
                            limits=transport.ConnectionLimits(max_connection_idle=0.05))
        idle, busy = _Client(server), _Client(server)
        busy.open()
        busy.pump()
        await asyncio.sleep(0.15)
        idle.pump()
        (goaway,) = [e for e in idle.events if isinstance(e, h2.events.ConnectionTerminated)]
        assert (goaway.error_code, goaway.additional_data) == (0, b"max_idle")
        assert idle.sock.closed and not busy.sock.closed
        busy.conn.connection_lost(None)
    asyncio.run(main())


def test_a_connection_that_stops_inside_its_preface_is_closed():
    async def main():
        server = GrpcServer({ECHO: Method(_echo, None, bytes, False)}, 1 << 16,
                            handshake_timeout=0.05)
        sock = _Socket()
        conn = Connection(server)
        conn.connection_made(sock)
        conn.data_received(b"P")  # one byte: not a handshake
        await asyncio.sleep(0.15)
        assert sock.closed
    asyncio.run(main())


def test_a_client_that_does_not_read_is_not_read_from():
    async def main():
        server = GrpcServer({ECHO: Method(_echo, None, bytes, False)}, 1 << 16)
        client = _Client(server)
        client.conn.pause_writing()
        assert not client.sock.reading
        client.conn.resume_writing()
        assert client.sock.reading
        client.conn.connection_lost(None)
    asyncio.run(main())


def test_what_takes_more_than_a_parse_slice_is_parsed_in_later_turns(monkeypatch):
    from shmserve.grpc import http2
    monkeypatch.setattr(http2, "PARSE_SLICE_S", -1.0)

    async def main():
        server = GrpcServer({ECHO: Method(_echo, None, bytes, False)}, 1 << 16,
                            limits=transport.ConnectionLimits(max_ping_strikes=0))
        client = _Client(server)
        for i in range(100):
            client.h2.ping(b"%08d" % i)
        client.conn.data_received(client.h2.data_to_send())
        assert not client.sock.reading  # the rest waits for the next turns
        for _ in range(5):
            await asyncio.sleep(0)
        client.pump()
        acks = [e for e in client.events if isinstance(e, h2.events.PingAckReceived)]
        assert len(acks) == 100 and client.sock.reading
        client.conn.connection_lost(None)
    asyncio.run(main())


def test_a_connection_is_read_a_share_of_each_turn_of_the_loop():
    async def main():
        server = GrpcServer({ECHO: Method(_echo, None, bytes, False)}, 1 << 16,
                            limits=transport.ConnectionLimits(max_ping_strikes=0))
        client = _Client(server)
        for i in range(connection.READ_PER_TURN // 17 + 1):  # PING frames are 17 bytes
            client.h2.ping(b"%08d" % i)
        client.conn.data_received(client.h2.data_to_send())
        assert not client.sock.reading  # more is read in a later turn, after the others
        for _ in range(100):  # once what was read is parsed (in 5 ms slices)
            await asyncio.sleep(0)
            if client.sock.reading:
                break
        assert client.sock.reading
        assert not client.conn._reading_paused
        client.conn.connection_lost(None)
    asyncio.run(main())


def test_a_large_message_goes_into_a_mapping_that_is_unmapped_once_done(monkeypatch):
    monkeypatch.setattr(inbound, "LARGE_MESSAGE", 1 << 20)
    mappings = []
    release = inbound.release_mapping
    monkeypatch.setattr(inbound, "release_mapping", lambda m: (mappings.append(m), release(m)))

    async def main():
        server = GrpcServer({ECHO: Method(_length, None, bytes, False)}, 1 << 30)
        client = _Client(server)
        sid = client.open(ECHO)
        await client.send(sid, b"\0" + (3 << 20).to_bytes(4, "big") + b"\7" * (3 << 20))
        await client.settle()
        assert client.status(sid) == "0"
        assert [e.data[5:] for e in client.events if isinstance(e, h2.events.DataReceived)] \
            == [b"%d" % (3 << 20)]
        client.conn.connection_lost(None)
    asyncio.run(main())
    assert len(mappings) == 1
    for _ in range(50):  # the releasing thread closes it once no view is left
        if mappings[0].closed:
            break
        time.sleep(0.05)
    assert mappings[0].closed
