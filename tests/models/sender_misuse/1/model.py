import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Not decoupled; answers OUTPUT0 = INPUT0 through the response sender, then misuses it as
    the request parameter `misuse` says: `twice` sends the response again, `returned` also
    returns it after the final flag. Either raises in execute, after the response left."""

    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            response = pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)])
            sender = request.get_response_sender()
            misuse = json.loads(request.parameters()).get("misuse")
            if misuse == "twice":
                sender.send(response)
                sender.send(response)
            else:
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                if misuse == "returned":
                    return [response]
        return None
