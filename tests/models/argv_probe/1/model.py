import json
import sys

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """ARGV: sys.argv as the model sees it, as JSON (Triton's stub gives [''])."""

    def execute(self, requests):
        argv = np.array([json.dumps(sys.argv).encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("ARGV", argv)]) for _ in requests]
