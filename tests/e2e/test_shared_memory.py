"""The system and CUDA shared-memory extensions, over HTTP and gRPC, with tritonclient's own
shared-memory helpers: registration, status, inference through regions, Triton's errors, and
proofs that tensors go from the client's memory to the model and back without a copy."""

import base64
import itertools
import os
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import orjson
import posix_ipc
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from tests.conftest import start_server, stop_server, wait_for_models
from tests.e2e.test_dynamic_batching import pending_requests
from tests.e2e.test_infer import SAMPLES

CLIENTS = {"http": httpclient, "grpc": grpcclient}
_keys = itertools.count()


class Regions:
    """Client shared-memory objects made through tritonclient; all destroyed at the end."""

    def __init__(self):
        self.handles = []

    def make(self, size: int):
        key = f"/shmtest_{os.getpid()}_{next(_keys)}"
        handle = shm.create_shared_memory_region(key.strip("/"), key, size)
        self.handles.append(handle)
        return key, handle

    def destroy(self):
        for handle in self.handles:
            shm.destroy_shared_memory_region(handle)


@pytest.fixture
def regions(clients):
    made = Regions()
    yield made
    clients["http"].unregister_system_shared_memory()
    made.destroy()


def _error(fn, *args, **kwargs) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        fn(*args, **kwargs)
    return info.value


def _status(exc: InferenceServerException) -> str:
    return exc.status().replace("StatusCode.", "")


def _names(status, protocol):
    if protocol == "http":
        return [r["name"] for r in status]
    return sorted(status.regions)


def _mapped_by(pids, key: str) -> list:
    """Which of `pids` map the shared-memory object `key` now."""
    path = "/dev/shm/" + key.lstrip("/")
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                if any(line.rstrip().endswith(path) for line in f):
                    out.append(pid)
        except OSError:
            pass
    return out


