"""Records the lives of its instances, for the tests of instance group updates.

`initialize` and `finalize` append "initialize <instance name>" / "finalize <instance name>" to
the file the config parameter `record_to` names (nothing is recorded without it). Before it
records, `initialize` sleeps the seconds written in `<record_to>.init_delay`, if that file
exists (an instance that takes long to start), and raises if `<record_to>.init_fail` exists
(an instance that fails to start; it records nothing). `execute` sleeps `SECONDS` (its first
element) for each request and answers `INSTANCE`, the instance's name, in the shape of
`SECONDS`.
"""

import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_instance_name"]
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.record_to = parameters.get("record_to", {}).get("string_value", "")
        delay = self.record_to + ".init_delay"
        if self.record_to and os.path.exists(delay):
            with open(delay) as f:
                time.sleep(float(f.read()))
        if self.record_to and os.path.exists(self.record_to + ".init_fail"):
            raise RuntimeError(f"{self.name} was told to fail")
        self._record("initialize")

    def execute(self, requests):
        responses = []
        for request in requests:
            seconds = pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy()
            time.sleep(float(seconds.flat[0]))
            names = np.full(seconds.shape, self.name.encode(), dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("INSTANCE", names)]))
        return responses

    def finalize(self):
        self._record("finalize")

    def _record(self, event):
        if self.record_to:
            # One write of one line in append mode: instances may record at the same time.
            with open(self.record_to, "a") as f:
                f.write(f"{event} {self.name}\n")
