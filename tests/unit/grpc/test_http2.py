"""The server side of HTTP/2 (shmserve/grpc/http2.py and the modules beside it), against the
h2 library as the client and against hand-made frames that break the protocol."""

import contextlib
import os
import struct

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shmserve.grpc import hpack_blocks, http2, http2_frames, http2_rate_limits
from tests.unit.bounds import peak_allocation, run_bounded

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
REQUEST = [(":method", "POST"), (":scheme", "http"), (":path", "/pkg.Svc/M"),
           (":authority", "localhost"), ("content-type", "application/grpc"), ("te", "trailers")]
# All in HPACK's static table: blocks that differ only in the dynamic entries they name then
# have the same bytes, which is what could fool a decode cache.
STATIC_REQUEST = [(":method", "POST"), (":scheme", "http"), (":path", "/")]


def frame(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((ftype, flags)) + struct.pack(">I", sid) + payload


class Listener:
    def __init__(self):
        self.events = []

    def on_request(self, sid, headers):
        self.events.append(("request", sid, [(bytes(k), bytes(v)) for k, v in headers]))

    def on_data(self, sid, data, size):
        self.events.append(("data", sid, bytes(data), size))

    def on_end(self, sid):
        self.events.append(("end", sid))

    def on_reset(self, sid):
        self.events.append(("reset", sid))

    def on_window(self):
        self.events.append(("window",))

    def on_goaway(self):
        self.events.append(("goaway",))

    def on_ping_ack(self, payload):
        self.events.append(("ping_ack", payload))


def server(**overrides) -> tuple:
    options = dict(max_concurrent_streams=100, stream_window=1 << 20, connection_window=1 << 22,
                   max_frame_size=1 << 16, max_header_list_size=65536)
    options.update(overrides)
    listener = Listener()
    return http2.ServerConnection(listener, **options), listener


def frames_of(chunks: list) -> list:
    """(type, flags, stream id, payload) of each frame in what the server wrote."""
    data = b"".join(bytes(c) for c in chunks)
    out, pos = [], 0
    while pos < len(data):
        length = int.from_bytes(data[pos:pos + 3], "big")
        out.append((data[pos + 3], data[pos + 4],
                    int.from_bytes(data[pos + 5:pos + 9], "big"), data[pos + 9:pos + 9 + length]))
        pos += 9 + length
    return out


def h2_client() -> h2.connection.H2Connection:
    client = h2.connection.H2Connection(h2.config.H2Configuration(
        client_side=True, header_encoding=None, validate_outbound_headers=False))
    client.initiate_connection()
    return client


def pump(client, conn) -> list:
    """Client to server, then server to client; the client's events."""
    conn.receive(client.data_to_send())
    events = client.receive_data(b"".join(bytes(c) for c in conn.data_to_send()))
    conn.receive(client.data_to_send())  # the client's ACKs
    return events


def started(**overrides) -> tuple:
    conn, listener = server(**overrides)
    conn.receive(PREFACE + EMPTY_SETTINGS)
    conn.data_to_send()
    listener.events.clear()
    return conn, listener


# Conversations with a real client.

def test_a_call_round_trip_with_h2_as_the_client():
    conn, listener = server()
    client = h2_client()
    pump(client, conn)
    client.send_headers(1, REQUEST)
    client.send_data(1, b"\0\0\0\0\3abc", end_stream=True)
    pump(client, conn)
    assert listener.events[-3:] == [
        ("request", 1, [(k.encode(), v.encode()) for k, v in REQUEST]),
        ("data", 1, b"\0\0\0\0\3abc", 8), ("end", 1)]
    conn.send_headers(1, ((b":status", b"200"), (b"content-type", b"application/grpc")))
    conn.send_data(1, b"\0\0\0\0\2ok")
    conn.send_headers(1, ((b"grpc-status", b"0"),), end_stream=True)
    events = pump(client, conn)
    kinds = [type(e) for e in events]
    assert kinds == [h2.events.ResponseReceived, h2.events.DataReceived,
                     h2.events.TrailersReceived, h2.events.StreamEnded]
    assert events[0].headers == [(b":status", b"200"), (b"content-type", b"application/grpc")]
    assert events[1].data == b"\0\0\0\0\2ok"
    assert events[2].headers == [(b"grpc-status", b"0")]
    assert conn.streams == {}


def test_long_trailers_go_out_in_continuation_frames():
    conn, listener = server()
    client = h2_client()
    pump(client, conn)
    client.send_headers(1, REQUEST, end_stream=True)
    pump(client, conn)
    message = b"x" * 40000  # over the client's 16 KiB frames
    conn.send_headers(1, ((b":status", b"200"), (b"grpc-status", b"13"), (b"grpc-message", message)),
                      end_stream=True)
    chunks = conn.data_to_send()
    assert [f[0] for f in frames_of(chunks)] == [http2_frames.HEADERS, http2_frames.CONTINUATION, http2_frames.CONTINUATION]
    events = client.receive_data(b"".join(bytes(c) for c in chunks))
    assert events[0].headers[-1] == (b"grpc-message", message)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.sampled_from([("x-a", "1"), ("x-a", "2"), ("x-b", "v" * 300),
                                          ("grpc-timeout", "5S"), ("x-c", "3")]),
                         max_size=4, unique=True), min_size=1, max_size=12),
       st.sampled_from([256, 4096]))
