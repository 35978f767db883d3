"""The Python backend (PythonModel) loading a model and calling it, with small model.py files
written into a temporary repository: initialize's arguments, the model imported as its version's
package, the load failures in the words of Triton's Python backend, execute's answers (a batch,
async execute, exceptions, malformed returns, error responses, request fields and parameters,
the frames of a model's exception) and finalize."""

import importlib
import json
import os
import re

import pytest

from tests.unit.workers.python_backend_helpers import (CONFIG, DOUBLE, assert_internal_error,
                                                       fp32_request, outputs_of, run)
from workers.backends import BackendError


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
