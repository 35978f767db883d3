"""A real server fed generated malformed requests over HTTP and gRPC: every answer is a
well-formed error (or a correct result), and afterwards it still serves and no worker died."""

import gzip
import http.client
import mmap
import os
from types import SimpleNamespace

import grpc
import numpy as np
import orjson
import posix_ipc
import pytest
import tritonclient.http as httpclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shmserve import proto
from shmserve.config.normalize import normalize_config
from shmserve.config.parse import read_model_config
from shmserve.signature import ModelSignature
from tests.conftest import ROOT
from tests.unit.fuzz.fuzz_helpers import JSON, REGION_BYTES, grpc_messages, http_bodies
from tests.unit.fuzz.test_fuzz_infer_requests import near_valid_grpc, near_valid_http

MODELS = ["identity_fp32", "add_sub", "string_echo"]


def _model(name: str):
    config = read_model_config(os.path.join(ROOT, "model_repository", name))
    config = normalize_config(config, name, 0)
    return SimpleNamespace(name=name, signature=ModelSignature.from_config(config))


SIGNATURES = {name: _model(name) for name in MODELS}
INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"

E2E = settings(max_examples=80, deadline=None, database=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def target(server):
    """An HTTP connection, a raw-bytes ModelInfer callable and the client region "fuzz" (an
    mmap) of the session's server; afterwards, its workers must be the ones it had before
    and it must still serve."""
    workers = server.workers()
    assert workers
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    channel = grpc.insecure_channel(server.grpc_url)
    # No serializers: the bytes go as they are.
    infer = channel.unary_unary(INFER_METHOD)
    # The region "fuzz" that near-valid requests name.
    key = f"/fuzz_server_{os.getpid()}"
    shm = posix_ipc.SharedMemory(key, posix_ipc.O_CREX, mode=0o600, size=REGION_BYTES)
    region = mmap.mmap(shm.fd, REGION_BYTES)
    shm.close_fd()
    try:
        status, body = post(conn, "/v2/systemsharedmemory/region/fuzz/register", orjson.dumps(
            {"key": key, "offset": 0, "byte_size": REGION_BYTES}), {})
        assert status == 200, body
        yield SimpleNamespace(conn=conn, infer=infer, region=region)
        post(conn, "/v2/systemsharedmemory/region/fuzz/unregister", b"", {})
    finally:
        region.close()
        posix_ipc.unlink_shared_memory(key)
        conn.close()
        channel.close()
    assert server.workers() == workers, f"a worker died or was replaced:\n{server.log()[-6000:]}"
    a = np.arange(4, dtype=np.float32)
    with httpclient.InferenceServerClient(server.http_url) as client:
        inputs = [httpclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(a)
        result = client.infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)


def post(conn, path: str, body: bytes, headers: dict):
    conn.request("POST", path, body=body, headers=headers)
    response = conn.getresponse()
    return response.status, response.read()


def assert_http_answer(status: int, body: bytes) -> None:
    if status == 200:
        return
    assert 400 <= status < 600
    error = orjson.loads(body)["error"]
    assert type(error) is str and error


@E2E
@given(http_bodies(), st.sampled_from(MODELS), st.integers(0, 9))
def test_http_malformed_infer(target, case, model, encoding):
    conn = target.conn
    body, header = case
    headers = {"Content-Type": "application/octet-stream"}
    if header is not None:
        headers["Inference-Header-Content-Length"] = str(header)
    if encoding == 0:  # compressed, or claiming to be
        body = gzip.compress(body)[:len(body)]
        headers["Content-Encoding"] = "gzip"
    assert_http_answer(*post(conn, f"/v2/models/{model}/infer", body, headers))


@E2E
@given(st.sampled_from(MODELS).flatmap(lambda name: st.tuples(
    st.just(name), near_valid_http(SIGNATURES[name]), near_valid_grpc(SIGNATURES[name]))))
def test_near_valid_requests(target, case):
    """Valid requests with one thing wrong, or none: those must succeed."""
    model, (mutation, (body, header), placed), (grpc_mutation, request, grpc_placed) = case
    headers = {} if header is None else {"Inference-Header-Content-Length": str(header)}
    fill_region(target.region, placed)
    status, answer = post(target.conn, f"/v2/models/{model}/infer", body, headers)
    assert status == 200 or mutation != "none", answer
    assert_http_answer(status, answer)
    fill_region(target.region, grpc_placed)
    assert_grpc_answer(target.infer, request, must_succeed=grpc_mutation == "none")


def fill_region(region, placed: dict) -> None:
    for placement in placed.values():
        if type(placement) is tuple:
            offset, data = placement
            region[offset:offset + len(data)] = data


@E2E
@given(st.one_of(JSON, st.dictionaries(st.sampled_from(["INPUT0", "id", "parameters", "p"]),
                                       JSON, max_size=3)),
       st.sampled_from(MODELS + ["nope"]), st.sampled_from(["generate", "generate_stream"]))
def test_http_malformed_generate(target, doc, model, route):
    conn = target.conn
    status, body = post(conn, f"/v2/models/{model}/{route}", orjson.dumps(doc), {})
    if status == 200 and route == "generate_stream":
        # Events only; a failure after the first one is an error event.
        for event in body.split(b"\n\n")[:-1]:
            assert event.startswith(b"data: ")
            orjson.loads(event[6:])
        return
    assert_http_answer(status, body)


@E2E
@given(st.one_of(JSON, st.fixed_dictionaries({}, optional={
    "key": st.one_of(st.text(max_size=300), JSON), "offset": JSON,
    "byte_size": st.one_of(st.integers(-1, 2**64 - 1), JSON)})), st.text(
        "abc/._", max_size=5))
def test_http_malformed_shared_memory_register(target, doc, name):
    conn = target.conn
    status, body = post(conn, f"/v2/systemsharedmemory/region/{name or 'r'}/register",
                        orjson.dumps(doc), {})
    assert status != 200, "no such object exists to be registered"
    assert_http_answer(status, body)


def assert_grpc_answer(infer, request: bytes, must_succeed: bool = False) -> None:
    try:
        answer = infer(request, timeout=10)
    except grpc.RpcError as exc:
        assert not must_succeed, exc.details()
        # UNKNOWN is what an exception the servicer did not expect becomes.
        assert exc.code() not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED), (
            exc.code(), exc.details())
        assert exc.details()
        return
    proto.ModelInferResponse.FromString(answer)


@E2E
@given(grpc_messages(), st.sampled_from(MODELS))
def test_grpc_malformed_messages(target, msg, model):
    infer = target.infer
    msg.model_name = model
    assert_grpc_answer(infer, msg.SerializeToString())


@E2E
@given(st.binary(max_size=120), st.booleans())
def test_grpc_random_bytes(target, junk, large):
    """Large requests take the server's own splitter of raw_input_contents."""
    infer = target.infer
    head = proto.ModelInferRequest(model_name="identity_fp32").SerializeToString()
    padding = b"\x3a\x80\x80\x04" + bytes(65536) if large else b""
    assert_grpc_answer(infer, head + junk + padding)