# ---------------------------------------------------------------- registration


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_register_status_unregister(clients, regions, protocol):
    c = clients[protocol]
    key, _ = regions.make(8192)
    c.register_system_shared_memory("zeta", key, 4096, offset=4096)
    c.register_system_shared_memory("alpha", key, 64)
    if protocol == "http":
        assert c.get_system_shared_memory_status() == [
            {"name": "alpha", "key": key, "offset": 0, "byte_size": 64},
            {"name": "zeta", "key": key, "offset": 4096, "byte_size": 4096}]
        assert c.get_system_shared_memory_status("zeta") == [
            {"name": "zeta", "key": key, "offset": 4096, "byte_size": 4096}]
    else:
        status = c.get_system_shared_memory_status().regions
        assert (status["zeta"].key, status["zeta"].offset, status["zeta"].byte_size) == (
            key, 4096, 4096)
        assert list(c.get_system_shared_memory_status("alpha").regions) == ["alpha"]
    other = clients["grpc" if protocol == "http" else "http"]
    assert _names(other.get_system_shared_memory_status(), other is clients["http"] and "http"
                  or "grpc") == ["alpha", "zeta"]
    c.unregister_system_shared_memory("alpha")
    c.unregister_system_shared_memory("never-registered")  # not an error, as in Triton
    assert _names(c.get_system_shared_memory_status(), protocol) == ["zeta"]
    c.unregister_system_shared_memory()
    assert _names(c.get_system_shared_memory_status(), protocol) == []


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_register_errors(clients, regions, protocol, server):
    c = clients[protocol]
    key, _ = regions.make(4096)
    c.register_system_shared_memory("taken", key, 64)
    exc = _error(c.register_system_shared_memory, "taken", key, 64)
    assert (_status(exc), exc.message()) == (
        "400" if protocol == "http" else "ALREADY_EXISTS",
        "shared memory region 'taken' already in manager")
    exc = _error(c.register_system_shared_memory, "nokey", "/shmtest_no_such_key", 64)
    # Triton answers 500 / INTERNAL: it is the client's mistake.
    assert _status(exc) == ("404" if protocol == "http" else "NOT_FOUND")
    assert exc.message().startswith("Unable to open shared memory region: '/shmtest_no_such_key'")
    for bad_key in ("/../../etc/passwd", "/.."):
        exc = _error(c.register_system_shared_memory, "badkey", bad_key, 64)
        assert _status(exc) == ("400" if protocol == "http" else "INVALID_ARGUMENT"), bad_key
        assert exc.message().startswith(f"Unable to open shared memory region: '{bad_key}'")
    for bad_key in ("", "//"):  # Triton 2.73's words
        exc = _error(c.register_system_shared_memory, "badkey", bad_key, 64)
        assert _status(exc) == ("400" if protocol == "http" else "INVALID_ARGUMENT"), bad_key
        assert exc.message() == f"cannot register shared memory region 'badkey' - invalid shm key '{bad_key}'"
    for size, offset in ((4097, 0), (64, 4090)):
        exc = _error(c.register_system_shared_memory, "big", key, size, offset=offset)
        assert _status(exc) == ("400" if protocol == "http" else "INVALID_ARGUMENT")
        assert exc.message().startswith("failed to register shared memory region 'big': "
                                        "invalid args")
    # the server's own segments are not the client's to register
    own = sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"shmserve.{server.process.pid}."))
    exc = _error(c.register_system_shared_memory, "own", "/" + own[0], 64)
    assert "names a segment of the server itself" in exc.message()
    assert _names(c.get_system_shared_memory_status(), protocol) == ["taken"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_status_of_unknown_regions(clients, protocol):
    c = clients[protocol]
    exc = _error(c.get_system_shared_memory_status, "nope")
    assert (_status(exc), exc.message()) == (
        "404" if protocol == "http" else "NOT_FOUND",
        "Unable to find system shared memory region: 'nope'")
    exc = _error(c.get_cuda_shared_memory_status, "nope")
    assert exc.message() == "Unable to find cuda shared memory region: 'nope'"


def test_http_register_bodies_are_checked(server):
    base = f"http://{server.http_url}/v2/systemsharedmemory"
    for path, body, message in (
            ("/region/r/register", {"byte_size": 64},
             "Shared memory register request has no 'key' field"),
            ("/region/r/register", {"key": "/k"},
             "Shared memory register request has no 'byte_size' field"),
            ("/region/r/register", {"key": "/k", "byte_size": "64"}, "Unable to parse 'byte_size'"),
            ("/register", {"key": "/k", "byte_size": 64},
             "'region name' is necessary to register system shared memory region")):
        request = urllib.request.Request(base + path, data=orjson.dumps(body), method="POST")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=10)
        assert info.value.code == 400
        assert orjson.loads(info.value.read()) == {"error": message}


# ---------------------------------------------------------------- inference


