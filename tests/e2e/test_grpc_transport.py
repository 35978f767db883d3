"""gRPC as clients speak it, beyond the inference service's own behaviour: deadlines,
compression, cancellation, unknown methods, status messages outside ASCII, flow control for
messages larger than a window, many calls on one connection, keepalive pings."""

import asyncio
import socket
import threading
import time
import urllib.parse

import grpc
import h2.config
import h2.connection
import h2.events
import hpack
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from tests.conftest import start_server, stop_server
from tests.e2e.streaming_helpers import metric


def _add_sub_inputs(a, b):
    inputs = []
    for name, arr in (("INPUT0", a), ("INPUT1", b)):
        t = grpcclient.InferInput(name, list(arr.shape), "FP32")
        t.set_data_from_numpy(arr)
        inputs.append(t)
    return inputs


def _slow_input(seconds: float):
    t = grpcclient.InferInput("INPUT0", [1], "FP32")
    t.set_data_from_numpy(np.array([seconds], np.float32))
    return [t]


def _assert_add_sub(client, **kw):
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 2.0, np.float32)
    r = client.infer("add_sub", _add_sub_inputs(a, b), **kw)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_are_served(clients, algorithm):
    _assert_add_sub(clients["grpc"], compression_algorithm=algorithm)


def test_a_call_past_its_deadline_ends_with_deadline_exceeded(server, clients):
    client = clients["grpc"]
    with pytest.raises(InferenceServerException) as e:
        client.infer("slow", _slow_input(1.0), client_timeout=0.2)
    assert e.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    _assert_add_sub(client)


def test_the_server_enforces_the_deadline_itself(server):
    """A raw channel with a deadline but no client-side timer would wait forever for a server
    that ignored grpc-timeout; the server's answer arrives well before the 1 s sleep ends."""
    request = _raw_request("slow", 1.0)
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as e:
            call(request, timeout=0.2)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - started < 0.9


def _raw_request(model: str, seconds: float) -> bytes:
    from tritonclient.grpc import service_pb2
    req = service_pb2.ModelInferRequest(model_name=model)
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[1])
    req.raw_input_contents.append(np.array([seconds], np.float32).tobytes())
    return req.SerializeToString()


def test_an_unknown_method_is_unimplemented(server):
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/NoSuchMethod")
        with pytest.raises(grpc.RpcError) as e:
            call(b"", timeout=10)
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_status_messages_keep_characters_outside_ascii(clients):
    name = "modèle_100%_✓"
    with pytest.raises(InferenceServerException) as e:
        clients["grpc"].infer(name, _slow_input(0.0))
    assert e.value.status() == "StatusCode.NOT_FOUND"
    assert name in e.value.message()


def test_messages_larger_than_a_flow_control_window_travel_both_ways(clients):
    data = np.random.default_rng(7).random((1, 9 * 1024 * 1024), dtype=np.float32)  # 36 MiB
    t = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
    t.set_data_from_numpy(data)
    r = clients["grpc"].infer("identity_fp32", [t])
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), data)


def test_hundreds_of_calls_share_one_connection(server):
    async def main():
        async with grpcaio.InferenceServerClient(server.grpc_url) as client:
            values = [np.full(4, i, np.float32) for i in range(300)]
            results = await asyncio.gather(*(
                client.infer("add_sub", _add_sub_inputs(v, v)) for v in values))
            for v, r in zip(values, results):
                np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), v * 2)
    asyncio.run(main())


def test_a_cancelled_call_is_cancelled_on_the_server(server):
    """Calls to 'slow' fill both instances and the batch each holds queued behind (see
    dispatch/pool.py), so one more cannot finish soon; cancelling it reaches the server,
    which counts it as CANCELED."""
    before = metric(server, "nv_inference_request_failure", "slow", reason="CANCELED")

    async def main():
        async with grpcaio.InferenceServerClient(server.grpc_url) as client:
            busy = [asyncio.ensure_future(client.infer("slow", _slow_input(0.8)))
                    for _ in range(4)]
            await asyncio.sleep(0.3)
            queued = asyncio.ensure_future(client.infer("slow", _slow_input(0.0)))
            await asyncio.sleep(0.3)
            assert not queued.done()
            queued.cancel()
            await asyncio.gather(*busy)
    asyncio.run(main())
    deadline = time.monotonic() + 5
    while (metric(server, "nv_inference_request_failure", "slow", reason="CANCELED") < before + 1
           and time.monotonic() < deadline):
        time.sleep(0.05)
    assert metric(server, "nv_inference_request_failure", "slow", reason="CANCELED") == before + 1


def test_keepalive_pings_are_answered(server):
    options = grpcclient.KeepAliveOptions(keepalive_time_ms=100, keepalive_timeout_ms=2000,
                                          keepalive_permit_without_calls=True,
                                          http2_max_pings_without_data=0)
    with grpcclient.InferenceServerClient(server.grpc_url, keepalive_options=options) as client:
        _assert_add_sub(client)
        time.sleep(1.0)  # pings go out while idle; unanswered ones would close the channel
        _assert_add_sub(client)


