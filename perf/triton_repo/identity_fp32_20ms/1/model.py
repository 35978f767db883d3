import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT0 = INPUT0, after 20 ms per execute() whatever the batch size: a stand-in for a
    model on a GPU, whose batch costs about the same at any size, so that how many requests
    each batch holds decides the throughput."""

    def execute(self, requests):
        time.sleep(0.020)
        return [
            pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy())
            ])
            for request in requests
        ]
