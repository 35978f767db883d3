"""The HTTP/1.1 server side (shmserve/http/http1.py and its http1_*.py parts) and its router,
on real sockets with hand-written requests: keep-alive, pipelining order, chunked bodies both
ways, limits, timeouts, disconnects and shutdown. One ordering case needs a turn of the event
loop that sockets cannot time, and drives a connection through a recording transport."""

import asyncio
import contextlib
import json
import re
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shmserve.http import http1, http1_reader
from shmserve.http.http1 import HttpServer
from shmserve.http.http1_connection import Connection
from shmserve.http.http1_messages import Response, error_response
from shmserve.http.routing import MethodNotAllowed, NotFound, Router

WAIT_S = 5.0


async def echo(request):
    """Answers with what it saw of the request."""
    return Response(200, json.dumps({
        "method": request.method, "path": request.path, "query": request.query,
        "headers": request.headers, "body": request.body.decode("latin-1")}).encode(),
        "application/json")


@contextlib.asynccontextmanager
async def serving(handle=echo, **options):
    server = HttpServer(handle, options.pop("max_input_size", 1 << 20), **options)
    await server.start("127.0.0.1", 0)
    try:
        yield server
    finally:
        await server.stop(grace=1.0)


async def connect(server):
    return await asyncio.open_connection("127.0.0.1", server.port)