def _wire(datatype: str, array: np.ndarray) -> bytes:
    if datatype == "BYTES":
        return serialize_byte_tensor(array).item()
    return array.tobytes()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_every_datatype_round_trips_through_regions(clients, regions, protocol):
    """All inputs of echo_all in one region and all outputs in another, at offsets."""
    mod = CLIENTS[protocol]
    wires = {t: _wire(t, a) for t, a in SAMPLES.items()}
    total = sum(len(w) + 8 for w in wires.values())
    in_key, in_handle = regions.make(total)
    out_key, out_handle = regions.make(total + 4096)
    c = clients[protocol]
    c.register_system_shared_memory("ins", in_key, total)
    c.register_system_shared_memory("outs", out_key, total, offset=4096)
    inputs, outputs, where = [], [], {}
    offset = 0
    for datatype, wire in wires.items():
        shm.set_shared_memory_region(in_handle, [np.frombuffer(wire, np.uint8)], offset=offset)
        tensor = mod.InferInput(f"IN_{datatype}", list(SAMPLES[datatype].shape), datatype)
        tensor.set_shared_memory("ins", len(wire), offset=offset)
        inputs.append(tensor)
        requested = mod.InferRequestedOutput(f"OUT_{datatype}")
        requested.set_shared_memory("outs", len(wire) + 8, offset=offset)
        outputs.append(requested)
        where[datatype] = offset
        offset += len(wire) + 8
    result = c.infer("echo_all", inputs, outputs=outputs)
    for datatype, wire in wires.items():
        meta = result.get_output(f"OUT_{datatype}")
        shape = list(meta["shape"] if protocol == "http" else meta.shape)
        assert shape == list(SAMPLES[datatype].shape)
        start = 4096 + where[datatype]
        assert bytes(out_handle._mpsm_handle.buf[start:start + len(wire)]) == wire, datatype
        if protocol == "http":  # metadata only: no tensor bytes came back on the wire
            assert set(meta) == {"name", "datatype", "shape"}
    if protocol == "grpc":
        assert all(raw == b"" for raw in result.get_response().raw_output_contents)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_model_works_in_the_client_memory(clients, regions, protocol):
    """shm_inplace negates its input where it lies: the client sees its own region change,
    which only happens if the model was handed the client's memory, not a copy."""
    mod = CLIENTS[protocol]
    data = np.arange(1, 9, dtype=np.float32)
    in_key, in_handle = regions.make(data.nbytes)
    out_key, out_handle = regions.make(data.nbytes)
    shm.set_shared_memory_region(in_handle, [data])
    c = clients[protocol]
    c.register_system_shared_memory("in", in_key, data.nbytes)
    c.register_system_shared_memory("out", out_key, data.nbytes)
    tensor = mod.InferInput("INPUT0", [8], "FP32")
    tensor.set_shared_memory("in", data.nbytes)
    out = mod.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory("out", data.nbytes)
    result = c.infer("shm_inplace", [tensor], outputs=[out, mod.InferRequestedOutput("WRITABLE")])
    assert result.as_numpy("WRITABLE")[0]
    assert np.array_equal(shm.get_contents_as_numpy(in_handle, np.float32, [8]), -data)
    assert np.array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [8]), -data)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_model_passes_an_input_in_a_region_on_to_another_by_reference(server, clients,
                                                                        regions, protocol):
    """bls_probe hands its INPUT0, which lies in the client's region, to shm_inplace by BLS;
    shm_inplace negates it where it lies: the client sees its own region change, so the
    second model too was handed the client's memory."""
    wait_for_models(server, ("bls_probe", "shm_inplace"))
    mod = CLIENTS[protocol]
    data = np.arange(1, 20001, dtype=np.float32)  # 80 kB: above what travels inline
    key, handle = regions.make(data.nbytes)
    shm.set_shared_memory_region(handle, [data])
    c = clients[protocol]
    c.register_system_shared_memory("in", key, data.nbytes)
    mode = mod.InferInput("MODE", [1], "BYTES")
    mode.set_data_from_numpy(np.array([b"forward"], np.object_))
    tensor = mod.InferInput("INPUT0", [data.size], "FP32")
    tensor.set_shared_memory("in", data.nbytes)
    result = c.infer("bls_probe", [mode, tensor])
    assert np.array_equal(result.as_numpy("OUTPUT0"), -data)
    assert np.array_equal(shm.get_contents_as_numpy(handle, np.float32, [data.size]), -data)