@example([[("x-a", "1")], [("x-a", "1")], [("x-c", "3")], [("x-c", "3")]], 4096)
def test_headers_decode_as_sent_whatever_the_table_did(extra_headers, table_size):
    """Repeated blocks are answered from the cache; new ones, evictions and table resizes
    in between must never make a cached answer stale."""
    conn, listener = server()
    client = h2_client()
    pump(client, conn)
    client.update_settings({h2.settings.SettingCodes.HEADER_TABLE_SIZE: table_size})
    pump(client, conn)
    sent = []
    for i, extra in enumerate(extra_headers):
        sid = 2 * i + 1
        headers = STATIC_REQUEST + extra
        client.send_headers(sid, headers, end_stream=True)
        sent.append([(k.encode(), v.encode()) for k, v in headers])
        pump(client, conn)
    received = [e[2] for e in listener.events if e[0] == "request"]
    assert received == sent


def test_repeated_request_blocks_are_decoded_once():
    conn, listener = server()
    client = h2_client()
    pump(client, conn)
    for sid in (1, 3, 5):
        client.send_headers(sid, REQUEST, end_stream=True)
        pump(client, conn)
    assert len(conn._blocks._cache) == 1  # calls 2 and 3 sent the same all-indexed block
    requests = [e for e in listener.events if e[0] == "request"]
    assert requests[1][2] == requests[2][2] == requests[0][2]


def test_input_split_at_every_byte_gives_the_same_events():
    whole, whole_listener = server()
    split, split_listener = server()
    client = h2_client()
    client.send_headers(1, REQUEST)
    client.send_data(1, b"\0\0\0\0\1z", end_stream=True)
    data = client.data_to_send()
    whole.receive(data)
    for i in range(len(data)):
        split.receive(data[i:i + 1])
    assert split_listener.events == whole_listener.events
    assert ("end", 1) in whole_listener.events


# Frames by hand.

def test_ping_is_answered_with_its_payload():
    conn, _ = started()
    conn.receive(frame(http2_frames.PING, 0, 0, b"12345678"))
    assert frames_of(conn.data_to_send()) == [(http2_frames.PING, http2_frames.ACK, 0, b"12345678")]
    conn.receive(frame(http2_frames.PING, http2_frames.ACK, 0, b"12345678"))
    assert conn.data_to_send() == []


def test_padding_and_priority_are_stripped():
    conn, listener = started()
    block = hpack_blocks.encode_headers(((b":path", b"/a"),))
    conn.receive(frame(http2_frames.HEADERS, http2_frames.END_HEADERS | http2_frames.PADDED | http2_frames.PRIORITY_FLAG, 1,
                       b"\x03" + b"\0\0\0\0\x10" + block + b"pad"))
    conn.receive(frame(http2_frames.DATA, http2_frames.PADDED | http2_frames.END_STREAM, 1, b"\x02body!!"))
    assert listener.events == [("request", 1, [(b":path", b"/a")]),
                               ("data", 1, b"body", 7), ("end", 1)]


def test_a_header_block_may_continue_over_frames():
    conn, listener = started()
    block = hpack_blocks.encode_headers(((b":path", b"/long"), (b"x-k", b"v" * 100)))
    conn.receive(frame(http2_frames.HEADERS, http2_frames.END_STREAM, 1, block[:10])
                 + frame(http2_frames.CONTINUATION, 0, 1, block[10:50])
                 + frame(http2_frames.CONTINUATION, http2_frames.END_HEADERS, 1, block[50:]))
    assert listener.events == [("request", 1, [(b":path", b"/long"), (b"x-k", b"v" * 100)]),
                               ("end", 1)]


def test_streams_over_the_limit_are_refused():
    conn, listener = started(max_concurrent_streams=1)
    block = hpack_blocks.encode_headers(((b":path", b"/a"),))
    conn.receive(frame(http2_frames.HEADERS, http2_frames.END_HEADERS, 1, block)
                 + frame(http2_frames.HEADERS, http2_frames.END_HEADERS, 3, block))
    assert [e[:2] for e in listener.events] == [("request", 1)]
    assert frames_of(conn.data_to_send()) == [(http2_frames.RST_STREAM, 0, 3, b"\0\0\0\x07")]


def test_data_after_the_end_of_a_stream_resets_it():
    conn, listener = started()
    block = hpack_blocks.encode_headers(((b":path", b"/a"),))
    conn.receive(frame(http2_frames.HEADERS, http2_frames.END_HEADERS | http2_frames.END_STREAM, 1, block)
                 + frame(http2_frames.DATA, 0, 1, b"late"))
    assert listener.events[-1] == ("reset", 1)
    assert (http2_frames.RST_STREAM, 0, 1, b"\0\0\0\x05") in frames_of(conn.data_to_send())


