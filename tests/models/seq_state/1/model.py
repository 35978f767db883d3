"""seq_state: a running sum kept in Triton's implicit state, not in the model: OUTPUT =
STATE_IN + INPUT, and STATE_OUT (the next request's STATE_IN) = OUTPUT."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            state = pb_utils.get_input_tensor_by_name(request, "STATE_IN").as_numpy()
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            total = (state + value).astype(np.int32)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", total),
                pb_utils.Tensor("STATE_OUT", total),
            ]))
        return responses
