import numpy as np
import triton_python_backend_utils as pb_utils


def _call(mode):
    """The BLS call that MODE names, made with exec(): what it answered, as text."""
    f4 = pb_utils.Tensor("INPUT0", np.arange(4, dtype=np.float32).reshape(1, 4))
    calls = {
        0: dict(model_name="identity_fp32", inputs=[f4]),
        1: dict(model_name="nope", inputs=[f4]),
        2: dict(model_name="identity_fp32", inputs=[pb_utils.Tensor("X", f4.as_numpy())]),
        3: dict(model_name="identity_fp32",
                inputs=[pb_utils.Tensor("INPUT0", np.zeros((1, 4), np.int32))]),
        4: dict(model_name="model_faults",
                inputs=[pb_utils.Tensor("MODE", np.array([1], np.int32))]),
        5: dict(model_name="model_faults",
                inputs=[pb_utils.Tensor("MODE", np.array([3], np.int32))]),
        6: dict(model_name="identity_fp32", inputs=[f4], requested_output_names=["NOPE"]),
        7: dict(model_name="repeat", inputs=[pb_utils.Tensor("IN", np.array([1, 2], np.int32))]),
        8: dict(model_name="identity_fp32", model_version=7, inputs=[f4]),
        9: dict(model_name="ens_identity2",
                inputs=[pb_utils.Tensor("INPUT", np.ones((1, 2), np.float32))]),
        10: dict(model_name="accumulate",
                 inputs=[pb_utils.Tensor("INPUT", np.ones((1, 1), np.int32))]),
        11: dict(model_name="identity_fp32",
                 inputs=[pb_utils.Tensor("INPUT0", np.zeros(4, np.float32))]),
        12: dict(model_name="model_faults",
                 inputs=[pb_utils.Tensor("MODE", np.array([13], np.int32))]),
        13: dict(model_name="identity_fp32", inputs=[]),
        14: dict(model_name="ens_faults",
                 inputs=[pb_utils.Tensor("MODE", np.array([1], np.int32))]),
    }
    if mode == 15:  # a decoupled model, its responses iterated
        responses = pb_utils.InferenceRequest(
            model_name="repeat", requested_output_names=["OUT"],
            inputs=[pb_utils.Tensor("IN", np.array([5, 6], np.int32))]).exec(decoupled=True)
        return "; ".join(_describe(r) for r in responses)
    args = calls[mode]
    args.setdefault("requested_output_names", [])
    return _describe(pb_utils.InferenceRequest(**args).exec())


def _describe(response):
    if response.has_error():
        error = response.error()
        return f"error {error.code()}: {error.message()}"
    return " ".join(f"{t.name()}={t.as_numpy().tolist()}"
                    for t in sorted(response.output_tensors(), key=lambda t: t.name()))


class TritonPythonModel:
    """BLS calls that go wrong, chosen by MODE, for perf/compat_probe.py to compare what each
    server tells the calling model: WHAT says what the call answered or raised."""

    def execute(self, requests):
        responses = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            try:
                what = _call(mode)
            except Exception as exc:
                what = f"raised {type(exc).__name__}: {exc}"
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("WHAT", np.array([what.encode()], dtype=np.object_))]))
        return responses
