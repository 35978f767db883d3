"""What one gRPC client may hold (perf/hostile.py runs the same cases against the real
server): a decompression bomb is refused past the limit without being inflated whole, a large
message is inflated in slices while other calls are served and goes into a mapping that is
unmapped once done, unfinished messages wait their turn for the connection's room, garbage
announced as a long message is refused before its end, and streaming calls per connection are
bounded.
"""

import asyncio
import time
import urllib.parse
import zlib

import h2.events

from shmserve.grpc import inbound, transport
from shmserve.grpc.transport import GrpcServer, Method
from tests.unit.bounds import peak_allocation
from tests.unit.grpc.grpc_transport_helpers import (ECHO, STREAM, _Client, _compressed, _echo,
                                                    _echo_stream, _stay)


# -- what one client may hold (perf/hostile.py runs the same against the real server) ----------

def _gzip(data_size: int) -> bytes:
    packer = zlib.compressobj(wbits=31)
    chunk = b"\0" * (1 << 20)
    return b"".join(packer.compress(chunk) for _ in range(data_size >> 20)) + packer.flush()


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
