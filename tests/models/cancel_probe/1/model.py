import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Waits up to SECONDS for its request to be cancelled, asking request.is_cancelled()
    every 10 ms, writes what it saw ("cancelled" or "not cancelled") to the file that the
    request parameter `record_to` names, then answers OUT = SECONDS."""

    def execute(self, requests):
        responses = []
        for request in requests:
            seconds = pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy()
            deadline = time.monotonic() + float(seconds[0])
            while not request.is_cancelled() and time.monotonic() < deadline:
                time.sleep(0.01)
            record_to = json.loads(request.parameters()).get("record_to")
            if record_to:
                with open(record_to, "w") as f:
                    f.write("cancelled" if request.is_cancelled() else "not cancelled")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", seconds)]))
        return responses
