"""The Python backend (PythonModel) with small model.py files written into a temporary repository."""

import importlib
import json
import os
import re
import textwrap
import time
import threading

import numpy as np
import pytest

from shmserve.ipc import datatypes
from workers.backends import BackendError, Context
from workers.backends.batch import Input, Request
from workers.backends.python import PythonModel

CONFIG = {
    "name": "m",
    "max_batch_size": 0,
    "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [-1]}],
    "output": [
        {"name": "OUT", "data_type": "TYPE_FP32", "dims": [-1]},
        {"name": "EXTRA", "data_type": "TYPE_INT32", "dims": [1]},
    ],
}

DOUBLE = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", x * 2),
                pb_utils.Tensor("EXTRA", np.array([len(x)], dtype=np.int32)),
            ]))
        return responses
"""


@pytest.fixture
def make_runner(tmp_path):
    runners = []

    def make(source, config=CONFIG, filename="model.py", files=None):
        model_dir = tmp_path / config["name"]
        (model_dir / "1").mkdir(parents=True)
        (model_dir / "1" / filename).write_text(textwrap.dedent(source))
        for name, text in (files or {}).items():
            (model_dir / "1" / name).write_text(textwrap.dedent(text))
        runner = PythonModel(Context(
            model_name=config["name"], model_version=1, model_dir=str(model_dir),
            model_config=config, instance_name=f"{config['name']}_0_0", instance_kind="CPU",
            device_id=0, model_repository=str(model_dir),
        ))
        runners.append(runner)
        return runner

    yield make
    for runner in runners:
        runner.finalize()


def fp32_request(values, request_id="r", outputs=("OUT", "EXTRA"), buffer=None, **kwargs):
    array = np.asarray(values, dtype=np.float32)
    data = array.tobytes() if buffer is None else buffer
    fields = dict(request_id=request_id, correlation_id=0, flags=0, parameters={},
                  inputs=[Input("IN", "FP32", list(array.shape), data)],
                  requested_output_names=list(outputs))
    fields.update(kwargs)
    return Request(**fields)


def run(runner, *requests):
    responses, timings = runner.execute(list(requests))
    assert len(responses) == len(requests)
    assert min(timings.compute_input_ns, timings.compute_infer_ns,
               timings.compute_output_ns) >= 0
    return responses


def outputs_of(response):
    assert response.error is None, response.error
    return {o.name: o for o in response.outputs}


def assert_internal_error(response, instance, text):
    assert response.outputs == []
    code, message = response.error
    assert code == "INTERNAL"
    assert message.startswith(
        f"Failed to process the request(s) for model instance '{instance}', message: ")
    assert text in message, message


# --- loading ----------------------------------------------------------------------------------


def test_initialize_gets_triton_args(make_runner, tmp_path):
    runner = make_runner("""
        seen = {}

        class TritonPythonModel:
            def initialize(self, args):
                seen.update(args)

            def execute(self, requests):
                return [None for _ in requests]
    """)
    runner.initialize()
    seen = importlib.import_module("1.model").seen
    assert set(seen) == {"model_config", "model_instance_kind", "model_instance_name",
                         "model_instance_device_id", "model_repository", "model_version",
                         "model_name"}
    assert all(isinstance(value, str) for value in seen.values())
    assert json.loads(seen["model_config"]) == CONFIG
    assert seen["model_instance_kind"] == "CPU" and seen["model_instance_name"] == "m_0_0"
    assert seen["model_instance_device_id"] == "0" and seen["model_version"] == "1"
    assert seen["model_name"] == "m" and seen["model_repository"] == str(tmp_path / "m")


def test_model_is_imported_as_version_package(make_runner, tmp_path):
    runner = make_runner("""
        import numpy as np
        import triton_python_backend_utils as pb_utils
        from .helper import FACTOR
        import helper

        class TritonPythonModel:
            def initialize(self, args):
                assert __name__ == "1.model"
                assert helper.FACTOR == FACTOR
                self.model_dir = pb_utils.get_model_dir()

            def execute(self, requests):
                return [pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", np.full(1, FACTOR, np.float32))]) for _ in requests]
    """, files={"helper.py": "FACTOR = 3\n"})
    runner.initialize()
    out = outputs_of(run(runner, fp32_request([0]))[0])
    assert out["OUT"].array.tolist() == [3.0]
    assert runner._model.model_dir == str(tmp_path / "m" / "1")


def test_default_model_filename(make_runner):
    config = dict(CONFIG, name="custom", default_model_filename="net.py")
    runner = make_runner(DOUBLE, config=config, filename="net.py")
    runner.initialize()
    assert outputs_of(run(runner, fp32_request([1]))[0])["OUT"].array.tolist() == [2.0]


# Load failures in the words of Triton's Python backend (perf/compat_probe.py compares them):
# the exception, then the stack where it was raised up to the loader, innermost first.
IMPORT_FRAMES = ("  <frozen importlib._bootstrap>({}): _call_with_frames_removed\n"
                 "  <frozen importlib._bootstrap_external>({}): exec_module\n"
                 "  <frozen importlib._bootstrap>({}): _load_unlocked\n"
                 "  <frozen importlib._bootstrap>({}): _find_and_load_unlocked\n"
                 "  <frozen importlib._bootstrap>({}): _find_and_load\n")


@pytest.mark.parametrize("source,message", [
    ("class Other:\n    pass\n",
     "AttributeError: module '1.model' has no attribute 'TritonPythonModel'"),
    ("raise ImportError('missing dependency')\n",
     "ImportError: missing dependency\n\nAt:\n  {path}(1): <module>\n" + IMPORT_FRAMES),
    ("def broken(:\n    pass\n", "SyntaxError: invalid syntax (model.py, line 1)"),
    ("class TritonPythonModel:\n    def initialize(self, args):\n        raise ValueError('bad')\n",
     "ValueError: bad\n\nAt:\n  {path}(3): initialize\n"),
])
def test_load_failures_raise_runner_error(make_runner, source, message):
    runner = make_runner(source)
    with pytest.raises(BackendError) as failed:
        runner.initialize()
    path = os.path.join(runner._model_dir, "1", "model.py")
    # The importer's line numbers belong to the Python version.
    got = re.sub(r"(<frozen [\w.]+>)\(\d+\)", r"\1({})", str(failed.value))
    assert got == message.replace("{path}", path)


def test_missing_model_file(make_runner):
    runner = make_runner(DOUBLE, config=dict(CONFIG, default_model_filename="absent.py"))
    with pytest.raises(BackendError, match="Python model file not found"):
        runner.initialize()


DECOUPLED = dict(CONFIG, model_transaction_policy={"decoupled": True})

# Sends IN[0] responses (0, 1, ...) for each request from a thread, after execute returned;
# IN[0] < 0 raises in execute, 0 sends the final flag alone.
STREAMER = """
import threading
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        threads = []
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            if n < 0:
                raise ValueError("negative count")
            threads.append(threading.Thread(target=self._stream, args=(request, n)))
        for t in threads:
            t.start()
        return None

    def _stream(self, request, n):
        sender = request.get_response_sender()
        for i in range(n):
            if sender.is_cancelled():
                break
            sender.send(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.array([i], dtype=np.float32)),
                pb_utils.Tensor("EXTRA", np.array([i], dtype=np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


class Collector:
    """respond(...) of several requests; wait() until each has its final response."""

    def __init__(self, count):
        self.responses = [[] for _ in range(count)]
        self.finals = [threading.Event() for _ in range(count)]

    def respond(self, index):
        def respond(response, final):
            self.responses[index].append(response)
            if final:
                self.finals[index].set()
        return respond

    def wait(self):
        for event in self.finals:
            assert event.wait(10)


def test_decoupled_model_answers_through_respond(make_runner):
    runner = make_runner(STREAMER, config=DECOUPLED)
    runner.initialize()
    got = Collector(3)
    requests = [fp32_request([n], f"r{n}", outputs=["OUT"], respond=got.respond(k))
                for k, n in enumerate((3, 0, 1))]
    responses, _ = runner.execute(requests)
    assert responses == []
    got.wait()
    values = [[None if r is None else outputs_of(r)["OUT"].array.tolist() for r in rs]
              for rs in got.responses]
    # The final flag arrives alone; EXTRA was not requested.
    assert values == [[[0.0], [1.0], [2.0], None], [None], [[0.0], None]]


def test_decoupled_execute_failure_ends_open_requests_with_the_error(make_runner):
    runner = make_runner(STREAMER, config=DECOUPLED)
    runner.initialize()
    got = Collector(2)
    requests = [fp32_request([2], "a", respond=got.respond(0)),
                fp32_request([-1], "b", respond=got.respond(1))]
    assert runner.execute(requests)[0] == []
    got.wait()
    for responses in got.responses:
        (last,) = responses
        assert last.error[0] == "INTERNAL" and "negative count" in last.error[1]


def test_decoupled_cancellation_reaches_the_sender(make_runner):
    runner = make_runner(STREAMER, config=DECOUPLED)
    runner.initialize()
    got = Collector(1)
    request = fp32_request([1000], respond=got.respond(0), is_cancelled=lambda: True)
    runner.execute([request])
    got.wait()
    assert got.responses[0] == [None]


def test_decoupled_model_must_return_none(make_runner):
    runner = make_runner(DOUBLE, config=DECOUPLED)
    runner.initialize()
    got = Collector(1)
    runner.execute([fp32_request([1], respond=got.respond(0))])
    got.wait()
    (only,) = got.responses[0]
    assert only.error[0] == "INTERNAL" and "must return None" in only.error[1]


# --- execute ----------------------------------------------------------------------------------


def test_batch_of_requests(make_runner):
    runner = make_runner(DOUBLE)
    runner.initialize()
    first, second = run(runner, fp32_request([1, 2], "a"), fp32_request([3], "b"))
    a = outputs_of(first)
    assert a["OUT"].datatype == "FP32" and a["OUT"].shape == [2]
    assert a["OUT"].array.tolist() == [2.0, 4.0]
    assert a["EXTRA"].datatype == "INT32" and a["EXTRA"].array.tolist() == [2]
    assert outputs_of(second)["OUT"].array.tolist() == [6.0]


def test_outputs_not_requested_are_dropped(make_runner):
    runner = make_runner(DOUBLE)
    runner.initialize()
    response = run(runner, fp32_request([1], outputs=["EXTRA"]))[0]
    assert [o.name for o in response.outputs] == ["EXTRA"]


def test_inputs_are_zero_copy_views(make_runner):
    runner = make_runner("""
        import triton_python_backend_utils as pb_utils
        seen = []

        class TritonPythonModel:
            def execute(self, requests):
                seen.extend(pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
                            for r in requests)
                return [pb_utils.InferenceResponse() for _ in requests]
    """)
    runner.initialize()
    buffer = bytearray(np.arange(6, dtype=np.float32).tobytes())
    run(runner, fp32_request(np.zeros((2, 3)), buffer=memoryview(buffer)))
    (array,) = importlib.import_module("1.model").seen
    assert array.shape == (2, 3) and array.dtype == np.float32
    assert np.shares_memory(array, np.frombuffer(buffer, dtype=np.uint8))
    buffer[0:4] = np.float32(9).tobytes()
    assert array[0, 0] == 9


def test_bytes_and_bf16_round_trip(make_runner):
    config = dict(CONFIG, input=[{"name": "S", "data_type": "TYPE_STRING", "dims": [-1]},
                                 {"name": "H", "data_type": "TYPE_BF16", "dims": [-1]}],
                  output=[{"name": "S_OUT", "data_type": "TYPE_STRING", "dims": [-1]},
                          {"name": "H_OUT", "data_type": "TYPE_BF16", "dims": [-1]}])
    runner = make_runner("""
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                responses = []
                for request in requests:
                    s = pb_utils.get_input_tensor_by_name(request, "S").as_numpy()
                    h = pb_utils.get_input_tensor_by_name(request, "H")
                    responses.append(pb_utils.InferenceResponse([
                        pb_utils.Tensor("S_OUT", s[::-1]),
                        pb_utils.Tensor.from_dlpack("H_OUT", h.to_dlpack()),
                    ]))
                return responses
    """, config=config)
    runner.initialize()
    bf16 = np.array([0x3F80, 0xC000], dtype=np.uint16)
    request = Request(
        request_id="", correlation_id=0, flags=0, parameters={},
        inputs=[Input("S", "BYTES", [2], datatypes.serialize_bytes([b"ab", b"c"])),
                Input("H", "BF16", [2], bf16.tobytes())],
        requested_output_names=["S_OUT", "H_OUT"])
    out = outputs_of(run(runner, request)[0])
    assert out["S_OUT"].datatype == "BYTES" and out["S_OUT"].array.dtype == np.object_
    assert out["S_OUT"].array.tolist() == [b"c", b"ab"]
    assert out["S_OUT"].array.flags.c_contiguous
    assert out["H_OUT"].datatype == "BF16" and out["H_OUT"].array.dtype == np.uint16
    assert out["H_OUT"].array.tolist() == bf16.tolist()


@pytest.mark.parametrize("nbytes", [7, 12])  # two FP32 are 8 bytes: too few, and too many
def test_malformed_input_fails_only_its_request(make_runner, nbytes):
    runner = make_runner(DOUBLE)
    runner.initialize()
    bad = fp32_request([1, 2], "bad", buffer=b"\x00" * nbytes)
    bad_response, good_response = run(runner, bad, fp32_request([5], "good"))
    assert bad_response.error[0] == "INVALID_ARG" and "'IN'" in bad_response.error[1]
    assert "does not match its bytes" in bad_response.error[1]
    assert outputs_of(good_response)["OUT"].array.tolist() == [10.0]


def test_async_execute(make_runner):
    runner = make_runner("""
        import asyncio
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            async def execute(self, requests):
                await asyncio.sleep(0)
                self.loop = asyncio.get_running_loop()
                return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.ones(1, np.float32))])
                        for _ in requests]
    """)
    runner.initialize()
    assert outputs_of(run(runner, fp32_request([0]))[0])["OUT"].array.tolist() == [1.0]
    first_loop = runner._model.loop
    run(runner, fp32_request([0]))
    assert runner._model.loop is first_loop  # one loop for the life of the instance


def test_exception_fails_every_request_of_the_batch(make_runner):
    runner = make_runner("""
        class TritonPythonModel:
            def execute(self, requests):
                raise RuntimeError("kaput")
    """)
    runner.initialize()
    for response in run(runner, fp32_request([1], "a"), fp32_request([2], "b")):
        assert_internal_error(response, "m_0_0", "RuntimeError: kaput")


@pytest.mark.parametrize("returned,text", [
    ("(pb_utils.InferenceResponse(),)", "Expected a list in the execute return"),
    ("[]", "InferenceRequest(s) size is:1, and InferenceResponse(s) size is:0"),
    ("['oops']", "Expected an 'InferenceResponse' object"),
])
def test_malformed_return_fails_the_batch(make_runner, returned, text):
    runner = make_runner(f"""
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                return {returned}
    """)
    runner.initialize()
    assert_internal_error(run(runner, fp32_request([1]))[0], "m_0_0", text)


def test_none_entry_is_an_error_for_that_request(make_runner):
    runner = make_runner("""
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                return [None, pb_utils.InferenceResponse()]
    """)
    runner.initialize()
    none_response, ok = run(runner, fp32_request([1], "a"), fp32_request([2], "b"))
    assert_internal_error(none_response, "m_0_0", "execute returned None for request 'a'")
    assert ok.error is None and ok.outputs == []


def test_error_response_carries_code_and_message(make_runner):
    runner = make_runner("""
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                return [pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("bad value", pb_utils.TritonError.INVALID_ARG),
                    parameters={"hint": "positive"}) for _ in requests]
    """)
    runner.initialize()
    response = run(runner, fp32_request([1]))[0]
    assert response.error == ("INVALID_ARG", "bad value") and response.outputs == []
    assert response.parameters == {"hint": "positive"}


def test_parameters_and_request_fields_reach_the_model(make_runner):
    runner = make_runner("""
        import json
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                responses = []
                for request in requests:
                    params = json.loads(request.parameters())
                    responses.append(pb_utils.InferenceResponse(parameters={
                        "echo": params["text"], "count": params["n"],
                        "id": request.request_id(), "corr": str(request.correlation_id()),
                        "flags": request.flags()}))
                return responses
    """)
    runner.initialize()
    request = fp32_request([1], "req-9", parameters={"text": "hi", "n": 4},
                           correlation_id="seq-1", flags=3)
    response = run(runner, request)[0]
    assert response.parameters == {"echo": "hi", "count": 4, "id": "req-9", "corr": "seq-1",
                                   "flags": 3}


def test_response_through_sender_for_non_decoupled_model(make_runner):
    runner = make_runner("""
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                for request in requests:
                    sender = request.get_response_sender()
                    out = pb_utils.Tensor("OUT", np.full(1, 5, np.float32))
                    if request.request_id() == "split":
                        sender.send(pb_utils.InferenceResponse([out]))
                        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    else:
                        sender.send(pb_utils.InferenceResponse([out]),
                                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return None
    """)
    runner.initialize()
    for response in run(runner, fp32_request([0], "one"), fp32_request([0], "split")):
        assert outputs_of(response)["OUT"].array.tolist() == [5.0]


@pytest.mark.parametrize("body,text", [
    ("sender.send(flags=FINAL)", "cannot send complete final before sending a response"),
])
def test_sender_misuse_fails_the_batch(make_runner, body, text):
    runner = make_runner(f"""
        import triton_python_backend_utils as pb_utils
        FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

        class TritonPythonModel:
            def execute(self, requests):
                sender = requests[0].get_response_sender()
                r = pb_utils.InferenceResponse()
                {body}
    """)
    runner.initialize()
    assert_internal_error(run(runner, fp32_request([0]))[0], "m_0_0", text)


@pytest.mark.parametrize("misuse,text", [
    ("sender.send(r, flags=FINAL); return [r]", "Response sender has been closed"),
    ("sender.send(r); sender.send(r)", "cannot send more than one response"),
])
def test_a_sent_response_survives_a_later_failure(make_runner, caplog, misuse, text):
    """A response was delivered: sending another, or returning it again, fails execute; the
    failure is logged and the client still gets the response, as in Triton."""
    runner = make_runner(f"""
        import numpy as np
        import triton_python_backend_utils as pb_utils
        FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

        class TritonPythonModel:
            def execute(self, requests):
                r = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.ones(1, np.float32))])
                sender = requests[0].get_response_sender()
                {misuse}
    """)
    runner.initialize()
    with caplog.at_level("ERROR"):
        response = run(runner, fp32_request([0], "x"))[0]
    assert outputs_of(response)["OUT"].array.tolist() == [1.0]
    assert text in caplog.text


def test_response_without_final_is_an_error(make_runner):
    runner = make_runner("""
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                requests[0].get_response_sender().send(pb_utils.InferenceResponse())
    """)
    runner.initialize()
    assert_internal_error(run(runner, fp32_request([0], "x"))[0], "m_0_0",
                          "without TRITONSERVER_RESPONSE_COMPLETE_FINAL")


@pytest.mark.parametrize("later", [
    # from a thread, the response with FINAL
    "threading.Thread(target=lambda: (time.sleep(0.2), sender.send(r, flags=FINAL))).start()",
    # the response now, FINAL from a thread
    "sender.send(r); threading.Timer(0.2, sender.send, kwargs={'flags': FINAL}).start()",
    # kept by the model alone (in self), answered from another thread
    "self.kept.append(sender); threading.Timer(0.2, self.answer_kept, args=(r,)).start()",
])
def test_a_response_sent_after_execute_returned_is_awaited(make_runner, later):
    """Triton lets a model that is not decoupled return None for a request and answer it
    later, from another thread."""
    runner = make_runner(f"""
        import threading, time
        import numpy as np
        import triton_python_backend_utils as pb_utils
        FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

        class TritonPythonModel:
            def initialize(self, args):
                self.kept = []

            def answer_kept(self, r):
                self.kept.pop().send(r, flags=FINAL)

            def execute(self, requests):
                answers = []
                for request in requests:
                    if request.request_id() == "now":
                        answers.append(pb_utils.InferenceResponse(
                            [pb_utils.Tensor("OUT", np.zeros(1, np.float32))]))
                        continue
                    r = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.ones(1, np.float32))])
                    sender = request.get_response_sender()
                    {later}
                    answers.append(None)
                return answers
    """)
    runner.initialize()
    late, now = run(runner, fp32_request([0], "late"), fp32_request([0], "now"))
    assert outputs_of(late)["OUT"].array.tolist() == [1.0]
    assert outputs_of(now)["OUT"].array.tolist() == [0.0]


def test_a_request_the_model_dropped_unanswered_is_not_awaited(make_runner):
    """Nothing can answer it any more (Triton would never answer it): it fails at once."""
    runner = make_runner("""
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                self.cycle = None
                holder = {"request": requests[0]}
                holder["self"] = holder  # only a cycle holds it once execute returns
                return [None]
    """)
    runner.initialize()
    started = time.monotonic()
    response = run(runner, fp32_request([0], "x"))[0]
    assert_internal_error(response, "m_0_0", "execute returned None for request 'x'")
    assert time.monotonic() - started < 5


def test_finalize_is_called(make_runner, tmp_path):
    marker = tmp_path / "finalized"
    runner = make_runner(f"""
        class TritonPythonModel:
            def execute(self, requests):
                return []

            async def finalize(self):
                open({str(marker)!r}, "w").close()
    """)
    runner.initialize()
    runner.finalize()
    assert marker.exists()


# --- inputs in one block ----------------------------------------------------------------------

BATCHED = dict(CONFIG, max_batch_size=8)

# Keeps what the model saw: each request's IN, and batched_input over all and all but the first.
BATCH_VIEWER = """
import triton_python_backend_utils as pb_utils
seen = {}

class TritonPythonModel:
    def execute(self, requests):
        seen["each"] = [pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() for r in requests]
        seen["whole"] = pb_utils.batched_input(requests, "IN")
        seen["tail"] = pb_utils.batched_input(requests[1:], "IN")
        return [pb_utils.InferenceResponse() for _ in requests]
"""


def block_requests(tensors, gaps=None):
    """One request per (datatype, shape, bytes) in `tensors`, whose input IN is a slice of one
    block where the tensors lie back to back, with gaps[k] spare bytes before the k-th."""
    gaps = gaps or [0] * len(tensors)
    block = memoryview(bytearray(sum(gaps) + sum(len(data) for _, _, data in tensors)))
    requests = []
    offset = 0
    for k, ((datatype, shape, data), gap) in enumerate(zip(tensors, gaps)):
        offset += gap
        block[offset:offset + len(data)] = data
        tensor = Input("IN", datatype, list(shape), block[offset:offset + len(data)])
        requests.append(Request(f"r{k}", 0, 0, {}, [tensor], ["OUT"]))
        offset += len(data)
    return block, requests


def fp32(array):
    array = np.asarray(array, dtype=np.float32)
    return "FP32", array.shape, array.tobytes()


def seen_by(runner, requests):
    for response in run(runner, *requests):
        assert response.error is None, response.error
    return importlib.import_module("1.model").seen


def test_adjacent_inputs_of_a_batch_are_views_of_one_array(make_runner):
    runner = make_runner(BATCH_VIEWER, config=BATCHED)
    runner.initialize()
    arrays = [np.full((1, 3), 1.0), np.arange(6).reshape(2, 3), np.full((1, 3), 7.0)]
    block, requests = block_requests([fp32(a) for a in arrays])
    seen = seen_by(runner, requests)
    whole = seen["whole"]
    assert whole.shape == (4, 3) and whole.dtype == np.float32
    np.testing.assert_array_equal(whole, np.concatenate(arrays))
    assert np.shares_memory(whole, np.frombuffer(block, np.uint8))
    for array, each in zip(arrays, seen["each"]):
        assert each.shape == array.shape and np.shares_memory(each, whole)
    np.testing.assert_array_equal(seen["tail"], whole[1:])
    assert np.shares_memory(seen["tail"], whole)
    block[0:4] = np.float32(-1).tobytes()  # views, not copies
    assert whole[0, 0] == seen["each"][0][0, 0] == -1


@pytest.mark.parametrize("tensors,gaps,config", [
    ([fp32([[1, 2]]), fp32([[3, 4]]), fp32([[5, 6], [7, 8]])], [0, 8, 0], BATCHED),
    ([fp32([[1, 2]]), ("INT32", [1, 2], np.array([[3, 4]], np.int32).tobytes()),
      fp32([[5, 6], [7, 8]])], None, BATCHED),
], ids=["gap", "datatype"])
def test_inputs_that_are_not_one_run_are_copied(make_runner, tensors, gaps, config):
    runner = make_runner(BATCH_VIEWER, config=config)
    runner.initialize()
    block, requests = block_requests(tensors, gaps)
    seen = seen_by(runner, requests)
    np.testing.assert_array_equal(seen["whole"], [[1, 2], [3, 4], [5, 6], [7, 8]])
    assert not np.shares_memory(seen["whole"], np.frombuffer(block, np.uint8))
    for (_, shape, data), each in zip(tensors, seen["each"]):
        assert list(each.shape) == list(shape) and each.tobytes() == data
        assert np.shares_memory(each, np.frombuffer(block, np.uint8))


def test_rows_of_another_shape_end_a_run(make_runner):
    runner = make_runner("""
        import numpy as np
        import triton_python_backend_utils as pb_utils
        seen = {}

        class TritonPythonModel:
            def execute(self, requests):
                seen["each"] = [pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
                                for r in requests]
                seen["head"] = pb_utils.batched_input(requests[:2], "IN")
                try:
                    pb_utils.batched_input(requests, "IN")
                except pb_utils.TritonModelException as exc:
                    seen["error"] = str(exc)
                return [pb_utils.InferenceResponse() for _ in requests]
    """, config=BATCHED)
    runner.initialize()
    arrays = [np.ones((1, 2)), np.zeros((2, 2)), np.arange(3).reshape(1, 3)]
    block, requests = block_requests([fp32(a) for a in arrays])
    seen = seen_by(runner, requests)
    for array, each in zip(arrays, seen["each"]):
        np.testing.assert_array_equal(each, array)
    assert not np.shares_memory(seen["each"][2], seen["head"])
    assert np.shares_memory(seen["each"][0], seen["head"])
    assert "cannot batch input 'IN'" in seen["error"]


def test_malformed_input_in_a_block_fails_only_its_request(make_runner):
    runner = make_runner(DOUBLE, config=BATCHED)
    runner.initialize()
    _, requests = block_requests([fp32([[1]]), ("FP32", [1, 1], b"\x00" * 7), fp32([[5]])])
    good, bad, other = run(runner, *requests)
    assert bad.error[0] == "INVALID_ARG" and "'IN'" in bad.error[1]
    assert outputs_of(good)["OUT"].array.tolist() == [[2.0]]
    assert outputs_of(other)["OUT"].array.tolist() == [[10.0]]


def test_bytes_inputs_in_a_block(make_runner):
    runner = make_runner(BATCH_VIEWER, config=BATCHED)
    runner.initialize()
    values = [[[b"a", b"bc"]], [[b"", b"x"], [b"def", b"g"]]]
    _, requests = block_requests(
        [("BYTES", np.shape(v), datatypes.serialize_bytes(np.ravel(v))) for v in values])
    seen = seen_by(runner, requests)
    assert [each.tolist() for each in seen["each"]] == values
    assert seen["whole"].dtype == np.object_ and seen["whole"].tolist() == values[0] + values[1]
    assert seen["tail"].tolist() == values[1]


def test_a_models_exception_is_described_with_its_frames_innermost_first(make_runner):
    # Its frames up to the runner that called execute, none of ours: pb_utils raising for a
    # misuse counts as the model's line that called it (it is C++ in Triton).
    runner = make_runner("""
        import triton_python_backend_utils as pb_utils

        def inner(request):
            pb_utils.Tensor("", [1.0])

        class TritonPythonModel:
            def execute(self, requests):
                inner(requests[0])
        """)
    runner.initialize()
    response = run(runner, fp32_request([1]))[0]
    path = os.path.join(runner._model_dir, "1", "model.py")
    assert response.error[1].endswith(
        "message: TritonModelException: Tensor name cannot be an empty string.\n\nAt:\n"
        f"  {path}(5): inner\n  {path}(9): execute\n")


ECHO_BYTES = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]) for r in requests]
"""
BYTES_CONFIG = {"name": "s", "max_batch_size": 0,
                "input": [{"name": "IN", "data_type": "TYPE_STRING", "dims": [-1]}],
                "output": [{"name": "OUT", "data_type": "TYPE_STRING", "dims": [-1]}]}


def _region_bytes_request(raw: bytes, count: int, request_id="q"):
    # `origin` set: the bytes are a view of a client's region, which only the worker reads.
    return Request(request_id=request_id, correlation_id=0, flags=0, parameters={},
                         inputs=[Input("IN", "BYTES", [count], memoryview(raw), [1, 0, len(raw)])],
                         requested_output_names=["OUT"])


@pytest.mark.parametrize("raw, count, message", [
    (datatypes.serialize_bytes([b"ab", b"c"]), 3,
     "[request id: q] expected 3 string elements for inference input 'IN' for model 's', got 2"),
    (datatypes.serialize_bytes([b"ab"]) + b"\x01", 2,
     "[request id: q] incomplete string length indicator for inference input 'IN' for model 's', "
     "expecting 4 bytes but only 1 bytes available. Please make sure the string length indicator "
     "is in one buffer."),
    ((9).to_bytes(4, "little") + b"ab", 1,
     "incomplete string data for inference input 'IN', expecting string of length 9 but only 2 "
     "bytes available"),
    # A shape that claims far more elements than the bytes hold: refused, nothing allocated.
    (datatypes.serialize_bytes([b"a"]), 10**12,
     "[request id: q] expected 1000000000000 string elements for inference input 'IN' for model "
     "'s', got 1"),
])
def test_bytes_in_a_region_are_checked_before_anything_is_allocated(make_runner, raw, count, message):
    runner = make_runner(ECHO_BYTES, BYTES_CONFIG)
    runner.initialize()
    (response,) = run(runner, _region_bytes_request(raw, count))
    assert response.error == ("INVALID_ARG", message)
    good = datatypes.serialize_bytes([b"ab", b"c"])
    (response,) = run(runner, _region_bytes_request(good, 2))
    assert list(outputs_of(response)["OUT"].array) == [b"ab", b"c"]
