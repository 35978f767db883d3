"""A gRPC connection's life (shmserve/grpc/connection.py), in process over a fake socket: a
client that never speaks or stops inside its preface is closed, keepalive PINGs (only when
permitted; one left unanswered closes the connection), GOAWAY for an old connection, an idle one
and those beyond the limit, a client that does not read is not read from, and what is read is
parsed a slice and a share of each turn of the event loop at a time.
"""

import asyncio

import h2.config
import h2.connection
import h2.events

from shmserve.grpc import connection, transport
from shmserve.grpc.connection import Connection
from shmserve.grpc.transport import GrpcServer, Method
from tests.unit.grpc.grpc_transport_helpers import ECHO, _Client, _echo, _Socket, _stay


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
