"""The forms an HTTP/1.1 request may take, on real sockets with hand-written requests: chunked
bodies (and trailers that are not headers), Expect: 100-continue (answered before the body is
sent, behind the answers before it, never to HTTP/1.0), HEAD, an upgrade request answered
plainly, an absolute-form target; and the router (shmserve/http/routing.py) that maps a
request's method and path to its handler, with Triton's JSON error answer.
"""

import asyncio
import json

import pytest

from shmserve.http.http1_messages import Response, error_response
from shmserve.http.routing import MethodNotAllowed, NotFound, Router
from tests.unit.http.http1_helpers import (WAIT_S, closed, connect, echo, read_response, run,
                                           serving)


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


def test_an_upgrade_request_is_answered_plainly_then_the_connection_closes():
    async def main():
        async with serving() as server:
            reader, writer = await connect(server)
            writer.write(b"GET / HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
                         b"\x81\x00")
            assert (await read_response(reader))[0] == 200
            assert await closed(reader)
    run(main())


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