def test_data_beyond_a_stream_window_resets_that_stream_only():
    conn, listener = started(stream_window=16)
    block = hpack_blocks.encode_headers(((b":path", b"/a"),))
    conn.receive(frame(http2_frames.HEADERS, http2_frames.END_HEADERS, 1, block)
                 + frame(http2_frames.DATA, 0, 1, b"x" * 17)
                 + frame(http2_frames.HEADERS, http2_frames.END_HEADERS, 3, block))
    assert [e[:2] for e in listener.events] == [("request", 1), ("reset", 1), ("request", 3)]
    assert (http2_frames.RST_STREAM, 0, 1, b"\0\0\0\x03") in frames_of(conn.data_to_send())


def test_late_frames_for_a_stream_this_side_reset_are_ignored_but_credited():
    conn, listener = started(connection_window=100)
    block = hpack_blocks.encode_headers(((b":path", b"/a"),))
    conn.receive(frame(http2_frames.HEADERS, http2_frames.END_HEADERS, 1, block))
    conn.reset_stream(1, http2_frames.NO_ERROR)
    conn.data_to_send()
    conn.receive(frame(http2_frames.DATA, 0, 1, b"x" * 60) + frame(http2_frames.WINDOW_UPDATE, 0, 1, b"\0\0\0\1")
                 + frame(http2_frames.RST_STREAM, 0, 1, b"\0\0\0\x08"))
    assert [e[0] for e in listener.events] == ["request"]
    # the 60 bytes came back to the connection's window: more than half of it was owed
    assert frames_of(conn.data_to_send()) == [(http2_frames.WINDOW_UPDATE, 0, 0, b"\0\0\0\x3c")]


def test_the_connection_window_comes_back_as_data_arrives_once_half_is_owed():
    conn, _ = started(stream_window=1000, connection_window=100)
    block = hpack_blocks.encode_headers(((b":path", b"/a"),))
    conn.receive(frame(http2_frames.HEADERS, http2_frames.END_HEADERS, 1, block) + frame(http2_frames.DATA, 0, 1, b"x" * 40))
    assert conn.data_to_send() == []
    conn.receive(frame(http2_frames.DATA, 0, 1, b"x" * 20))
    assert frames_of(conn.data_to_send()) == [(http2_frames.WINDOW_UPDATE, 0, 0, b"\0\0\0\x3c")]


def test_a_stream_window_grows_only_as_its_listener_asks():
    conn, listener = started(stream_window=100)
    block = hpack_blocks.encode_headers(((b":path", b"/a"),))
    conn.receive(frame(http2_frames.HEADERS, http2_frames.END_HEADERS, 1, block) + frame(http2_frames.DATA, 0, 1, b"x" * 60))
    conn.ensure_window(1, 80)  # 40 left is half of 80: enough for now
    assert conn.data_to_send() == []
    conn.ensure_window(1, 1000)
    assert frames_of(conn.data_to_send()) == [(http2_frames.WINDOW_UPDATE, 0, 1, struct.pack(">I", 960))]
    conn.receive(frame(http2_frames.DATA, 0, 1, b"x" * 1000))
    assert ("reset", 1) not in listener.events
    conn.receive(frame(http2_frames.DATA, 0, 1, b"x"))
    assert listener.events[-1] == ("reset", 1)


def test_send_window_follows_the_peers_settings_and_updates():
    conn, listener = started()
    block = hpack_blocks.encode_headers(((b":path", b"/a"),))
    conn.receive(frame(http2_frames.HEADERS, http2_frames.END_HEADERS, 1, block))
    assert conn.send_window(1) == 65535
    conn.receive(frame(http2_frames.SETTINGS, 0, 0, struct.pack(">HI", http2_frames.INITIAL_WINDOW_SIZE, 1000)))
    assert conn.send_window(1) == 1000
    conn.send_data(1, b"x" * 600)
    assert conn.send_window(1) == 400
    conn.receive(frame(http2_frames.WINDOW_UPDATE, 0, 1, struct.pack(">I", 5000)))
    assert conn.send_window(1) == 5400
    conn.receive(frame(http2_frames.SETTINGS, 0, 0, struct.pack(">HI", http2_frames.MAX_FRAME_SIZE, 20000)))
    assert conn.max_outbound_frame_size == 20000
    assert ("window",) in listener.events


def test_a_table_size_change_is_acknowledged_in_the_next_block():
    conn, _ = started()
    block = hpack_blocks.encode_headers(((b":path", b"/a"),))
    conn.receive(frame(http2_frames.HEADERS, http2_frames.END_HEADERS, 1, block)
                 + frame(http2_frames.HEADERS, http2_frames.END_HEADERS, 3, block))
    conn.send_headers(1, ((b":status", b"200"),))
    conn.send_headers(3, ((b":status", b"200"),))
    conn.receive(frame(http2_frames.SETTINGS, 0, 0, struct.pack(">HI", http2_frames.HEADER_TABLE_SIZE, 0)))
    conn.send_headers(3, ((b"grpc-status", b"0"),), end_stream=True)
    blocks = [f[3] for f in frames_of(conn.data_to_send()) if f[0] == http2_frames.HEADERS]
    assert blocks[0] == b"\x20\x88" and blocks[1] == b"\x88" and blocks[2][:1] == b"\x20"


