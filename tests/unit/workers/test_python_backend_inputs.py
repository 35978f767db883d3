"""The Python backend (PythonModel) handing a model its inputs, with small model.py files written
into a temporary repository: zero-copy views of the request's bytes, BYTES and BF16 round trips,
malformed inputs that fail only their own request, the inputs of a batch that lie in one block
(views of one array through pb_utils.batched_input, copies where they are not one run), and BYTES
in a client's region checked before anything is allocated."""

import importlib

import numpy as np
import pytest

from shmserve.ipc import datatypes
from tests.unit.workers.python_backend_helpers import (CONFIG, DOUBLE, fp32_request, outputs_of,
                                                       run)
from workers.backends.batch import Input, Request


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


# --- BYTES in a client's region ---------------------------------------------------------------


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
