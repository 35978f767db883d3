"""The fast path's parts of an HTTP/1.1 connection, driven by hand on a fake transport: any
bytes, fed in any pieces, get answers, a refusal or a wait, never an exception; a request head
that repeats is recognised without the parser (shmserve/http/http1_repeated_heads.py) and read
as the parser reads it; a response head written before still says when the connection closes;
and the socket is lent to a model's worker (shmserve/http/http1_loans.py) only while an answer
written there is right, with this side's writes waiting for the worker's.
"""

import asyncio
import contextlib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shmserve.http.http1 import HttpServer
from shmserve.http.http1_connection import Connection
from shmserve.http.http1_messages import Response
from tests.unit.http.http1_helpers import echo, post


class FakeTransport:
    def __init__(self):
        self.out = bytearray()
        self.closed = False

    def write(self, data):
        self.out += data

    def writelines(self, chunks):
        for chunk in chunks:
            self.out += chunk

    def is_closing(self):
        return self.closed

    def close(self):
        self.closed = True

    def get_extra_info(self, name, default=None):
        return default  # no socket behind it

    def get_write_buffer_size(self):
        return 0

    def pause_reading(self):
        pass

    def can_write_eof(self):
        return True

    def write_eof(self):
        pass

    def resume_reading(self):
        pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(
    st.binary(max_size=64),
    st.sampled_from([b"GET / HTTP/1.1\r\n\r\n", b"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\n",
                     b"Transfer-Encoding: chunked\r\n", b"\r\n", b"0\r\n\r\n",
                     b"Expect: 100-continue\r\n", b"Content-Length: 99999999999\r\n"])),
    max_size=12))
def test_any_bytes_get_answers_or_a_refusal_never_an_exception(pieces):
    """Fed in pieces, any input leaves the connection answering, refusing with a status, or
    waiting for more; every byte written back is a well-formed response head first."""
    conn, transport = _fed(echo, pieces)
    out = bytes(transport.out)
    assert not out or out.startswith(b"HTTP/1.1 ")
    if conn.refused and not transport.closed:
        assert b" 400 " in out or b" 431 " in out or b" 200 " in out


def _fed(handle, reads: list) -> tuple:
    """(connection, transport) of a connection fed `reads` one by one, on a loop of its own
    that ran until the connection's requests were served."""
    loop = asyncio.new_event_loop()
    try:
        server = HttpServer(handle, 1 << 16)
        server.loop = loop
        conn = Connection(server)
        transport = FakeTransport()
        conn.connection_made(transport)
        for data in reads:
            conn.data_received(data)
            loop.run_until_complete(asyncio.sleep(0))
        while conn.task is not None:
            loop.run_until_complete(asyncio.sleep(0))
        conn.connection_lost(None)
    finally:
        loop.close()
    return conn, transport


_KINDS_OF_REQUEST = [
    post("/a", b"0123"),
    post("/a", b"4567"),  # the same head as the one before
    post("/b?x=1", b"xy", "X-Extra: 1\r\n"),
    b"GET /ready HTTP/1.1\r\nHost: x\r\n\r\n",
    b"\r\n" + post("/a", b"89ab"),  # the empty line that may come between requests
    post("/a", b"cdef") + b"\r\n",
    post("/a", b"wait", "Expect: 100-continue\r\n"),
    b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n",
    b"POST /a HTTP/1.1\nHost: x\nContent-Length: 4\n\nlfonly",  # bare LF lines
]


def _seen_by_handler(reads: list) -> list:
    """What the handler saw of each request, and the bytes written back, for a connection
    fed `reads` one by one."""
    seen = []

    async def record(request):
        seen.append((request.method, request.path, request.query, request.headers,
                     request.body))
        return Response(200, b"ok")

    _, transport = _fed(record, reads)
    # Whether a request waits for 100 Continue depends on where the reads cut it.
    return seen, bytes(transport.out).replace(b"HTTP/1.1 100 Continue\r\n\r\n", b"")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(range(len(_KINDS_OF_REQUEST))),
                          st.integers(min_value=1, max_value=3)), min_size=1, max_size=5),
       st.lists(st.integers(min_value=0, max_value=3), min_size=15, max_size=15))
