"""Sleeps SECONDS, then answers SECONDS_OUT = SECONDS: a request in flight for as long as a test
needs (drain at shutdown), or one that never answers in time (a hung instance).

Request parameter `started_to`: a file created when execute begins, so a test knows the request
reached the model before it acts (a signal, a kill).
"""

import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            started_to = json.loads(request.parameters()).get("started_to")
            if started_to:
                with open(started_to, "w") as f:
                    f.write(str(time.time()))
            seconds = pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy()
            time.sleep(float(seconds[0]))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SECONDS_OUT", seconds)]))
        return responses
