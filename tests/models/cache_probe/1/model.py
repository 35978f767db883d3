"""OUTPUT0 = INPUT0; RUN counts the requests this instance executed: an answer from the
response cache carries the RUN of the execution that filled it."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.runs = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            self.runs += 1
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", data),
                pb_utils.Tensor("RUN", np.array([self.runs], np.int64))]))
        return responses
