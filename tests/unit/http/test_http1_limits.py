"""What an HTTP/1.1 server refuses, on real sockets with hand-written requests: malformed
requests, an upgrade with a body, an unsupported transfer coding and a target that is not a
path (each answered, then the connection closed); the limits on a request's body, head,
trailer and number of chunks; and the timeouts (shmserve/http/http1_reader.py) on headers,
body, the whole request and an idle keep-alive connection.
"""

import asyncio
import json
import time

import pytest

from shmserve.http import http1, http1_reader
from shmserve.http.http1_messages import Response
from tests.unit.http.http1_helpers import closed, connect, post, read_response, run, serving


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


def test_an_upgrade_request_with_a_body_is_refused_not_run_without_it():
    assert_refused(post("/load", b"{}", "Connection: Upgrade\r\nUpgrade: h2c\r\n"), 400, "upgrade")


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


def test_a_target_that_is_not_a_path_gets_400_and_the_connection_closes():
    assert_refused(b"CONNECT x:80 HTTP/1.1\r\nHost: x\r\n\r\n", 400,
                   "the request target 'x:80' is not a path")


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
