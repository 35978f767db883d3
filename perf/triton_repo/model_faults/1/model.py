import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """What a Python model can do wrong, chosen by MODE, for perf/compat_probe.py to compare
    how the two servers answer each: 0 answers OUT = MODE (and EXTRA), the others misbehave."""

    def execute(self, requests):
        mode = int(pb_utils.get_input_tensor_by_name(requests[0], "MODE").as_numpy()[0])
        ok = pb_utils.InferenceResponse([
            pb_utils.Tensor("OUT", np.array([mode], np.int32)),
            pb_utils.Tensor("EXTRA", np.zeros(2, np.float32))])
        error_codes = {3: "INVALID_ARG", 4: "NOT_FOUND", 5: "UNAVAILABLE", 6: "UNSUPPORTED",
                       7: "ALREADY_EXISTS", 8: "CANCELLED", 9: "UNKNOWN"}
        if mode == 1:
            raise ValueError("mode 1 raises")
        if mode == 2:
            raise pb_utils.TritonModelException("mode 2 raises TritonModelException")
        if mode in error_codes:
            code = getattr(pb_utils.TritonError, error_codes[mode])
            return [pb_utils.InferenceResponse(
                error=pb_utils.TritonError(f"mode {mode} errs", code)) for _ in requests]
        if mode == 10:
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError("mode 10 errs"))
                    for _ in requests]
        if mode == 11:
            return []  # fewer responses than requests
        if mode == 12:
            return None
        if mode == 13:  # an output the config does not declare
            return [pb_utils.InferenceResponse([pb_utils.Tensor("NOPE", np.zeros(1, np.int32))])
                    for _ in requests]
        if mode == 14:  # a declared output with another datatype
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.zeros(1, np.float64))])
                    for _ in requests]
        if mode == 15:  # a declared output with another shape
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.zeros(3, np.int32))])
                    for _ in requests]
        if mode == 16:  # only one of two outputs
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([16], np.int32))])
                    for _ in requests]
        if mode == 17:  # not a list
            return ok
        if mode == 18:  # a response that is not an InferenceResponse
            return ["not a response" for _ in requests]
        return [ok for _ in requests]
