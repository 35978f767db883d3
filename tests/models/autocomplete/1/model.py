import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """config.pbtxt names only the backend; auto_complete_config supplies the rest.
    OUTPUT0 = INPUT0 (FP32 [n, k], n <= 4)."""

    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]})
        auto_complete_model_config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]})
        auto_complete_model_config.set_max_batch_size(4)
        return auto_complete_model_config

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy())
            ])
            for request in requests
        ]
