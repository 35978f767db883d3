"""The server side of HTTP/2 (shmserve/grpc/http2.py and the modules beside it) as the protocol
goes: calls with the h2 library as the client (round trips, long trailers in CONTINUATION
frames, header blocks that decode as sent whatever the table did and repeated ones decoded
once, input split at every byte), and hand-made frames: PINGs, padding and priority,
header blocks over several frames, the stream limit, resets, flow-control windows both ways,
table size changes, sending on closed streams, GOAWAY naming the last stream and unknown frame
types.
"""

import struct

import h2.config
import h2.connection
import h2.events
import h2.settings
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shmserve.grpc import hpack_blocks, http2_frames
from tests.unit.grpc.http2_helpers import frame, frames_of, server, started


REQUEST = [(":method", "POST"), (":scheme", "http"), (":path", "/pkg.Svc/M"),
           (":authority", "localhost"), ("content-type", "application/grpc"), ("te", "trailers")]
# All in HPACK's static table: blocks that differ only in the dynamic entries they name then
# have the same bytes, which is what could fool a decode cache.
STATIC_REQUEST = [(":method", "POST"), (":scheme", "http"), (":path", "/")]


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


def test_close_connection_names_the_last_stream():
    conn, _ = started()
    block = hpack_blocks.encode_headers(((b":path", b"/a"),))
    conn.receive(frame(http2_frames.HEADERS, http2_frames.END_HEADERS, 5, block))
    conn.close_connection()
    conn.close_connection()
    assert frames_of(conn.data_to_send()) == [(http2_frames.GOAWAY, 0, 0, b"\0\0\0\x05\0\0\0\0")]


def test_unknown_frame_types_are_ignored():
    conn, listener = started()
    conn.receive(frame(0x42, 0xFF, 0, b"whatever"))
    assert listener.events == [] and conn.data_to_send() == []
