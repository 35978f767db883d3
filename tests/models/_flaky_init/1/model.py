"""initialize fails its first FAILURES times (a config parameter), counted in a file in the
model's folder (`attempts`), then works: OUTPUT0 = INPUT0. Copy it before use: it writes."""

import json
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        failures = int(json.loads(args["model_config"])["parameters"]["FAILURES"]["string_value"])
        path = os.path.join(args["model_repository"], "attempts")
        attempts = int(open(path).read()) if os.path.exists(path) else 0
        with open(path, "w") as f:
            f.write(str(attempts + 1))
        if attempts < failures:
            raise RuntimeError(f"flaky_init fails its attempt {attempts + 1}")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