def test_a_client_answers_the_servers_keepalive_pings(test_repository, tmp_path):
    """grpcio's client acknowledges our PINGs: with a PING every 100 ms and 500 ms to answer,
    an idle connection stays up, and a socket that never answers is closed."""
    server = start_server(test_repository, str(tmp_path / "s.log"),
                          "--model-control-mode=explicit", "--load-model=add_sub",
                          "--grpc-keepalive-time=100", "--grpc-keepalive-timeout=500",
                          "--grpc-keepalive-permit-without-calls=true",
                          wait_models=("add_sub",))
    try:
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            _assert_add_sub(client)
            time.sleep(1.0)
            _assert_add_sub(client)
        with socket.create_connection(("127.0.0.1", server.grpc_port), timeout=5) as sock:
            h2_client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
            h2_client.initiate_connection()
            sock.sendall(h2_client.data_to_send())  # then never reads or answers
            deadline = time.monotonic() + 5
            closed = False
            while time.monotonic() < deadline and not closed:
                closed = sock.recv(65536) == b""
            assert closed
    finally:
        stop_server(server)


def test_tritonclient_reads_compressed_responses(test_repository, tmp_path):
    """--grpc-infer-response-compression-level: grpcio's client accepts gzip and deflate, so
    its answers come compressed (tests/unit/grpc/test_grpc_transport_calls.py looks at the bytes),
    and read as before, unary and streamed."""
    server = start_server(test_repository, str(tmp_path / "s.log"),
                          "--model-control-mode=explicit", "--load-model=add_sub",
                          "--load-model=repeat", "--grpc-infer-response-compression-level=high",
                          wait_models=("add_sub", "repeat"))
    try:
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            _assert_add_sub(client)
            assert client.get_model_metadata("add_sub").name == "add_sub"
            answers = []
            client.start_stream(callback=lambda result, error: answers.append((result, error)))
            values = np.arange(40, dtype=np.int32)
            tensor = grpcclient.InferInput("IN", [40], "INT32")
            tensor.set_data_from_numpy(values)
            client.async_stream_infer("repeat", [tensor])
            client.stop_stream()
        assert [error for _, error in answers] == [None] * 40
        assert [int(result.as_numpy("OUT")[0]) for result, _ in answers] == values.tolist()
    finally:
        stop_server(server)


def test_calls_from_many_threads_at_once(clients):
    errors = []

    def worker():
        try:
            for _ in range(20):
                _assert_add_sub(clients["grpc"])
        except Exception as exc:  # reported below, with the others
            errors.append(exc)
    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# Below, a raw HTTP/2 client (h2) sends what no gRPC library would.
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


