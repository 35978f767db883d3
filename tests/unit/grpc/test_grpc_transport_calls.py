"""gRPC calls (shmserve/grpc/transport.py and its calls) in process, over a fake socket
between an h2 client and the server's connection object: header encodings (grpc-timeout, the
percent-encoded grpc-message, a long status message cut), generated calls of any framing,
headers and junk after them, each of which ends with a gRPC status, responses compressed at the
level asked for, and compressed messages that do not inflate.
"""

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

from shmserve.grpc import call_answers, transport
from shmserve.grpc.call import timeout_seconds
from shmserve.grpc.call_answers import _percent_encode
from shmserve.grpc.connection import Connection
from shmserve.grpc.transport import GrpcServer, Method
from tests.unit.grpc.grpc_transport_helpers import (ECHO, STREAM, _compressed, _echo,
                                                    _echo_stream, _Socket)


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
