import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Inputs named as generate's keywords ("parameters", "id") and X, all optional. SEEN is a
    JSON object of what the request brought: each input given (its values as a list), the
    request id ("request_id") and request.parameters() as the model got the string
    ("params")."""

    def execute(self, requests):
        responses = []
        for request in requests:
            seen = {"request_id": request.request_id(), "params": request.parameters()}
            for name in ("parameters", "id", "X"):
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is not None:
                    seen[name] = [v.decode() if isinstance(v, bytes) else int(v)
                                  for v in tensor.as_numpy().flatten()]
            text = json.dumps(seen, sort_keys=True).encode()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SEEN", np.array([text], dtype=np.object_))]))
        return responses
