"""Decoupled, answering inside execute() one request after the other: N responses, an error
response ("step error"), then the final flag alone. Everything a request is sent comes before
anything of the next request, so a stream must deliver it in that order."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            sender = request.get_response_sender()
            for k in range(count):
                sender.send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", np.array([k], np.int32))]))
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("step error")))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