def _raw_calls(server, bodies, path: str = MODEL_INFER, extra_headers=(),
               content_type: str = "application/grpc") -> list:
    """Calls made one after another on one connection: each one's response headers and
    trailers, merged, as {name: value} (str)."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True,
                                                                header_encoding="utf-8"))
    conn.initiate_connection()
    answers = []
    with socket.create_connection(("127.0.0.1", server.grpc_port), timeout=10) as sock:

        def receive(sid, answer) -> bool:
            """Reads once; True when stream `sid` has ended."""
            data = sock.recv(1 << 20)
            assert data, "the server closed the connection without answering"
            ended = False
            for event in conn.receive_data(data):
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    answer.update(event.headers)
                if (isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset))
                        and event.stream_id == sid):
                    ended = True
            sock.sendall(conn.data_to_send())
            return ended

        for body in bodies:
            sid = conn.get_next_available_stream_id()
            answer = {}
            conn.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":path", path),
                                    (":authority", "localhost"), ("content-type", content_type),
                                    ("te", "trailers"), *extra_headers])
            view = memoryview(body)
            ended = False
            while view and not ended:
                size = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size,
                           len(view))
                if size == 0:  # waits for the server to give credit back
                    ended = receive(sid, answer)
                    continue
                conn.send_data(sid, view[:size].tobytes())
                view = view[size:]
                sock.sendall(conn.data_to_send())
            if not ended:
                conn.end_stream(sid)
                sock.sendall(conn.data_to_send())
            while not ended:
                ended = receive(sid, answer)
            answers.append(answer)
    return answers


def _raw_call(server, body: bytes, **kw) -> dict:
    return _raw_calls(server, [body], **kw)[0]


def _framed(message: bytes, compressed: int = 0, length: int | None = None) -> bytes:
    return bytes([compressed]) + (len(message) if length is None else length).to_bytes(4, "big") \
        + message


@pytest.mark.parametrize("body, headers, status, fragment", [
    # A header claiming 4 GiB: refused from the 5 bytes alone, nothing allocated.
    (_framed(b"", length=2**32 - 1), (), "8", "larger than max"),
    # The client's mistakes are INVALID_ARGUMENT (3), never INTERNAL.
    (_framed(b"abc", length=10), (), "3", "inside a message"),
    (_framed(b"x", compressed=1), (), "3", "without grpc-encoding"),
    (_framed(b"x", compressed=1), (("grpc-encoding", "gzip"),), "3", "decompress"),
    (_framed(b""), (("grpc-encoding", "br"),), "12", "'br' not supported"),
    (_framed(b""), (("grpc-timeout", "soon"),), "3", "grpc-timeout"),
    (_framed(b"") * 2, (), "12", "exactly one request message"),
    (_framed(b"\xff\xff\xff"), (), "3", "failed to parse the ModelInferRequest"),
])
def test_malformed_grpc_calls_get_a_status_and_the_server_goes_on(server, clients, body,
                                                                   headers, status, fragment):
    answer = _raw_call(server, body, extra_headers=headers)
    assert answer.get("grpc-status") == status, answer
    assert fragment in urllib.parse.unquote(answer.get("grpc-message", "")), answer
    _assert_add_sub(clients["grpc"])


@pytest.mark.parametrize("method", ["SystemSharedMemoryRegister", "RepositoryModelLoad",
                                    "ModelMetadata"])
def test_a_message_that_does_not_parse_is_the_clients_mistake(server, clients, method):
    answer = _raw_call(server, _framed(b"\xff\xff\xff"),
                       path=f"/inference.GRPCInferenceService/{method}")
    assert answer.get("grpc-status") == "3", answer  # INVALID_ARGUMENT (Triton: INTERNAL)
    assert "cannot parse the request message" in urllib.parse.unquote(answer["grpc-message"])
    _assert_add_sub(clients["grpc"])


def test_refused_calls_give_their_flow_control_credit_back(server, clients):
    """80 MiB of messages that are refused unread, on one connection: more than its 64 MiB
    window, so credit kept for them would stall the connection before the last call."""
    # Two messages for a unary call, each one unknown field of 1 MiB (a ModelInferRequest
    # could hold that; zeros could not, and would be refused before their end).
    field = b"\x7a" + bytes([0x80, 0x80, 0x40]) + b"\0" * (1 << 20)
    refused = _framed(field) * 2
    answers = _raw_calls(server, [refused] * 40 + [_framed(b"\xff")])
    assert [a.get("grpc-status") for a in answers] == ["12"] * 40 + ["3"]
    _assert_add_sub(clients["grpc"])


def test_a_request_that_is_not_grpc_gets_415(server, clients):
    answer = _raw_call(server, b"{}", content_type="application/json")
    assert answer[":status"] == "415"
    _assert_add_sub(clients["grpc"])


def test_garbage_after_the_preface_closes_only_that_connection(server, clients):
    rng = np.random.default_rng(3)
    for size in (1, 9, 100, 5000):
        with socket.create_connection(("127.0.0.1", server.grpc_port), timeout=10) as sock:
            sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + rng.bytes(size))
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass  # the server's GOAWAY, then the end of the connection
    _assert_add_sub(clients["grpc"])


def test_a_call_in_flight_is_answered_after_the_clients_goaway(server):
    """A client closing its connection (GOAWAY) still gets the answers it is owed; then the
    server closes the connection."""
    from tritonclient.grpc import service_pb2
    request = service_pb2.ModelInferRequest(model_name="slow")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1])
    request.raw_input_contents.append(np.array([0.3], np.float32).tobytes())
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True,
                                                                header_encoding="utf-8"))
    conn.initiate_connection()
    conn.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":path", MODEL_INFER),
                          (":authority", "localhost"), ("content-type", "application/grpc"),
                          ("te", "trailers")])
    conn.send_data(1, _framed(request.SerializeToString()), end_stream=True)
    conn.close_connection()
    received = bytearray()
    with socket.create_connection(("127.0.0.1", server.grpc_port), timeout=10) as sock:
        sock.sendall(conn.data_to_send())
        while data := sock.recv(1 << 20):
            received += data
    # h2 reads nothing once it has sent GOAWAY, so the answer is read by hand.
    decoder, answer, ended, pos = hpack.Decoder(), {}, False, 0
    while pos < len(received):
        length = int.from_bytes(received[pos:pos + 3], "big")
        ftype, flags = received[pos + 3], received[pos + 4]
        sid = int.from_bytes(received[pos + 5:pos + 9], "big")
        if ftype == 1:  # HEADERS
            answer.update(decoder.decode(bytes(received[pos + 9:pos + 9 + length])))
        ended = ended or (sid == 1 and ftype in (0, 1) and flags & 1)
        pos += 9 + length
    assert ended and answer.get("grpc-status") == "0", answer