def test_sending_on_a_closed_stream_does_nothing():
    conn, _ = started()
    conn.send_headers(7, ((b":status", b"200"),))
    conn.send_data(7, b"x")
    conn.reset_stream(7)
    assert conn.data_to_send() == []


# Answers another writer sends (lend_stream): see shmserve/fastpath/connection_loans.py.
RESPONSE = ((b":status", b"200"), (b"content-type", b"application/grpc"))
TRAILERS = ((b"grpc-status", b"0"),)


def _ended_call(conn, sid: int) -> None:
    """Stream `sid`: a request the client has sent all of."""
    block = hpack_blocks.encode_headers(((b":path", b"/a"),))
    conn.receive(frame(http2_frames.HEADERS, http2_frames.END_HEADERS | http2_frames.END_STREAM, sid, block))


def lendable() -> tuple:
    """A connection past its first answer, whose header block restates the table size (a
    block that depends on when it is sent: the first answer is never lent)."""
    conn, listener = started()
    _ended_call(conn, 1)
    assert conn.lend_stream(1, RESPONSE, 7, TRAILERS) is None
    conn.send_headers(1, RESPONSE + TRAILERS, end_stream=True)
    conn.data_to_send()
    return conn, listener


def test_a_lent_answer_is_the_frames_this_side_would_send():
    ours, _ = lendable()
    conn, _ = lendable()
    for c in (ours, conn):
        _ended_call(c, 3)
        c.data_to_send()
    ours.send_headers(3, RESPONSE)
    ours.send_data(3, b"payload")
    ours.send_headers(3, TRAILERS, end_stream=True)
    before, after = conn.lend_stream(3, RESPONSE, 7, TRAILERS)
    assert before + b"payload" + after == b"".join(bytes(c) for c in ours.data_to_send())
    # Lent, the stream is closed on this side, its DATA counted: nothing of ours gets in.
    conn.send_headers(3, TRAILERS, end_stream=True)
    assert conn.data_to_send() == [] and conn.send_window(3) == 0
    assert conn._send_window == 65535 - 7
    conn.return_stream(3, 7, written=True, reopen=True)
    assert conn.streams == {} and conn._send_window == 65535 - 7


def test_an_answer_not_written_comes_back_to_this_side():
    conn, _ = lendable()
    _ended_call(conn, 3)
    assert conn.lend_stream(3, RESPONSE, 100, TRAILERS) is not None
    conn.return_stream(3, 100, written=False, reopen=True)
    assert conn.send_window(3) == 65535
    conn.send_headers(3, TRAILERS, end_stream=True)
    assert [f[:3] for f in frames_of(conn.data_to_send())][-1] == (
        http2_frames.HEADERS, http2_frames.END_STREAM | http2_frames.END_HEADERS, 3)
    # A call that ended meanwhile gets only the connection's window back.
    _ended_call(conn, 5)
    conn.lend_stream(5, RESPONSE, 100, TRAILERS)
    conn.return_stream(5, 100, written=False, reopen=False)
    assert conn.streams == {} and conn._send_window == 65535


def test_a_reset_or_new_settings_reach_a_lent_stream():
    conn, listener = lendable()
    _ended_call(conn, 3)
    conn.lend_stream(3, RESPONSE, 100, TRAILERS)
    conn.receive(frame(http2_frames.SETTINGS, 0, 0, struct.pack(">HI", http2_frames.INITIAL_WINDOW_SIZE, 1000)))
    conn.return_stream(3, 100, written=False, reopen=True)
    assert conn.send_window(3) == 1000
    _ended_call(conn, 5)
    conn.lend_stream(5, RESPONSE, 100, TRAILERS)
    conn.receive(frame(http2_frames.RST_STREAM, 0, 5, struct.pack(">I", 8)))  # CANCEL
    assert ("reset", 5) in listener.events


@pytest.mark.parametrize("case", ["window", "frame-size", "table-size", "open", "unknown"])
def test_an_answer_that_cannot_go_as_one_frame_now_is_not_lent(case):
    conn, _ = lendable()
    _ended_call(conn, 3)
    size = {"window": 65536, "frame-size": 16385}.get(case, 100)
    if case == "frame-size":
        conn.receive(frame(http2_frames.WINDOW_UPDATE, 0, 0, struct.pack(">I", 100000))
                     + frame(http2_frames.WINDOW_UPDATE, 0, 3, struct.pack(">I", 100000)))
    if case == "table-size":
        conn.receive(frame(http2_frames.SETTINGS, 0, 0, struct.pack(">HI", http2_frames.HEADER_TABLE_SIZE, 0)))
    if case == "open":  # the client is still sending
        conn.receive(frame(http2_frames.HEADERS, http2_frames.END_HEADERS, 5,
                           hpack_blocks.encode_headers(((b":path", b"/a"),))))
    sid = {"open": 5, "unknown": 7}.get(case, 3)
    assert conn.lend_stream(sid, RESPONSE, size, TRAILERS) is None


