"""What the streaming tests share (test_streaming.py, test_streaming_http_and_cancel.py): the
models they wait for, inputs for the bundled repeat and square models and stream_probe, a
gRPC stream reader, the probe's record file, metrics and statistics."""

import queue
import threading
import time
import urllib.request

import httpx
import numpy as np
import tritonclient.grpc as grpcclient


MODELS = ("repeat", "square", "stream_probe", "slow", "identity_fp32", "stream_order")
WAIT_S = 10.0  # the most any single response or state change may take


def grpc_input(name: str, array: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), _DATATYPES[array.dtype.type])
    tensor.set_data_from_numpy(array)
    return tensor


_DATATYPES = {np.int32: "INT32", np.uint32: "UINT32", np.float32: "FP32"}


def repeat_inputs(values, delay_ms=None) -> list:
    inputs = [grpc_input("IN", np.array(values, dtype=np.int32))]
    if delay_ms is not None:
        inputs.append(grpc_input("DELAY", np.full(len(values), delay_ms, dtype=np.uint32)))
    return inputs


def square_inputs(n: int) -> list:
    return [grpc_input("IN", np.array([n], dtype=np.int32))]


def probe_inputs(count: int, size: int = None) -> list:
    inputs = [grpc_input("COUNT", np.array([count], dtype=np.int32))]
    if size is not None:
        inputs.append(grpc_input("SIZE", np.array([size], dtype=np.int32)))
    return inputs


def is_final(result) -> bool:
    return result.get_response().parameters["triton_final_response"].bool_param


class GrpcStream:
    """One tritonclient ModelStreamInfer call; its callback queues each (result, error), then
    waits for `gate` (if given) to open: until then the client reads nothing more."""

    def __init__(self, server, headers=None, gate: threading.Event = None):
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.items: queue.Queue = queue.Queue()
        self._gate = gate
        self.client.start_stream(callback=self._callback, headers=headers)

    def _callback(self, result, error):
        self.items.put((result, error))
        if self._gate is not None:
            self._gate.wait()

    def send(self, model: str, inputs: list, request_id: str = "", **options) -> None:
        self.client.async_stream_infer(model, inputs, request_id=request_id, **options)

    def get(self):
        try:
            return self.items.get(timeout=WAIT_S)
        except queue.Empty:
            raise AssertionError(f"no response on the stream within {WAIT_S} s") from None

    def results(self, n: int) -> list:
        """The next n items, which must all be results."""
        out = []
        for _ in range(n):
            result, error = self.get()
            assert error is None, error
            out.append(result)
        return out

    def finish(self) -> list:
        """Close our side and wait until the server has answered every request and ended the
        call: what arrived until then."""
        closer = threading.Thread(target=self.client.stop_stream)
        closer.start()
        closer.join(WAIT_S)
        if closer.is_alive():
            self.client.stop_stream(cancel_requests=True)
            closer.join()
            raise AssertionError(f"the server did not end the stream within {WAIT_S} s")
        return self.drain()

    def drain(self) -> list:
        out = []
        while not self.items.empty():
            out.append(self.items.get_nowait())
        return out

    def close(self) -> None:
        if self._gate is not None:
            self._gate.set()
        self.client.stop_stream(cancel_requests=True)
        self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_record(path: str):
    """(what, k) from a stream_probe record file; None before the model wrote it."""
    try:
        with open(path) as f:
            what, k = f.read().split()
    except FileNotFoundError:
        return None
    return what, int(k)


def wait_record(path: str, what: str, within: float):
    deadline = time.monotonic() + within
    while True:
        record = read_record(path)
        if record is not None and record[0] == what:
            return record
        if time.monotonic() > deadline:
            raise AssertionError(f"the model's record is {record}, not '{what}', after {within} s")
        time.sleep(0.01)


def metric(server, name: str, model: str, **labels) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics",
                                timeout=5) as r:
        text = r.read().decode()
    wanted = [f'model="{model}"'] + [f'{k}="{v}"' for k, v in labels.items()]
    for line in text.splitlines():
        if line.startswith(name + "{") and all(w in line for w in wanted):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} for {model} {labels}")


def settled(read):
    """What `read()` gives once it has stopped moving. A stream's request is counted once its
    batch has ended, which may be just after its last response reached the client: a count
    read right after a test's (or an earlier test's) answer can still change."""
    value, deadline = read(), time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        time.sleep(0.05)
        again = read()
        if again == value:
            return value
        value = again
    raise AssertionError(f"still moving after {WAIT_S} s: {value}")


def success_counts(server, model: str) -> tuple:
    """(inference_count, success count) from the statistics extension."""
    stats = httpx.get(f"http://{server.http_url}/v2/models/{model}/stats").json()
    entry = stats["model_stats"][0]
    return entry["inference_count"], entry["inference_stats"]["success"]["count"]


def http_url(server, model: str, endpoint: str) -> str:
    return f"http://{server.http_url}/v2/models/{model}/{endpoint}"


# -- gRPC stream: responses of decoupled models ------------------------------------------------
