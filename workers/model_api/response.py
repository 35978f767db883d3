"""Responses, and the sender through which a request's responses reach the worker side."""

import json
import threading

from workers.model_api.constants import TRITONSERVER_RESPONSE_COMPLETE_FINAL
from workers.model_api.errors import TritonError, TritonModelException
from workers.model_api.parameters import _COMPACT, _parameters_dict
from workers.model_api.tensor import Tensor


class InferenceResponse:
    def __init__(self, output_tensors=(), error=None, parameters=None):
        if output_tensors is None:
            raise TypeError("output_tensors must be a list of Tensors, found None")
        tensors = list(output_tensors)
        for tensor in tensors:
            if tensor is None:
                raise TritonModelException("output_tensors cannot hold None")
            if not isinstance(tensor, Tensor):
                raise TypeError(f"output_tensors must hold Tensors, found {type(tensor)}")
        if error is not None and not isinstance(error, TritonError):
            raise TypeError(f"error must be a TritonError or None, found {type(error)}")
        self._output_tensors = tensors
        self._error = error
        self._parameters = _parameters_dict(parameters)

    def output_tensors(self):
        return self._output_tensors

    def has_error(self):
        return self._error is not None

    def error(self):
        return self._error

    def parameters(self):
        return json.dumps(self._parameters, separators=_COMPACT)


class InferenceResponseSender:
    """Sends responses for one request through a callback the worker side installs.

    `send(response, flags)` is checked as Triton checks it, then forwarded to
    `callback(response, flags)`; the sender closes after TRITONSERVER_RESPONSE_COMPLETE_FINAL.
    The callback decides what a response means (one final response for a non-decoupled model).
    """

    def __init__(self, callback, is_cancelled=None):
        self._callback = callback
        self._is_cancelled = is_cancelled
        self._closed = False
        self._lock = threading.Lock()

    def send(self, response=None, flags=0):
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if response is None and flags == 0:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to "
                "zero."
            )
        if response is not None and not isinstance(response, InferenceResponse):
            raise TypeError(f"send() expects an InferenceResponse, found {type(response)}")
        with self._lock:
            if self._closed:
                raise TritonModelException(
                    "Unable to send response. Response sender has been closed."
                )
            self._callback(response, flags)
            if flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                self._closed = True

    def is_cancelled(self):
        return self._is_cancelled is not None and self._is_cancelled()

    def _close(self) -> bool:
        """Close the sender; whether it was still open."""
        with self._lock:
            was_open = not self._closed
            self._closed = True
            return was_open


def get_output_tensor_by_name(inference_response, name):
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None
