import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Sleeps INPUT0[0] seconds, then OUTPUT0 = INPUT0; two instances, for concurrency tests."""

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            time.sleep(float(data[0]))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data)]))
        return responses