def test_close_connection_names_the_last_stream():
    conn, _ = started()
    block = hpack_blocks.encode_headers(((b":path", b"/a"),))
    conn.receive(frame(http2_frames.HEADERS, http2_frames.END_HEADERS, 5, block))
    conn.close_connection()
    conn.close_connection()
    assert frames_of(conn.data_to_send()) == [(http2_frames.GOAWAY, 0, 0, b"\0\0\0\x05\0\0\0\0")]


@pytest.mark.parametrize("data, code", [
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", http2_frames.PROTOCOL_ERROR),
    (PREFACE + frame(http2_frames.PING, 0, 0, b"12345678"), http2_frames.PROTOCOL_ERROR),
    (PREFACE + EMPTY_SETTINGS + frame(http2_frames.PUSH_PROMISE, 4, 1, b"\0\0\0\2"), http2_frames.PROTOCOL_ERROR),
    (PREFACE + EMPTY_SETTINGS + frame(http2_frames.DATA, 0, 1, b"x"), http2_frames.PROTOCOL_ERROR),
    (PREFACE + EMPTY_SETTINGS + frame(http2_frames.HEADERS, 4, 2, b"\x88"), http2_frames.PROTOCOL_ERROR),
    (PREFACE + EMPTY_SETTINGS + frame(http2_frames.HEADERS, 4, 0, b"\x88"), http2_frames.PROTOCOL_ERROR),
    (PREFACE + EMPTY_SETTINGS + frame(http2_frames.CONTINUATION, 4, 1, b"\x88"), http2_frames.PROTOCOL_ERROR),
    (PREFACE + EMPTY_SETTINGS + frame(http2_frames.HEADERS, 0, 1, b"\x88") + frame(http2_frames.PING, 0, 0, b"1" * 8),
     http2_frames.PROTOCOL_ERROR),
    (PREFACE + EMPTY_SETTINGS + frame(http2_frames.HEADERS, 4, 1, b"\xff\xff\xff\x7f"), http2_frames.COMPRESSION_ERROR),
    (PREFACE + EMPTY_SETTINGS + frame(http2_frames.PING, 0, 0, b"1234"), http2_frames.FRAME_SIZE_ERROR),
    (PREFACE + EMPTY_SETTINGS + frame(http2_frames.PING, 0, 1, b"12345678"), http2_frames.PROTOCOL_ERROR),
    (PREFACE + EMPTY_SETTINGS + frame(http2_frames.SETTINGS, 0, 0, b"\0\4\x80\0\0\0"), http2_frames.FLOW_CONTROL_ERROR),
    (PREFACE + EMPTY_SETTINGS + frame(http2_frames.SETTINGS, 0, 0, b"\0\5\0\0\0\1"), http2_frames.PROTOCOL_ERROR),
    (PREFACE + EMPTY_SETTINGS + frame(http2_frames.SETTINGS, 0, 0, b"\0\2\0\0\0\2"), http2_frames.PROTOCOL_ERROR),
    (PREFACE + EMPTY_SETTINGS + frame(http2_frames.SETTINGS, 0, 0, b"\0\2\0"), http2_frames.FRAME_SIZE_ERROR),
    (PREFACE + EMPTY_SETTINGS + frame(http2_frames.SETTINGS, 1, 0, b"\0\2\0\0\0\0"), http2_frames.FRAME_SIZE_ERROR),
    (PREFACE + EMPTY_SETTINGS + frame(http2_frames.WINDOW_UPDATE, 0, 0, b"\0\0\0\0"), http2_frames.PROTOCOL_ERROR),
    (PREFACE + EMPTY_SETTINGS + frame(http2_frames.WINDOW_UPDATE, 0, 0, b"\x7f\xff\xff\xff"),
     http2_frames.FLOW_CONTROL_ERROR),
    (PREFACE + EMPTY_SETTINGS + frame(http2_frames.WINDOW_UPDATE, 0, 9, b"\0\0\0\1"), http2_frames.PROTOCOL_ERROR),
    (PREFACE + EMPTY_SETTINGS + frame(http2_frames.RST_STREAM, 0, 9, b"\0\0\0\1"), http2_frames.PROTOCOL_ERROR),
    (PREFACE + EMPTY_SETTINGS + frame(http2_frames.PRIORITY, 0, 1, b"\0\0"), http2_frames.FRAME_SIZE_ERROR),
    (PREFACE + EMPTY_SETTINGS + frame(http2_frames.DATA, 0, 1, b"")[:3].replace(b"\0\0\0", b"\x10\0\0")
     + b"\0" * 6, http2_frames.FRAME_SIZE_ERROR),
])
def test_protocol_errors_end_the_connection_with_goaway(data, code):
    conn, _ = server(max_frame_size=1 << 16)
    with pytest.raises(http2_frames.Http2Error) as raised:
        conn.receive(data)
    assert raised.value.code == code
    goaway = [f for f in frames_of(conn.data_to_send()) if f[0] == http2_frames.GOAWAY]
    assert len(goaway) == 1 and goaway[0][3][4:8] == struct.pack(">I", code)


