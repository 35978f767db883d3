"""seq_string: a running sum per sequence under the `oldest` strategy, keyed by the string
correlation id the scheduler hands over in the CORRID_IN control (echoed as CORRID)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self._sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID_IN").as_numpy().reshape(-1)[0]
            if pb_utils.get_input_tensor_by_name(request, "START").as_numpy().reshape(-1)[0]:
                self._sums[corrid] = 0
            value = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().reshape(-1)[0])
            self._sums[corrid] = total = self._sums.get(corrid, 0) + value
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", np.array([[total]], dtype=np.int32)),
                pb_utils.Tensor("CORRID", np.array([[corrid]], dtype=np.object_)),
            ]))
        return responses
