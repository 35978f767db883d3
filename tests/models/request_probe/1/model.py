import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """TIMEOUT: the request's `timeout()` (µs); INIT_BLS: what a BLS call made from
    initialize() raised (Triton: "BLS is only supported during the 'execute' function.")."""

    def initialize(self, args):
        request = pb_utils.InferenceRequest(
            model_name="add_sub", requested_output_names=["OUTPUT0"],
            inputs=[pb_utils.Tensor("INPUT0", np.ones(4, np.float32)),
                    pb_utils.Tensor("INPUT1", np.ones(4, np.float32))])
        try:
            request.exec()
            self.init_bls = "no error"
        except pb_utils.TritonModelException as exc:
            self.init_bls = str(exc)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("TIMEOUT", np.array([request.timeout()], np.int64)),
            pb_utils.Tensor("INIT_BLS", np.array([self.init_bls.encode()], np.object_))])
            for request in requests]
