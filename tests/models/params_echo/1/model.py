import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT0 = INPUT0; PARAMS = request.parameters() (a JSON string); REQUEST_ID = request.request_id().
    The response's parameters are the request's whose keys start with `reply_`, less the prefix
    (only when there are some: Triton before 2.55 has no InferenceResponse parameters)."""

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            params = request.parameters().encode()
            request_id = request.request_id().encode()
            replies = {key[len("reply_"):]: value for key, value in json.loads(params).items()
                       if key.startswith("reply_")}
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", data),
                pb_utils.Tensor("PARAMS", np.array([params], dtype=np.object_)),
                pb_utils.Tensor("REQUEST_ID", np.array([request_id], dtype=np.object_)),
            ], **({"parameters": replies} if replies else {})))
        return responses
