"""iterative_steps / iterative_stream: each request runs STEPS iterations of an iterative
sequence, one per execute call, asking to be rescheduled until the last.

Outputs of a step: STEP (1 for the first), BATCH (requests in that call), CALL (the call's
number since the instance started). Each call sleeps 5 ms. Decoupled (iterative_stream): one response per step, the
last flagged FINAL. Otherwise: one response, after the last step. A cancelled decoupled request
ends with the FINAL flag alone. Progress is kept per correlation_id(), as a model keeping a KV
cache would.
"""

import time

import numpy as np
import triton_python_backend_utils as pb_utils


STEP_S = 0.005  # a step takes this long, so that a request of many steps runs a while


class TritonPythonModel:
    def initialize(self, args):
        import json
        self._decoupled = pb_utils.using_decoupled_model_transaction_policy(
            json.loads(args["model_config"]))
        self._done = {}  # correlation id -> steps run
        self._calls = 0

    def execute(self, requests):
        self._calls += 1
        time.sleep(STEP_S)
        responses = []
        for request in requests:
            key = request.correlation_id()
            if request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                self._done[key] = 0
            steps = int(pb_utils.get_input_tensor_by_name(request, "STEPS").as_numpy().reshape(-1)[0])
            self._done[key] += 1
            step = self._done[key]
            out = pb_utils.InferenceResponse([
                pb_utils.Tensor("STEP", np.array([[step]], dtype=np.int32)),
                pb_utils.Tensor("BATCH", np.array([[len(requests)]], dtype=np.int32)),
                pb_utils.Tensor("CALL", np.array([[self._calls]], dtype=np.int64)),
            ])
            last = step >= steps
            if self._decoupled:
                sender = request.get_response_sender()
                if sender.is_cancelled():
                    last = True
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                else:
                    sender.send(out, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0)
                out = None
            elif not last:
                out = None
            if last:
                del self._done[key]
            else:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            responses.append(out)
        return None if self._decoupled else responses
