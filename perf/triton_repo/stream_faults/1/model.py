import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def response(value):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], np.int32))])


class TritonPythonModel:
    """A decoupled model that misuses its response sender as its MODE input says, for
    perf/compat_probe.py to compare how the two servers stream each case: 0 answers twice and
    closes the stream, the others misbehave."""

    def execute(self, requests):
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            sender = request.get_response_sender()
            if mode == 0:
                sender.send(response(1))
                sender.send(response(2))
                sender.send(flags=FINAL)
            elif mode == 1:
                raise ValueError("mode 1 raises before answering")
            elif mode == 2:
                sender.send(response(1))
                raise ValueError("mode 2 raises after one response")
            elif mode == 3:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("mode 3 errs")))
                sender.send(flags=FINAL)
            elif mode == 4:
                sender.send(response(1), flags=FINAL)
            elif mode == 5:
                sender.send(flags=FINAL)
                sender.send(response(1))  # after the final flag
            elif mode == 6:
                return [response(1) for _ in requests]  # a decoupled model must return None
            elif mode == 7:
                sender.send(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("mode 7 errs", pb_utils.TritonError.INVALID_ARG)),
                    flags=FINAL)
            elif mode == 8:
                sender.send("not a response", flags=FINAL)
        return None