def test_an_endless_header_block_ends_the_connection():
    conn, _ = started(max_frame_size=1 << 14, max_header_list_size=16000)
    conn.receive(frame(http2_frames.HEADERS, 0, 1, b"\x88"))
    with pytest.raises(http2_frames.Http2Error) as raised:
        for _ in range(3):
            conn.receive(frame(http2_frames.CONTINUATION, 0, 1, b"\x88" * 8000))
    assert raised.value.code == http2_frames.COMPRESSION_ERROR


def test_data_beyond_the_connection_window_ends_the_connection():
    conn, _ = started(connection_window=65535, stream_window=1 << 20)
    block = hpack_blocks.encode_headers(((b":path", b"/a"),))
    conn.receive(frame(http2_frames.HEADERS, http2_frames.END_HEADERS, 1, block))
    conn.receive(frame(http2_frames.DATA, 0, 1, b"x" * 30000))  # under half: nothing given back yet
    with pytest.raises(http2_frames.Http2Error) as raised:
        conn.receive(frame(http2_frames.DATA, 0, 1, b"x" * 35536))
    assert raised.value.code == http2_frames.FLOW_CONTROL_ERROR


def test_unknown_frame_types_are_ignored():
    conn, listener = started()
    conn.receive(frame(0x42, 0xFF, 0, b"whatever"))
    assert listener.events == [] and conn.data_to_send() == []


_BLOCK = hpack_blocks.encode_headers(((b":path", b"/a"), (b"content-type", b"application/grpc")))
_FRAMES = st.lists(st.tuples(
    st.integers(0, 10), st.integers(0, 255), st.sampled_from([0, 1, 2, 3, 5, 2**31 - 1]),
    st.one_of(st.binary(max_size=40), st.just(_BLOCK), st.just(b"\0\0\0\1"),
              st.just(b"\x03" + _BLOCK + b"pad"), st.just(b"\0\4\0\0\0\0"))), max_size=12)


# perf/fuzz_decoders.py runs this with many more examples.
@settings(max_examples=int(os.environ.get("SHMSERVE_FUZZ_EXAMPLES", 300)), deadline=None,
          database=None)
@given(_FRAMES, st.binary(max_size=30))
def test_any_frames_either_parse_or_end_the_connection_with_goaway(frames, tail):
    conn, listener = started()
    try:
        conn.receive(b"".join(frame(*f) for f in frames) + tail)
    except http2_frames.Http2Error:
        assert any(f[0] == http2_frames.GOAWAY for f in frames_of(conn.data_to_send()))
        return
    assert all(sid <= conn.last_stream_id and sid & 1 for sid in conn.streams)
    requested = {e[1] for e in listener.events if e[0] == "request"}
    assert {e[1] for e in listener.events if e[0] in ("data", "end", "reset")} <= requested


# Hostile input: each way a client could make this side work, or hold memory, out of all
# proportion to what it sends; the work is counted in Python lines (bounds.py), the same on
# any machine. perf/hostile.py measures the same cases in time and RSS on the real server.

def receive_all(conn, data: bytes) -> None:
    """What a connection does with `data`, over as many parse slices as it takes."""
    done = conn.receive(data)
    while not done:
        done = conn.receive(b"")


def _open_streams(conn, count: int, first: int = 1) -> None:
    block = hpack_blocks.encode_headers(((b":path", b"/a"),))
    receive_all(conn, b"".join(frame(http2_frames.HEADERS, http2_frames.END_HEADERS, sid, block)
                               for sid in range(first, first + 2 * count, 2)))


def test_a_settings_frame_costs_the_same_however_many_streams_are_open():
    conn, _ = started(max_concurrent_streams=5000, max_frame_size=1 << 16)
    _open_streams(conn, 2000)
    entries = b"".join(struct.pack(">HI", http2_frames.INITIAL_WINDOW_SIZE, 1000 + i % 2)
                       for i in range(10000))
    data = frame(http2_frames.SETTINGS, 0, 0, entries)
    run_bounded(receive_all, conn, data, max_lines=4 * len(data))
    # Only the last value counts, for every stream, and for streams opened later.
    _open_streams(conn, 1, first=4001)
    assert {conn.send_window(sid) for sid in (1, 3999, 4001)} == {1001}
    conn.receive(frame(http2_frames.WINDOW_UPDATE, 0, 3, struct.pack(">I", 10)))
    conn.receive(frame(http2_frames.SETTINGS, 0, 0, struct.pack(">HI", http2_frames.INITIAL_WINDOW_SIZE, 50)))
    assert (conn.send_window(1), conn.send_window(3)) == (50, 60)