def test_outputs_in_a_region_send_no_bytes_over_http(server, clients, regions):
    key, handle = regions.make(64)
    clients["http"].register_system_shared_memory("out", key, 64)
    data = np.arange(16, dtype=np.float32)
    body = orjson.dumps({
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16],
                    "data": data.tolist()}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_region": "out",
                                                       "shared_memory_byte_size": 64}}],
        "parameters": {"binary_data_output": True}})
    request = urllib.request.Request(f"http://{server.http_url}/v2/models/identity_fp32/infer",
                                     data=body, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers.get("Inference-Header-Content-Length") is None
        answer = orjson.loads(response.read())
    assert answer["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 16]}]
    assert np.array_equal(shm.get_contents_as_numpy(handle, np.float32, [16]), data)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inference_errors(clients, regions, protocol):
    mod = CLIENTS[protocol]
    c = clients[protocol]
    key, _ = regions.make(4096)
    c.register_system_shared_memory("in", key, 4096)
    c.register_system_shared_memory("small", key, 8)

    def infer(region, byte_size, offset=0, out=None):
        tensor = mod.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_shared_memory(region, byte_size, offset=offset)
        outputs = None
        if out is not None:
            outputs = [mod.InferRequestedOutput("OUTPUT0")]
            outputs[0].set_shared_memory(*out)
        return _error(c.infer, "identity_fp32", [tensor], outputs=outputs)

    bad, missing = ("400", "404") if protocol == "http" else ("INVALID_ARGUMENT", "NOT_FOUND")
    cases = [
        (infer("nope", 16), missing, "Unable to find shared memory region: 'nope'"),
        (infer("in", 16, offset=4096), bad, "Invalid offset for shared memory region: 'in'"),
        (infer("in", 16, offset=4090), bad,
         "Invalid offset + byte size for shared memory region: 'in'"),
        (infer("in", 12), bad, "[request id: <id_unknown>] input byte size mismatch for input "
                               "'INPUT0' for model 'identity_fp32'. Expected 16, got 12"),
        (infer("in", 16, out=("small", 8)), "500" if protocol == "http" else "INTERNAL",
         "shared memory size specified with the request for output 'OUTPUT0' (8 bytes) should "
         "be at least 16 bytes to hold the results"),
    ]
    for exc, status, message in cases:
        assert (_status(exc), exc.message()) == (status, message)
    # the server kept serving
    tensor = mod.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_shared_memory("in", 16)
    assert c.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0").shape == (1, 4)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bytes_in_a_region_that_miss_their_shape_get_tritons_message(clients, regions, protocol):
    mod = CLIENTS[protocol]
    c = clients[protocol]
    key, handle = regions.make(64)
    good = np.array([b"ab", b"c"], np.object_)
    shm.set_shared_memory_region(handle, [serialize_byte_tensor(good)])
    c.register_system_shared_memory("str", key, 64)

    def infer(count, byte_size):
        tensor = mod.InferInput("IN_BYTES", [count], "BYTES")
        tensor.set_shared_memory("str", byte_size)
        return c.infer("echo_all", [tensor])

    with pytest.raises(InferenceServerException) as e:
        infer(3, 11)
    assert e.value.message() == ("[request id: <id_unknown>] expected 3 string elements for "
                                 "inference input 'IN_BYTES' for model 'echo_all', got 2")
    with pytest.raises(InferenceServerException) as e:
        infer(1, 5)  # the first element's 2 bytes cut to 1
    assert e.value.message() == ("incomplete string data for inference input 'IN_BYTES', "
                                 "expecting string of length 2 but only 1 bytes available")
    assert list(infer(2, 11).as_numpy("OUT_BYTES")) == [b"ab", b"c"]


def test_a_region_whose_object_was_replaced_is_refused(clients, regions):
    c = clients["grpc"]
    key, handle = regions.make(64)
    c.register_system_shared_memory("r", key, 64)
    posix_ipc.unlink_shared_memory(key)
    again = posix_ipc.SharedMemory(key, posix_ipc.O_CREX, mode=0o600, size=64)
    again.close_fd()
    try:
        tensor = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        tensor.set_shared_memory("r", 64)
        exc = _error(c.infer, "identity_fp32", [tensor])
        assert _status(exc) == "INVALID_ARGUMENT"
        assert "removed (and maybe replaced) after the region was registered" in exc.message()
    finally:
        c.unregister_system_shared_memory("r")
        posix_ipc.unlink_shared_memory(key)
        handle._mpsm_handle = _Recreated(handle._mpsm_handle)


class _Recreated:
    """Stands in for a handle whose object the test already unlinked, so the fixture's
    destroy only closes it."""

    def __init__(self, inner):
        self._inner = inner
        self.buf = inner.buf
        self.name = inner.name

    def close(self):
        self.buf = None
        self._inner.close()

    def unlink(self):
        pass


# ---------------------------------------------------------------- lifetime of mappings


def test_unregister_waits_for_requests_in_flight_and_unmaps(server, clients, regions):
    """`slow` sleeps INPUT0[0] seconds; its region is unregistered meanwhile. The request
    still succeeds; the region is listed until it ends (as Triton since 2.53) and then gone
    without another unregister, and no process maps the object."""
    c = clients["grpc"]
    key, handle = regions.make(4)
    shm.set_shared_memory_region(handle, [np.array([0.6], np.float32)])
    c.register_system_shared_memory("slow_in", key, 4)
    tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_shared_memory("slow_in", 4)
    results = []
    caller = threading.Thread(target=lambda: results.append(c.infer("slow", [tensor])))
    caller.start()
    deadline = time.monotonic() + 5
    while not _mapped_by(server.workers(), key) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _mapped_by(server.workers(), key), "no worker mapped the region"
    c.unregister_system_shared_memory("slow_in")
    assert list(c.get_system_shared_memory_status().regions) == ["slow_in"]
    caller.join(10)
    assert results and results[0].as_numpy("OUTPUT0").tolist() == [pytest.approx(0.6)]
    assert list(c.get_system_shared_memory_status().regions) == []
    deadline = time.monotonic() + 5
    while _mapped_by(server.workers(), key) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _mapped_by(server.workers(), key) == []


@pytest.fixture(scope="module")
def small_repository(tmp_path_factory) -> str:
    repo = tmp_path_factory.mktemp("shm_repo")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.symlink(os.path.join(root, "model_repository", "identity_fp32"), repo / "identity_fp32")
    return str(repo)


@pytest.fixture(scope="module")
def closed_server(small_repository, tmp_path_factory):
    srv = start_server(small_repository, str(tmp_path_factory.mktemp("noshm") / "log"),
                       "--allow-client-shm=false")  # the default, as Triton's since 2.68
    yield srv
    stop_server(srv)


def test_client_shared_memory_is_off_unless_allowed(closed_server, regions):
    """Triton 2.68's: registering and unregistering are UNSUPPORTED (HTTP 501, gRPC
    UNIMPLEMENTED) with its text; the status lists nothing."""
    key, _ = regions.make(64)
    text = ("Client shared memory is disabled. Start the server with '--allow-client-shm=true' "
            "to enable.")
    for mod, url, status in ((httpclient, closed_server.http_url, "501"),
                             (grpcclient, closed_server.grpc_url, "UNIMPLEMENTED")):
        c = mod.InferenceServerClient(url)
        try:
            for call in (lambda c=c: c.register_system_shared_memory("r", key, 64),
                         lambda c=c: c.register_cuda_shared_memory(
                             "g", base64.b64encode(bytes(64)), 0, 64),
                         lambda c=c: c.unregister_system_shared_memory("r"),
                         lambda c=c: c.unregister_cuda_shared_memory()):
                exc = _error(call)
                assert (_status(exc), exc.message()) == (status, text)
            assert _names(c.get_system_shared_memory_status(),
                          "http" if mod is httpclient else "grpc") == []
        finally:
            c.close()


def test_server_stop_leaves_no_mapping(small_repository, tmp_path_factory, regions):
    srv = start_server(small_repository, str(tmp_path_factory.mktemp("stop") / "log"))
    key, _ = regions.make(64)
    c = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        c.register_system_shared_memory("r", key, 64)
        tensor = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        tensor.set_shared_memory("r", 64)
        c.infer("identity_fp32", [tensor])
        workers = srv.workers()
        assert _mapped_by(workers, key)
    finally:
        c.close()
        stop_server(srv)  # the client never unregistered
    assert _mapped_by(workers | {srv.process.pid}, key) == []
    assert os.path.exists("/dev/shm/" + key.lstrip("/")), "the server removed a client's object"


# ---------------------------------------------------------------- CUDA


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_cuda_registration_checks(clients, protocol):
    c = clients[protocol]
    exc = _error(c.register_cuda_shared_memory, "g", base64.b64encode(bytes(64)), 99, 64)
    assert _status(exc) == ("400" if protocol == "http" else "INVALID_ARGUMENT")
    assert exc.message().startswith("failed to register shared memory region: invalid args")
    if protocol == "http":
        exc = _error(c.register_cuda_shared_memory, "g", base64.b64encode(bytes(10)), 0, 64)
        assert exc.message() == "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"
    assert _names(c.get_cuda_shared_memory_status(), protocol) == []
    c.unregister_cuda_shared_memory()


def test_a_decoupled_model_streams_into_a_region(server, clients, regions):
    """Each of repeat's responses writes OUT into the client's region and carries only its
    metadata; the last one written is what the region holds after the stream."""
    key, handle = regions.make(4)
    clients["grpc"].register_system_shared_memory("out", key, 4)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results = []
    try:
        client.start_stream(callback=lambda result, error: results.append(error or result))
        tensor = grpcclient.InferInput("IN", [3], "INT32")
        tensor.set_data_from_numpy(np.array([7, 8, 9], np.int32))
        out = grpcclient.InferRequestedOutput("OUT")
        out.set_shared_memory("out", 4)
        client.async_stream_infer("repeat", [tensor], outputs=[out, grpcclient.InferRequestedOutput("IDX")])
        client.stop_stream()
    finally:
        client.close()
    assert [r.as_numpy("IDX").tolist() for r in results] == [[0], [1], [2]]
    for r in results:
        response = r.get_response()
        assert [o.name for o in response.outputs] == ["OUT", "IDX"]
        assert response.raw_output_contents[0] == b""
    assert shm.get_contents_as_numpy(handle, np.int32, [1]).tolist() == [9]


def test_requests_queued_in_the_batcher_keep_an_unregistered_region(server, clients, regions,
                                                                     tmp_path):
    """batch_recorder runs one batch at a time: a first request holds it (until a gate file
    exists) while three more, reading their inputs from a region, wait behind it: one already
    sent to the instance (a worker takes the next batch while it runs one), two in the queue.
    The region (which the holder reads too) is unregistered meanwhile; they still run on the
    right data, and then nothing maps the region any more."""
    c = clients["grpc"]
    key, handle = regions.make(3 * 16)
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    shm.set_shared_memory_region(handle, [data])
    c.register_system_shared_memory("queued", key, 3 * 16)
    gate = str(tmp_path / "gate")
    results = []  # (index, result)

    def send(index):
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_shared_memory("queued", 16, offset=16 * index)
        results.append((index, c.infer("batch_recorder", [tensor],
                                       parameters={"hold_until": gate})))

    holder = threading.Thread(target=send, args=(0,))
    holder.start()
    deadline = time.monotonic() + 10
    # the worker maps the region just before the holder's batch reaches it
    while not _mapped_by(server.workers(), key) and time.monotonic() < deadline:
        time.sleep(0.02)
    queued = [threading.Thread(target=send, args=(i,)) for i in range(3)]
    # One at a time: requests arriving together would batch, and fill the slots differently.
    queued[0].start()
    time.sleep(0.3)  # it takes the instance's second slot at once
    for waiting, t in enumerate(queued[1:], start=1):
        t.start()
        while pending_requests(server, "batch_recorder") < waiting and time.monotonic() < deadline:
            time.sleep(0.02)
    assert pending_requests(server, "batch_recorder") == 2
    c.unregister_system_shared_memory("queued")
    open(gate, "w").close()
    for t in [holder, *queued]:
        t.join(20)
    assert sorted(i for i, _ in results) == [0, 0, 1, 2]
    for i, result in results:
        assert result.as_numpy("OUTPUT0").tolist() == [data[i].tolist()]
    deadline = time.monotonic() + 5
    while _mapped_by(server.workers(), key) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _mapped_by(server.workers(), key) == []
