"""What the server side of HTTP/2 does with input that breaks the protocol or would make it work,
or hold memory, out of all proportion to what a client sends: protocol errors end the connection
with GOAWAY and their code (and any frames either parse or do), endless and overlong header
blocks, table size updates, data beyond the connection window, SETTINGS floods, the PING policy,
answers waiting to be written, reset streams, parse slices, the caches of header blocks, and any
input's cost in work (Python lines, tests/unit/bounds.py) and memory in proportion to its size.
perf/hostile.py measures the same cases in time and RSS on the real server.
"""

import contextlib
import os
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmserve.grpc import hpack_blocks, http2, http2_frames, http2_rate_limits
from tests.unit.bounds import peak_allocation, run_bounded
from tests.unit.grpc.http2_helpers import (EMPTY_SETTINGS, PREFACE, frame, frames_of, server,
                                           started)


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
