"""A decoupled echo model for the OpenAI routes' tests. The prompt's words are its tokens.

- Streaming (input `stream` true): one response per word, each word with the space after it,
  so that the responses' texts joined are the prompt; the last response flagged FINAL.
  Otherwise one response with the whole prompt.
- The prompt "inputs?" answers, as JSON, every input it was sent but text_input, with its
  value: what the routes sent.
- The prompt "fail" answers an INVALID_ARG error; "fail later" streams one word, then the
  error.
- The prompt "record <path>" streams "tick " every 10 ms (up to 20 s) until the request is
  cancelled, then writes "cancelled" (or "not cancelled") to <path>.
- Token counts (num_input_tokens, num_output_tokens, INT32) as return_num_* ask: the words of
  the prompt, and of the response's text.
"""

import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _value(request, name, default=None):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    value = tensor.as_numpy().reshape(-1)[0]
    return value.decode() if isinstance(value, bytes) else value.item()


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self._answer, args=(request,), daemon=True).start()
        return None

    def _answer(self, request):
        sender = request.get_response_sender()
        prompt = _value(request, "text_input", "")
        stream = bool(_value(request, "stream", False))
        counts = (bool(_value(request, "return_num_input_tokens", False)),
                  bool(_value(request, "return_num_output_tokens", False)))
        prompt_words = len(prompt.split())

        def response(text):
            tensors = [pb_utils.Tensor("text_output", np.array([text.encode()], np.object_))]
            if counts[0]:
                tensors.append(pb_utils.Tensor("num_input_tokens",
                                               np.array([prompt_words], np.int32)))
            if counts[1]:
                tensors.append(pb_utils.Tensor("num_output_tokens",
                                               np.array([len(text.split())], np.int32)))
            return pb_utils.InferenceResponse(output_tensors=tensors)

        if prompt == "inputs?":
            names = [t.name() for t in request.inputs() if t.name() != "text_input"]
            sent = {name: _value(request, name) for name in names}
            sender.send(response(json.dumps(sent, sort_keys=True)), flags=FINAL)
        elif prompt.startswith("fail"):
            if prompt == "fail later":
                sender.send(response("first "))
            error = pb_utils.TritonError("the echo model was asked to fail",
                                        pb_utils.TritonError.INVALID_ARG)
            sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
        elif prompt.startswith("record "):
            deadline = time.monotonic() + 20
            while not request.is_cancelled() and time.monotonic() < deadline:
                try:
                    sender.send(response("tick "))
                except Exception:  # noqa: BLE001 (the request is gone)
                    break
                time.sleep(0.01)
            with open(prompt[len("record "):], "w") as f:
                f.write("cancelled" if request.is_cancelled() else "not cancelled")
            sender.send(flags=FINAL)
        elif not stream:
            sender.send(response(prompt), flags=FINAL)
        else:
            words = prompt.split(" ")
            for i, word in enumerate(words):
                last = i == len(words) - 1
                sender.send(response(word if last else word + " "), flags=FINAL if last else 0)