def test_a_repeated_request_head_reads_as_the_parser_reads_it(runs, groups):
    """A head that arrived alone in one read is recognised in later reads without the
    parser: whatever the reads hold (one request, several, a request and a part of the next),
    the handler sees what it sees when every byte is parsed, and the client gets the same
    answers. `runs`: (kind of request, times in a row)."""
    requests = [_KINDS_OF_REQUEST[k] for k, times in runs for _ in range(times)]
    reads = []
    i = 0
    for group in groups:  # reads of 0 (a request cut in two), 1, 2 or 3 requests
        if i >= len(requests):
            break
        if group == 0:
            reads += [requests[i][:7], requests[i][7:]]
            i += 1
        else:
            reads.append(b"".join(requests[i:i + group]))
            i += group
    reads.append(b"".join(requests[i:]))
    one_byte_at_a_time = [bytes([b]) for b in b"".join(requests)]  # never a whole request
    assert _seen_by_handler(reads) == _seen_by_handler(one_byte_at_a_time)


def test_a_response_head_written_before_still_says_the_connection_closes():
    server = HttpServer(echo, 1 << 16)
    server.loop = asyncio.new_event_loop()
    try:
        conn = Connection(server)
        assert b"Connection: close" not in conn.head(200, {"Content-Type": "a/b"}, 3)
        conn.closing = True
        assert b"Connection: close" in conn.head(200, {"Content-Type": "a/b"}, 3)
        conn.closing = False
        conn.server.stopping = True
        assert b"Connection: close" in conn.head(200, {"Content-Type": "a/b"}, 3)
    finally:
        server.loop.close()


@contextlib.contextmanager
def _served_connection():
    """(a connection on a fake transport, as served, the transport, its server)."""
    server = HttpServer(echo, 1 << 16)
    server.loop = asyncio.new_event_loop()
    try:
        conn = Connection(server)
        transport = FakeTransport()
        conn.connection_made(transport)
        yield conn, transport, server
    finally:
        server.loop.close()


def _lend(conn, holder) -> int:
    """Lend the connection's socket for an answer, as a model's worker is (the fast path):
    its descriptor, or -1."""
    lent = conn.loans.lend(holder, None, 0)
    return -1 if lent is None else lent[0]


def test_the_socket_is_lent_only_while_an_answer_written_there_is_right():
    """Not when this side has bytes waiting, nor when the answer must say the connection
    closes (a head prepared earlier would not say it)."""
    with _served_connection() as (conn, transport, server):
        assert _lend(conn, "w") == -1  # no socket behind the fake transport
        conn.loans.fd = 7
        transport.get_write_buffer_size = lambda: 10
        assert _lend(conn, "w") == -1
        transport.get_write_buffer_size = lambda: 0
        for flag in ("closing", "stopping"):
            target = conn if flag == "closing" else server
            setattr(target, flag, True)
            assert _lend(conn, "w") == -1 and not conn.lendable()
            setattr(target, flag, False)
        assert _lend(conn, "w") == 7
        conn.loans.returned(None, None)
        transport.close()
        assert _lend(conn, "w") == -1


def test_what_this_side_writes_while_the_socket_is_lent_waits_for_the_worker():
    """The worker writes after its batch's Result, while the connection serves its next
    request: this side's writes wait, in order, and a socket that took only part of the
    worker's answer gets the rest first and is not lent again."""
    with _served_connection() as (conn, transport, _):
        conn.loans.fd = 7
        assert _lend(conn, "w") == 7
        assert _lend(conn, "w") == 7  # the same worker's next batch: in turn
        assert _lend(conn, "v") == -1  # another worker could write at the same time
        conn.transport.write(b"<ours>")
        conn.transport.close()
        assert _lend(conn, "w") == -1  # ours would come after its next answer
        assert transport.out == b"" and not transport.closed
        conn.loans.returned(None, b"rest")
        assert transport.out == b"rest"  # the rest at once: the worker is done with it
        conn.loans.returned(None, None)
        assert transport.out == b"rest<ours>" and transport.closed
        assert conn.transport is transport
        assert not conn.lendable()  # backed up once: no more loans


def test_a_worker_that_dies_while_it_writes_closes_the_connection():
    with _served_connection() as (conn, transport, _):
        conn.loans.fd = 7
        _lend(conn, "w")
        conn.loans.lost()
        assert transport.closed and conn.transport is transport
