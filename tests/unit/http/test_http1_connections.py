"""HTTP/1.1 connections (shmserve/http/http1_connection.py) on real sockets with hand-written
requests: keep-alive, pipelined requests served one at a time and answered in request order
(beyond the in-flight cap and while the client does not read), connections that do not keep
alive or that a request closes, a handler that raises, a client that leaves, streamed answers,
and stopping the server within its grace. One ordering case needs a turn of the event loop that
sockets cannot time, and drives a connection through a recording transport.
"""

import asyncio
import json
import re

import pytest

from shmserve.http.http1 import HttpServer
from shmserve.http.http1_connection import Connection
from shmserve.http.http1_messages import Response
from tests.unit.http.http1_helpers import (WAIT_S, closed, connect, post, read_response, run,
                                           serving)


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
