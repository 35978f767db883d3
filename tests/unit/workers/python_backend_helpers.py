"""What the test_python_backend_* modules share: the model config CONFIG and the model DOUBLE
most of them load, an FP32 request, and the checks of what a runner answered (`run`,
`outputs_of`, `assert_internal_error`). The `make_runner` fixture that writes a model.py into a
temporary repository and loads it is in this folder's conftest.py."""

import numpy as np

from workers.backends.batch import Input, Request


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