@pytest.mark.parametrize("split", [False, True])
def test_a_header_block_longer_than_advertised_is_refused_before_it_is_decoded(split):
    conn, _ = started(max_header_list_size=16384, max_frame_size=1 << 20)
    block = b"\x88" * 20000  # would decode to 20000 fields
    data = (frame(http2_frames.HEADERS, 0, 1, block[:10000])
            + frame(http2_frames.CONTINUATION, http2_frames.END_HEADERS, 1, block[10000:]) if split
            else frame(http2_frames.HEADERS, http2_frames.END_HEADERS, 1, block))
    with pytest.raises(http2_frames.Http2Error) as raised:
        run_bounded(conn.receive, data, max_lines=2000)
    assert raised.value.code == http2_frames.COMPRESSION_ERROR
    goaway = [f for f in frames_of(conn.data_to_send()) if f[0] == http2_frames.GOAWAY][0]
    assert b"SETTINGS_MAX_HEADER_LIST_SIZE" in goaway[3][8:]


@pytest.mark.parametrize("updates, allowed", [
    (b"\x20", True), (b"\x20\x3f\xe1\x1f", True),  # to 0, then back to 4096
    (b"\x20" * 3, False), (b"\x20" * 60000, False)])
def test_a_header_block_may_begin_with_two_table_size_updates_at_most(updates, allowed):
    conn, listener = started()
    data = frame(http2_frames.HEADERS, http2_frames.END_HEADERS, 1,
                 updates + hpack_blocks.encode_headers(((b":path", b"/a"),)))
    if allowed:
        conn.receive(data)
        assert listener.events == [("request", 1, [(b":path", b"/a")])]
        return
    with pytest.raises(http2_frames.Http2Error) as raised:
        run_bounded(conn.receive, data, max_lines=2000)
    assert raised.value.code == http2_frames.COMPRESSION_ERROR


PING = frame(http2_frames.PING, 0, 0, b"12345678")


def _goaway(conn) -> tuple:
    """(code, debug data) of the GOAWAY the connection sent."""
    payload = [f for f in frames_of(conn.data_to_send()) if f[0] == http2_frames.GOAWAY][0][3]
    return struct.unpack(">I", payload[4:8])[0], payload[8:]


def test_pings_follow_grpcs_ping_policy():
    now = [0.0]
    conn, _ = started(clock=lambda: now[0])
    _open_streams(conn, 1)  # with a call open, PINGs may come every 300 s
    for _ in range(3):  # the first is free, then two strikes
        conn.receive(PING)
    conn.send_headers(1, ((b":status", b"200"),))  # what this side sends starts it over
    for _ in range(3):
        conn.receive(PING)
    now[0] += 300
    conn.receive(PING)  # late enough: no strike
    with pytest.raises(http2_frames.Http2Error) as raised:
        for _ in range(3):
            conn.receive(PING)
    assert raised.value.code == http2_frames.ENHANCE_YOUR_CALM
    assert _goaway(conn) == (http2_frames.ENHANCE_YOUR_CALM, b"too_many_pings")


@pytest.mark.parametrize("options, pings_allowed", [
    ({}, 3),  # no call open: every two hours
    ({"pings_without_calls": True, "ping_interval": 10}, 6),  # now 10 s, calls or not
    ({"max_ping_strikes": 0}, 100),  # no limit
])
def test_the_ping_policy_without_calls(options, pings_allowed):
    now = [0.0]
    conn, _ = started(clock=lambda: now[0], **options)
    for _ in range(3):
        conn.receive(PING)
        now[0] += 11
    for _ in range(pings_allowed - 3):
        conn.receive(PING)
    if pings_allowed < 100:
        with pytest.raises(http2_frames.Http2Error):
            conn.receive(PING)