async def read_response(reader) -> tuple:
    """(status, headers, body) of the next response; a chunked body is decoded."""
    line = await asyncio.wait_for(reader.readline(), WAIT_S)
    assert line.startswith(b"HTTP/1.1 "), line
    status = int(line.split()[1])
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size = int((await reader.readline()).strip(), 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += chunk[:-2]
    else:
        body = await reader.readexactly(int(headers.get("content-length", 0)))
    return status, headers, body


async def closed(reader) -> bool:
    """True when the server closes the connection within WAIT_S."""
    try:
        return await asyncio.wait_for(reader.read(), WAIT_S) == b""
    except ConnectionResetError:
        return True


def post(path: str, body: bytes, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
            .encode() + body)


def run(coro):
    return asyncio.run(coro)


def test_keep_alive_serves_requests_on_one_connection():
    async def main():
        async with serving() as server:
            reader, writer = await connect(server)
            for i in range(3):
                writer.write(post(f"/p/{i}?q=1", b"body%d" % i))
                status, headers, body = await read_response(reader)
                seen = json.loads(body)
                assert status == 200 and "connection" not in headers
                assert (seen["method"], seen["path"], seen["query"], seen["body"]) == \
                    ("POST", f"/p/{i}", "q=1", f"body{i}")
                assert seen["headers"]["host"] == "x"
            writer.close()
    run(main())


def test_pipelined_requests_are_answered_in_request_order():
    # Even ones answer without waiting, so they are served inside the read (eager start);
    # odd ones wait, later ones less: all leave in request order, one at a time.
    running = []

    async def handle(request):
        running.append(request.body)
        assert len(running) == 1, "two requests of one connection served at once"
        if int(request.body) % 2:
            await asyncio.sleep(0.02 * (6 - int(request.body)))
        running.remove(request.body)
        return Response(200, request.body)

    async def main():
        async with serving(handle) as server:
            reader, writer = await connect(server)
            writer.write(b"".join(post("/", b"%d" % i) for i in range(6)))
            answers = [(await read_response(reader))[2] for _ in range(6)]
            assert answers == [b"%d" % i for i in range(6)]
            writer.close()
    run(main())


class _RecordingTransport(asyncio.Transport):
    """What a connection writes, and a hook called on each write."""

    def __init__(self, on_write):
        super().__init__()
        self.written = bytearray()
        self._on_write = on_write
        self._closing = False

    def write(self, data) -> None:
        self.written += data
        self._on_write()

    def writelines(self, chunks) -> None:
        for chunk in chunks:
            self.write(chunk)

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        self._closing = True


def test_a_request_read_just_after_a_task_ended_does_not_run_beside_the_next():
    # The next request is read after the task serving the previous one returned, but before
    # that task's done callback ran: the request starts then, and the late callback must not
    # let a third one start beside it.
    running = []

    async def handle(request):
        running.append(request.body)
        assert len(running) == 1, "two requests of one connection served at once"
        await asyncio.sleep(0.01)
        running.remove(request.body)
        return Response(200, request.body)

    async def main():
        loop = asyncio.get_running_loop()
        server = HttpServer(handle, 1 << 20)
        server.loop = loop
        conn = Connection(server)
        more = [post("/", b"1") + post("/", b"2")]

        def on_write():
            if more:  # runs before the finishing task's callbacks, which it schedules later
                loop.call_soon(conn.data_received, more.pop())

        transport = _RecordingTransport(on_write)
        conn.connection_made(transport)
        conn.data_received(post("/", b"0"))
        for _ in range(200):
            if transport.written.count(b"HTTP/1.1 ") == 3:
                break
            await asyncio.sleep(0.01)
        answers = re.findall(rb"HTTP/1.1 (\d+) .*?\r\n\r\n(\d)", bytes(transport.written),
                             re.S)
        assert answers == [(b"200", b"0"), (b"200", b"1"), (b"200", b"2")]
    run(main())


@pytest.mark.parametrize("request_head", [
    b"GET / HTTP/1.0\r\n\r\n",
    b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n",
])
def test_a_connection_that_does_not_keep_alive_is_closed_after_its_answer(request_head):
    async def main():
        async with serving() as server:
            reader, writer = await connect(server)
            writer.write(request_head)
            status, headers, _ = await read_response(reader)
            assert status == 200 and headers["connection"] == "close"
            assert await closed(reader)
    run(main())


def test_a_chunked_request_body_reaches_the_handler_whole():
    async def main():
        async with serving() as server:
            reader, writer = await connect(server)
            writer.write(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n")
            status, _, body = await read_response(reader)
            assert status == 200 and json.loads(body)["body"] == "abcdefg"
            writer.close()
    run(main())


def test_expect_100_continue_is_answered_before_the_body_is_sent():
    async def main():
        async with serving() as server:
            reader, writer = await connect(server)
            writer.write(b"POST / HTTP/1.1\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
            interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
            assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(b"data")
            status, _, body = await read_response(reader)
            assert status == 200 and json.loads(body)["body"] == "data"
            writer.close()
    run(main())


def test_a_head_request_gets_the_get_answers_headers_only():
    router = Router()
    router.add("GET", "/thing", echo)

    async def handle(request):
        handler, request.match_info = router.resolve(request.method, request.path)
        return await handler(request)

    async def main():
        async with serving(handle) as server:
            reader, writer = await connect(server)
            writer.write(b"HEAD /thing HTTP/1.1\r\n\r\nGET /thing HTTP/1.1\r\n\r\n")
            line = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
            assert line.startswith(b"HTTP/1.1 200 OK\r\n") and b"Content-Length: " in line
            status, _, body = await read_response(reader)  # the GET's, right after
            assert status == 200 and json.loads(body)["method"] == "GET"
            writer.close()
    run(main())


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_over_the_limit_is_refused_and_the_server_goes_on(chunked):
    async def main():
        async with serving(max_input_size=1000) as server:
            reader, writer = await connect(server)
            if chunked:
                writer.write(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                             + b"400\r\n" + b"x" * 1024 + b"\r\n")
            else:
                writer.write(b"POST / HTTP/1.1\r\nContent-Length: 1001\r\n\r\n")
            status, headers, body = await read_response(reader)
            assert status == 400 and headers["connection"] == "close"
            assert "--http-max-input-size" in json.loads(body)["error"]
            writer.write(b"y" * 5000)  # the rest of the body is read and dropped
            writer.close()
            reader, writer = await connect(server)
            writer.write(post("/", b"z" * 1000))
            assert (await read_response(reader))[0] == 200
            writer.close()
    run(main())


def test_a_head_over_the_limit_gets_431():
    async def main():
        async with serving() as server:
            reader, writer = await connect(server)
            writer.write(b"GET / HTTP/1.1\r\nX-Big: " + b"a" * (http1_reader.MAX_HEAD_BYTES + 1)
                         + b"\r\n\r\n")
            status, _, body = await read_response(reader)
            assert status == 431 and "headers exceed" in json.loads(body)["error"]
            assert await closed(reader)
    run(main())


def test_a_head_that_never_ends_is_refused_once_it_passes_the_limit():
    """The parser holds an unfinished header value itself: it must not grow without end."""
    async def main():
        async with serving() as server:
            reader, writer = await connect(server)
            writer.write(b"GET / HTTP/1.1\r\nX-Endless: ")
            for _ in range(4 * http1_reader.MAX_HEAD_BYTES // 4096):  # never the blank line
                writer.write(b"a" * 4096)
                await writer.drain()
                await asyncio.sleep(0.001)
            status, _, body = await read_response(reader)
            assert status == 431 and "headers exceed" in json.loads(body)["error"]
    run(main())


@pytest.mark.parametrize("garbage", [
    b"NOT HTTP AT ALL\r\n\r\n",
    b"GET / HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
    b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
])
def test_a_malformed_request_gets_400_and_the_connection_closes(garbage):
    assert_refused(garbage, 400, "malformed HTTP request")


def assert_refused(raw: bytes, status: int, text: str) -> None:
    """`raw` is answered `status` with `text` in its error, then the connection closes."""
    async def main():
        async with serving() as server:
            reader, writer = await connect(server)
            writer.write(raw)
            got, _, body = await read_response(reader)
            assert got == status and text in json.loads(body)["error"]
            assert await closed(reader)
    run(main())


def test_an_upgrade_request_is_answered_plainly_then_the_connection_closes():
    async def main():
        async with serving() as server:
            reader, writer = await connect(server)
            writer.write(b"GET / HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
                         b"\x81\x00")
            assert (await read_response(reader))[0] == 200
            assert await closed(reader)
    run(main())


def test_an_upgrade_request_with_a_body_is_refused_not_run_without_it():
    assert_refused(post("/load", b"{}", "Connection: Upgrade\r\nUpgrade: h2c\r\n"), 400, "upgrade")


def test_a_chunked_trailer_is_not_taken_as_a_header():
    async def main():
        async with serving() as server:
            reader, writer = await connect(server)
            writer.write(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"3\r\nabc\r\n0\r\nInference-Header-Content-Length: 2\r\n\r\n")
            status, _, body = await read_response(reader)
            seen = json.loads(body)
            assert status == 200 and seen["body"] == "abc"
            assert "inference-header-content-length" not in seen["headers"]
            writer.close()
    run(main())


def test_a_trailer_that_never_ends_is_refused_once_it_passes_the_limit():
    async def main():
        async with serving() as server:
            reader, writer = await connect(server)
            writer.write(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"3\r\nabc\r\n0\r\nX-Endless: ")
            for _ in range(4 * http1_reader.MAX_HEAD_BYTES // 4096):
                writer.write(b"a" * 4096)
                await writer.drain()
                await asyncio.sleep(0.001)
            status, _, body = await read_response(reader)
            assert status == 431 and "trailer" in json.loads(body)["error"]
    run(main())


def test_an_unsupported_transfer_coding_gets_501():
    assert_refused(b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
                   b"3\r\nabc\r\n0\r\n\r\n", 501, "gzip")


def test_only_the_request_that_closes_the_connection_says_so():
    # A pipelined request with `Connection: close` behind one still being served: the first
    # answer keeps the connection open (a client would stop reading after it otherwise),
    # and bytes after the closing request are dropped, not answered.
    async def handle(request):
        if request.path == "/slow":
            await asyncio.sleep(0.05)
        return Response(200, request.path.encode())

    async def main():
        async with serving(handle) as server:
            reader, writer = await connect(server)
            writer.write(b"GET /slow HTTP/1.1\r\n\r\n"
                         b"GET /last HTTP/1.1\r\nConnection: close\r\n\r\n"
                         b"GET /dropped HTTP/1.1\r\n\r\n")
            status, headers, body = await read_response(reader)
            assert (status, body) == (200, b"/slow") and "connection" not in headers
            status, headers, body = await read_response(reader)
            assert (status, body, headers["connection"]) == (200, b"/last", "close")
            assert await closed(reader)
    run(main())


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_100_continue_waits_for_the_answers_before_it(version):
    # HTTP/1.0 clients know no interim answers: theirs is never sent. Behind a request still
    # being served, it waits for that request's answer, or the client would take it as that.
    async def handle(request):
        if request.path == "/slow":
            await asyncio.sleep(0.05)
        return Response(200, request.path.encode() + request.body)

    async def main():
        async with serving(handle) as server:
            reader, writer = await connect(server)
            writer.write(f"GET /slow HTTP/{version}\r\nConnection: keep-alive\r\n\r\n"
                         f"POST /next HTTP/{version}\r\nConnection: keep-alive\r\n"
                         f"Content-Length: 4\r\nExpect: 100-continue\r\n\r\n".encode())
            first = await asyncio.wait_for(reader.readuntil(b"/slow"), WAIT_S)
            assert b"100 Continue" not in first
            if version == "1.1":
                interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
                assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(b"data")
            status, _, body = await read_response(reader)
            assert (status, body) == (200, b"/nextdata")
            writer.close()
    run(main())


def test_an_absolute_form_target_is_served_by_its_path():
    async def main():
        async with serving() as server:
            reader, writer = await connect(server)
            writer.write(b"GET http://x/v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            status, _, body = await read_response(reader)
            assert status == 200 and json.loads(body)["path"] == "/v2/health/live"
            writer.close()
    run(main())


def test_a_target_that_is_not_a_path_gets_400_and_the_connection_closes():
    assert_refused(b"CONNECT x:80 HTTP/1.1\r\nHost: x\r\n\r\n", 400,
                   "the request target 'x:80' is not a path")


def test_a_handler_that_raises_gets_500_and_the_connection_goes_on():
    async def handle(request):
        if request.path == "/boom":
            raise ValueError("boom")
        return Response(200, b"fine")

    async def main():
        async with serving(handle) as server:
            reader, writer = await connect(server)
            writer.write(b"GET /boom HTTP/1.1\r\n\r\nGET /ok HTTP/1.1\r\n\r\n")
            status, _, body = await read_response(reader)
            assert status == 500 and "boom" in json.loads(body)["error"]
            status, _, body = await read_response(reader)
            assert (status, body) == (200, b"fine")
            writer.close()
    run(main())


def test_a_client_that_leaves_cancels_its_request():
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def handle(request):
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def main():
        async with serving(handle) as server:
            reader, writer = await connect(server)
            writer.write(b"GET / HTTP/1.1\r\n\r\n")
            await asyncio.wait_for(started.wait(), WAIT_S)
            writer.close()
            await asyncio.wait_for(cancelled.wait(), WAIT_S)
    run(main())


def test_a_stream_sends_chunks_as_they_are_written():
    async def handle(request):
        stream = request.stream({"Content-Type": "text/event-stream"})
        for i in range(3):
            await stream.write(b"data: %d\n\n" % i)
        await stream.end()

    async def main():
        async with serving(handle) as server:
            reader, writer = await connect(server)
            writer.write(b"GET / HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n")
            for _ in range(2):  # the connection stays usable after a stream
                status, headers, body = await read_response(reader)
                assert status == 200 and headers["content-type"] == "text/event-stream"
                assert body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
            writer.close()
    run(main())


def test_a_stream_writer_waits_for_a_client_that_does_not_read():
    written = []

    async def handle(request):
        stream = request.stream({})
        for _ in range(256):
            await stream.write(b"x" * (1 << 20))
            written.append(1)
        await stream.end()

    async def main():
        async with serving(handle) as server:
            reader, writer = await connect(server)
            writer.write(b"GET / HTTP/1.1\r\n\r\n")
            await asyncio.sleep(1.0)
            # Socket buffers hold a few MiB at most; the writer stopped long before 256.
            assert len(written) < 64, len(written)
            writer.close()
    run(main())


@pytest.fixture
def short_timeouts(monkeypatch):
    monkeypatch.setattr(http1, "_SWEEP_INTERVAL_S", 0.05)
    for name in ("HEADERS_TIMEOUT_S", "BODY_TIMEOUT_S", "KEEPALIVE_TIMEOUT_S"):
        monkeypatch.setattr(http1_reader, name, 0.3)
    monkeypatch.setattr(http1_reader, "REQUEST_TIMEOUT_S", 1.0)


@pytest.mark.parametrize("sent, why", [
    (b"GET / HTTP/1.1\r\nX-Slow: ", "the request headers did not arrive within 0.3 s"),
    (b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc", "the request body stopped for 0.3 s"),
])
def test_a_request_that_stops_past_its_timeout_gets_408(short_timeouts, sent, why):
    async def main():
        async with serving() as server:
            reader, writer = await connect(server)
            started = time.monotonic()
            writer.write(sent)
            status, _, body = await read_response(reader)
            assert (status, json.loads(body)["error"]) == (408, why)
            assert time.monotonic() - started < 0.9  # not the whole request's 1 s
            assert await closed(reader)

    run(main())


def test_a_body_that_keeps_coming_is_held_to_the_whole_request_timeout(short_timeouts):
    async def main():
        async with serving() as server:
            reader, writer = await connect(server)
            writer.write(b"POST / HTTP/1.1\r\nContent-Length: 100\r\n\r\n")
            for _ in range(8):  # a byte every 0.15 s: never 0.3 s without one
                writer.write(b"x")
                await asyncio.sleep(0.15)
            status, _, body = await read_response(reader)
            assert (status, json.loads(body)["error"]) == (
                408, "the request did not arrive within 1 s")

    run(main())


def test_an_idle_connection_is_closed_after_the_keep_alive_timeout(short_timeouts):
    async def main():
        async with serving() as server:
            reader, writer = await connect(server)
            writer.write(b"GET / HTTP/1.1\r\n\r\n")
            assert (await read_response(reader))[0] == 200
            assert await closed(reader)
            assert not server.connections

    run(main())


def test_requests_pipelined_beyond_the_cap_are_all_answered_in_order():
    async def handle(request):
        await asyncio.sleep(0.001)
        return Response(200, request.path.encode())

    async def main():
        async with serving(handle, max_inflight=2) as server:
            reader, writer = await connect(server)
            writer.write(b"".join(b"GET /%d HTTP/1.1\r\n\r\n" % i for i in range(200)))
            answers = [await read_response(reader) for _ in range(200)]
            assert [(status, body) for status, _, body in answers] == [
                (200, b"/%d" % i) for i in range(200)]
            writer.close()
    run(main())


def test_pipelined_requests_wait_while_the_client_does_not_read():
    served = []

    async def handle(request):
        served.append(1)
        return Response(200, b"x" * (1 << 20))

    async def main():
        async with serving(handle, max_inflight=4) as server:
            reader, writer = await connect(server)
            writer.write(b"GET / HTTP/1.1\r\n\r\n" * 1000)
            await asyncio.sleep(1.0)
            # Socket buffers hold a few MiB at most: the answers stopped long before 1000.
            assert len(served) < 64, len(served)
            for _ in range(1000):
                assert (await read_response(reader))[0] == 200
            assert len(served) == 1000
            writer.close()
    run(main())


def test_stop_lets_requests_finish_within_the_grace_and_closes_connections():
    async def handle(request):
        await asyncio.sleep(float(request.body))
        return Response(200, b"done")

    async def main():
        server = HttpServer(handle, 1 << 20)
        await server.start("127.0.0.1", 0)
        idle_reader, _ = await connect(server)
        short_reader, short_writer = await connect(server)
        long_reader, long_writer = await connect(server)
        short_writer.write(post("/", b"0.2"))
        long_writer.write(post("/", b"60"))
        await asyncio.sleep(0.1)
        await server.stop(grace=1.0)
        status, headers, body = await read_response(short_reader)
        assert (status, body, headers["connection"]) == (200, b"done", "close")
        for reader in (idle_reader, short_reader, long_reader):
            assert await closed(reader)
        assert not server.connections
    run(main())


# -- any bytes ---------------------------------------------------------------------------------

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


# -- routing -----------------------------------------------------------------------------------

def test_routes_match_literals_names_and_patterns_in_the_order_added():
    router = Router()
    router.add("POST", "/v2/models/{model}/infer", "infer")
    router.add("POST", "/v2/models/{model}/versions/{version:[0-9]+}/infer", "infer_version")
    router.add("GET", "/v2/models/stats", "all_stats")
    router.add("GET", "/v2/models/{model}", "metadata")
    assert router.resolve("POST", "/v2/models/m/infer") == ("infer", {"model": "m"})
    assert router.resolve("POST", "/v2/models/m/versions/3/infer") == \
        ("infer_version", {"model": "m", "version": "3"})
    assert router.resolve("GET", "/v2/models/stats") == ("all_stats", {})
    assert router.resolve("GET", "/v2/models/a%20b") == ("metadata", {"model": "a b"})
    assert router.resolve("HEAD", "/v2/models/m") == ("metadata", {"model": "m"})
    with pytest.raises(NotFound):
        router.resolve("POST", "/v2/models/m/versions/x/infer")  # not a version number
    with pytest.raises(NotFound):
        router.resolve("GET", "/v2/models//infer")  # an empty name is no name
    with pytest.raises(MethodNotAllowed):
        router.resolve("DELETE", "/v2/models/m/infer")
    # Cached answers stay right, also after a route is added.
    assert router.resolve("POST", "/v2/models/m/infer") == ("infer", {"model": "m"})
    router.add("DELETE", "/v2/models/{model}/infer", "delete")
    assert router.resolve("DELETE", "/v2/models/m/infer") == ("delete", {"model": "m"})


def test_the_router_keeps_no_paths_that_match_nothing():
    router = Router()
    router.add("GET", "/v2/models/{model}", "metadata")
    for i in range(100):
        with pytest.raises(NotFound):
            router.resolve("GET", f"/nothing/{i}/" + "x" * 60_000)
        router.resolve("GET", f"/v2/models/{'m' * 5000}{i}")  # a match, but too long to keep
    assert router._cache == {}


def test_error_response_is_tritons_json_error():
    response = error_response(404, "Not Found")
    assert (response.status, json.loads(response.body)) == (404, {"error": "Not Found"})
    assert response.headers == {"Content-Type": "application/json"}


@pytest.mark.parametrize("chunks, status", [(http1_reader.MAX_CHUNKS, 200), (http1_reader.MAX_CHUNKS + 1, 400)])
def test_a_chunked_body_of_too_many_chunks_is_refused(chunks, status):
    async def handle(request):
        return Response(200, b"%d" % len(request.body))

    async def main():
        async with serving(handle) as server:
            reader, writer = await connect(server)
            writer.write(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                         + b"1\r\nx\r\n" * chunks + b"0\r\n\r\n")
            got, _, body = await read_response(reader)
            assert got == status
            if status == 200:
                assert body == b"%d" % chunks
            else:
                assert json.loads(body)["error"] == (
                    "Chunked request body exceeds maximum of 65536 non-empty chunks. Send "
                    "fewer or larger HTTP chunks.")
                assert await closed(reader)
            writer.close()
    run(main())
