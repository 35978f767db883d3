"""What the HTTP/1.1 test modules (test_http1_*.py) share: a server on a real socket
(`serving`, with `echo`, a handler that answers with what it saw of the request), connecting to
it, hand-written requests (`post`) and reading the answers (`read_response`, `closed`), each
within WAIT_S."""

import asyncio
import contextlib
import json

from shmserve.http.http1 import HttpServer
from shmserve.http.http1_messages import Response

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
