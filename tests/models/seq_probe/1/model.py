"""seq_probe: a running sum per sequence that also reports what the sequence batcher told it.

Per request: OUTPUT = the sum of the sequence's INPUTs so far (reset by START, kept by the
CORRID control value); CONTROLS = the START, END, READY and CORRID control values it got;
BATCH_READY = the READY value of every request of the execute call, in order (null requests
fill idle slots with READY false); ROW = its index in the call; FLAGS = request.flags().
An optional DELAY sleeps that many seconds once per call, so that requests can queue.
"""

import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _value(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0]


class TritonPythonModel:
    def initialize(self, args):
        self._sums = {}

    def execute(self, requests):
        delays = [pb_utils.get_input_tensor_by_name(r, "DELAY") for r in requests]
        delay = max((float(d.as_numpy().reshape(-1)[0]) for d in delays if d is not None),
                    default=0.0)
        if delay:
            time.sleep(delay)
        ready = [float(_value(r, "READY")) for r in requests]
        responses = []
        for row, request in enumerate(requests):
            start, end = int(_value(request, "START")), float(_value(request, "END"))
            corrid = int(_value(request, "CORRID"))
            total = 0
            if ready[row]:
                if start:
                    self._sums[corrid] = 0
                total = self._sums.get(corrid, 0) + int(_value(request, "INPUT"))
                self._sums[corrid] = total
                if end:
                    self._sums.pop(corrid, None)
            out = [
                pb_utils.Tensor("OUTPUT", np.array([[total]], dtype=np.int32)),
                pb_utils.Tensor("CONTROLS", np.array([[start, end, ready[row], corrid]],
                                                     dtype=np.float64)),
                pb_utils.Tensor("BATCH_READY", np.array([ready], dtype=np.float64)),
                pb_utils.Tensor("ROW", np.array([[row]], dtype=np.int32)),
                pb_utils.Tensor("FLAGS", np.array([[request.flags()]], dtype=np.int32)),
            ]
            responses.append(pb_utils.InferenceResponse(out))
        return responses
