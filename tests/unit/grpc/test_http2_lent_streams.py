"""HTTP/2 streams whose answer another writer sends (lend_stream and return_stream; see
shmserve/fastpath/connection_loans.py): a lent answer is the frames this side would send, one
not written comes back to this side, a reset or new settings reach a lent stream, and an answer
that cannot go as one frame now is not lent.
"""

import struct

import pytest

from shmserve.grpc import hpack_blocks, http2_frames
from tests.unit.grpc.http2_helpers import frame, frames_of, started


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
