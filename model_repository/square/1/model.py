"""Decoupled square: for IN = n, n responses each holding n, then the final flag; none for 0.
A negative n is an error response."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)[0])
            sender = request.get_response_sender()
            if n < 0:
                sender.send(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"IN must not be negative, got {n}",
                                               pb_utils.TritonError.INVALID_ARG)),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            out = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([n], np.int32))])
            for _ in range(n):
                if sender.is_cancelled():
                    break
                sender.send(out)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