@pytest.mark.parametrize("answered", [PING, EMPTY_SETTINGS])
def test_answers_waiting_to_be_written_are_bounded(answered):
    taken, _ = started(max_ping_strikes=0)
    for _ in range(2 * http2.MAX_QUEUED_CONTROL_FRAMES // 1000):
        receive_all(taken, answered * 1000)
        taken.data_to_send()  # written as they come: as many as the client likes
    never_taken, _ = started(max_ping_strikes=0)
    with pytest.raises(http2_frames.Http2Error) as raised:
        for _ in range(2 * http2.MAX_QUEUED_CONTROL_FRAMES // 1000):
            receive_all(never_taken, answered * 1000)
    assert raised.value.code == http2_frames.ENHANCE_YOUR_CALM


def test_streams_reset_while_served_are_rate_limited():
    now = [0.0]
    conn, listener = started(max_concurrent_streams=1 << 20, clock=lambda: now[0])
    block = hpack_blocks.encode_headers(((b":path", b"/a"),))
    sids = iter(range(1, 1 << 20, 2))

    def open_and_reset(count: int) -> bytes:
        return b"".join(frame(http2_frames.HEADERS, http2_frames.END_HEADERS | http2_frames.END_STREAM, sid, block)
                        + frame(http2_frames.RST_STREAM, 0, sid, struct.pack(">I", 8))
                        for sid in (next(sids) for _ in range(count)))

    receive_all(conn, open_and_reset(http2_rate_limits.RESET_BURST))
    now[0] += 1.0
    receive_all(conn, open_and_reset(int(http2_rate_limits.RESET_RATE)))
    with pytest.raises(http2_frames.Http2Error) as raised:
        receive_all(conn, open_and_reset(1))
    assert raised.value.code == http2_frames.ENHANCE_YOUR_CALM
    # Resets of streams already over cost nothing.
    conn, _ = started(clock=lambda: now[0])
    conn.receive(frame(http2_frames.HEADERS, http2_frames.END_HEADERS | http2_frames.END_STREAM, 1, block))
    conn.send_headers(1, ((b":status", b"200"),), end_stream=True)
    receive_all(conn, frame(http2_frames.RST_STREAM, 0, 1, struct.pack(">I", 8)) * (2 * http2_rate_limits.RESET_BURST))


def test_parsing_yields_once_its_time_slice_is_spent(monkeypatch):
    whole, whole_listener = started(max_ping_strikes=0)
    sliced, sliced_listener = started(max_ping_strikes=0)
    block = hpack_blocks.encode_headers(((b":path", b"/a"),))
    data = PING * 70 + frame(http2_frames.HEADERS, http2_frames.END_HEADERS | http2_frames.END_STREAM, 1, block)
    monkeypatch.setattr(http2, "PARSE_SLICE_S", 60.0)
    assert whole.receive(data)
    monkeypatch.setattr(http2, "PARSE_SLICE_S", -1.0)  # spent at once
    turns = 1
    done = sliced.receive(data)
    while not done:
        turns += 1
        done = sliced.receive(b"")
    assert turns == 3  # 32 frames, 32 more, then the rest
    assert sliced_listener.events == whole_listener.events
    assert sliced.data_to_send() == whole.data_to_send()


def test_only_short_request_blocks_are_kept_decoded():
    conn, listener = started()
    block = b"\x82" * 200  # 200 fields, each an index: nothing changes the table
    conn.receive(frame(http2_frames.HEADERS, http2_frames.END_HEADERS, 1, block))
    assert listener.events[0][0] == "request" and conn._blocks._cache == {}


def test_only_short_header_blocks_are_kept_encoded():
    hpack_blocks._BLOCKS.clear()
    hpack_blocks.encode_headers(((b"grpc-status", b"5"), (b"grpc-message", b"x" * 4000)))
    assert hpack_blocks._BLOCKS == {}
    hpack_blocks.encode_headers(((b"grpc-status", b"0"),))
    assert len(hpack_blocks._BLOCKS) == 1


# Any input, floods included: the work and memory it costs follow its size.
_ONE_FRAME = st.tuples(
    st.integers(0, 10), st.integers(0, 255), st.sampled_from([0, 1, 3, 2**31 - 1]),
    st.one_of(st.binary(max_size=24), st.just(_BLOCK), st.just(b"\0\0\0\1"),
              st.just(b"\x20" * 40 + _BLOCK), st.just(b"\x82" * 60),
              st.just(b"\0\4\0\0\0\0" * 20), st.just(b"12345678")))
_CHUNKS = st.lists(st.one_of(
    _ONE_FRAME.map(lambda f: frame(*f)),
    st.builds(lambda f, n: frame(*f) * n, _ONE_FRAME, st.integers(2, 2000)),
    # New streams, each with its own block, as a flood of calls sends them.
    st.builds(lambda first, n: b"".join(
        frame(http2_frames.HEADERS, http2_frames.END_HEADERS | http2_frames.END_STREAM, sid, _BLOCK)
        for sid in range(first, first + 2 * n, 2)), st.integers(1, 50).map(lambda i: 2 * i + 1),
        st.integers(1, 500))), max_size=6)
# Python lines a byte of input may cost, and bytes of memory. A PING costs 1.5 lines a byte;
# a header block decoded (literals, hpack in Python) about 7, which is what a table size
# update cost before updates were counted (and 25 once decoded); HEADERS of a new stream
# take about 200 bytes of state for their 20.
LINES_PER_BYTE = 12
BYTES_PER_BYTE = 32


@settings(max_examples=int(os.environ.get("SHMSERVE_FUZZ_EXAMPLES", 100)), deadline=None,
          database=None)
@given(_CHUNKS)
def test_any_input_costs_work_and_memory_in_proportion_to_its_size(chunks):
    data = b"".join(chunks)

    def feed(conn):
        with contextlib.suppress(http2_frames.Http2Error):
            receive_all(conn, data)

    conn, _ = started(max_concurrent_streams=1 << 20)
    run_bounded(feed, conn, max_lines=LINES_PER_BYTE * len(data) + 5000)
    conn, _ = started(max_concurrent_streams=1 << 20)
    assert peak_allocation(feed, conn) < BYTES_PER_BYTE * len(data) + 64 * 1024
