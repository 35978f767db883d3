"""The Python backend: a Triton Python-backend model (`<version>/model.py`, class
`TritonPythonModel`) run on batches of requests; knows no IPC.

The model is imported as Triton's Python backend imports it, with our `pb_utils` in its place
(python_import.py). Its requests' inputs are pb_utils tensors over the batch's wire bytes
(zero-copy views except for BYTES), so `pb_utils.batched_input` can hand a model the whole
batch as one array; its responses come back through the requests' senders
(python_responses.py). Its coroutines run on the instance's own event loop
(python_event_loop.py), and its failures are worded as Triton words them (python_errors.py).
"""

import functools
import inspect
import json
import logging
import os
import time

import numpy as np

from workers import cuda
from workers import triton_python_backend_utils as pb_utils
from workers.backends import AutoCompleteContext, BackendError, Context
from workers.backends.batch import Input, Request, Response, Timings, error_response, input_array
from workers.backends.python_errors import ContractError, describe
from workers.backends.python_event_loop import ModelEventLoop
from workers.backends.python_import import import_backend_model, import_model
from workers.backends.python_responses import (SentResponse, StreamedResponses,
                                               await_late_answers, detached, reschedules,
                                               runner_response)
from workers.sequence_extras import SequenceConfigError, SequenceExtras

_log = logging.getLogger(__name__)


class PythonModel:
    """One instance of a Python-backend model (the backend interface's Instance)."""

    def __init__(self, context: Context):
        self._model_name = context.model_name
        self._model_version = context.model_version
        self._model_dir = context.model_dir
        self._model_config = config = context.model_config
        self._instance_name = context.instance_name
        self._instance_kind = context.instance_kind
        self._device_id = context.device_id
        self._model_repository = context.model_repository
        self._runtime_dir = context.runtime_dir
        self._model = None
        self._loop = ModelEventLoop()
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        try:
            self._sequence = SequenceExtras.from_config(config, context.model_dir,
                                                        context.instance_kind,
                                                        context.state_memory,
                                                        context.state_reserve)
        except SequenceConfigError as exc:
            raise BackendError(f"sequence batching of model '{context.model_name}': "
                               f"{exc}") from None
        self.iterative = bool(config.get("sequence_batching", {})
                               .get("iterative_sequence", False))

    # --- lifecycle ---------------------------------------------------------------------------

    def initialize(self) -> None:
        version = str(self._model_version)
        if self._runtime_dir:
            # A Python-based backend: its model.py runs this model, whatever the version
            # folder holds.
            path = os.path.join(self._runtime_dir, "model.py")
            load = functools.partial(import_backend_model, self._runtime_dir, self._model_dir,
                                     version, self._instance_name)
        else:
            filename = self._model_config.get("default_model_filename") or "model.py"
            stem, extension = os.path.splitext(filename)
            if extension != ".py":
                raise BackendError(f"Model name must end with '.py'. Model name is "
                                   f"\"{filename}\".")
            path = os.path.join(self._model_dir, version, filename)
            if not os.path.isfile(path):
                raise BackendError(f"Python model file not found in '{path}'")
            load = functools.partial(import_model, self._model_dir, version, stem,
                                     self._instance_name)

        # The messages of these failures are Triton's Python backend's: the exception, then
        # the model's frames (none for an error found outside them).
        try:
            module = load()
        except Exception as exc:
            _log.exception("importing '%s' failed", path)
            raise BackendError(describe(exc)) from exc
        model_class = getattr(module, "TritonPythonModel", None)
        if model_class is None:
            raise BackendError(f"AttributeError: module '{module.__name__}' has no attribute "
                              f"'TritonPythonModel'")
        try:
            self._model = model_class()
            if hasattr(self._model, "initialize"):
                self._loop.complete(self._model.initialize(self._initialize_args()))
            pb_utils._allow_bls(True)
        except Exception as exc:
            _log.exception("initialize failed for model instance '%s'", self._instance_name)
            raise BackendError(describe(exc)) from exc

    def _initialize_args(self) -> dict:
        return {
            "model_config": json.dumps(self._model_config),
            "model_instance_kind": self._instance_kind,
            "model_instance_name": self._instance_name,
            "model_instance_device_id": str(self._device_id),
            "model_repository": self._model_repository,
            "model_version": str(self._model_version),
            "model_name": self._model_name,
        }

    @property
    def has_readiness_hook(self) -> bool:
        return callable(getattr(self._model, "is_ready", None))

    def is_ready(self) -> bool:
        """The model's own is_ready() (sync or async); an exception or an answer that is not
        a boolean means not ready."""
        try:
            answer = self._loop.complete(self._model.is_ready())
        except Exception:
            _log.exception("is_ready() failed for model instance '%s'", self._instance_name)
            return False
        return isinstance(answer, (bool, np.bool_)) and bool(answer)

    def finalize(self) -> None:
        pb_utils._allow_bls(False)
        try:
            if self._model is not None and hasattr(self._model, "finalize"):
                self._loop.complete(self._model.finalize())
        except Exception as exc:
            raise BackendError(
                f"Failed to finalize model instance '{self._instance_name}': {describe(exc)}"
            ) from exc
        finally:
            self._model = None
            self._loop.stop()

    def _in_background(self, coroutine, batch: list) -> None:
        """A decoupled model's coroutine runs on, as in Triton: the instance takes its next
        batch meanwhile, and the requests end through their senders. If it raises, the
        requests still open end with the error (Triton would only log it)."""
        def done(future) -> None:
            if future.cancelled() or future.exception() is None:
                return
            exc = future.exception()
            _log.error("execute of model instance '%s' failed", self._instance_name,
                       exc_info=exc)
            for _, pb_request, sent in batch:
                if pb_request._sender._close():
                    sent.end_with(self._internal_error(describe(exc)))

        self._loop.start(coroutine).add_done_callback(done)

    # --- execute -----------------------------------------------------------------------------

    def execute(self, requests: list[Request]) -> tuple[list[Response], Timings]:
        """Run one batch. A model that is not decoupled gets one response per request, in
        order; a decoupled model answers through each request's `respond`, and the list is
        empty. A request that an iterative-sequence model reschedules gets `rescheduled` set
        and, from a model that is not decoupled, an empty response."""
        start = time.perf_counter_ns()
        sequence = self._sequence
        results: list[Response | None] = [None] * len(requests)
        batch = []  # (index in `requests`, pb_utils request, its sender callback)
        for index, request in enumerate(requests):
            try:
                inputs = [_input_tensor(tensor, request, self._model_name)
                          for tensor in request.inputs]
                if sequence is not None:
                    inputs = sequence.inputs(inputs, request.sequence_slot, request.flags,
                                             request.correlation_id, request.ready)
            except ValueError as exc:
                results[index] = error_response("INVALID_ARG", str(exc))
                continue
            if self.decoupled:
                sent = StreamedResponses(request, sequence)
            else:
                sent = SentResponse()
            pb_request = pb_utils.InferenceRequest._incoming(
                model_name=self._model_name,
                request_id=request.request_id,
                correlation_id=request.correlation_id,
                flags=request.flags,
                timeout=request.timeout_us,
                parameters=request.parameters,
                inputs=inputs,
                requested_output_names=request.requested_output_names,
                sender=pb_utils.InferenceResponseSender(sent, request.is_cancelled),
                trace_id=request.trace_id,
                trace_context=request.trace_context,
            )
            batch.append((index, pb_request, sent))
        inputs_done = time.perf_counter_ns()

        pb_requests = [pb_request for _, pb_request, _ in batch]
        failure = None
        if pb_requests:
            try:
                self._run_model(pb_requests, batch)
            except ContractError as exc:
                failure = str(exc)
            except Exception as exc:
                _log.exception("execute failed for model instance '%s'", self._instance_name)
                failure = describe(exc)
        infer_done = time.perf_counter_ns()

        if self.decoupled:
            for index, request in enumerate(requests):
                if results[index] is not None:  # its inputs were unreadable
                    StreamedResponses(request, sequence).end_with(results[index])
            if failure is not None:
                # Requests still open end with the error; the others were answered in full.
                for _, pb_request, sent in batch:
                    if pb_request._sender._close():
                        sent.end_with(self._internal_error(failure))
            elif self.iterative:
                for index, pb_request, sent in batch:
                    if reschedules(pb_request) and not sent.final:
                        requests[index].rescheduled = True
            return [], Timings(inputs_done - start, infer_done - inputs_done, 0, start)

        if failure is not None:
            for pb_request in pb_requests:
                pb_request._sender._close()
        else:
            pb_requests = pb_request = None  # so that only the model may hold them now
            batch, senders = detached(batch, self.iterative)
            await_late_answers(batch, senders, self._instance_name)
        for index, pb_request, sent in batch:
            request = requests[index]
            if failure is not None and sent.response is None:
                results[index] = self._internal_error(failure)
            elif failure is not None:
                # Its response was sent when execute failed (a second send, a response
                # returned after it): Triton has delivered it, and only logs the failure.
                _log.error("model instance '%s' failed after answering request '%s': %s",
                           self._instance_name, request.request_id, failure)
                results[index] = runner_response(sent.response, pb_request._requested_output_names,
                                                 self._sequence, request)
            elif sent.response is None and self.iterative and reschedules(pb_request):
                request.rescheduled = True
                results[index] = Response([], None, {})
            else:
                results[index] = self._collect(request, pb_request, sent)
        if sequence is not None:
            for request in requests:
                if not request.rescheduled:
                    sequence.end(request.sequence_slot, request.flags, request.ready)
        done = time.perf_counter_ns()
        return results, Timings(inputs_done - start, infer_done - inputs_done, done - infer_done,
                                start)

    def _run_model(self, pb_requests, batch: list):
        if not hasattr(self._model, "execute"):
            raise ContractError(
                f"Python model '{self._model_name}' does not implement `execute` method."
            )
        returned = self._model.execute(pb_requests)
        if inspect.iscoroutine(returned):
            if self.decoupled:
                self._in_background(returned, batch)
                return
            returned = self._loop.complete(returned)
        if returned is None:
            return  # every request must have been answered through its response sender
        if self.decoupled:
            raise ContractError(
                f"Python model '{self._instance_name}' is using the decoupled mode and the "
                "execute function must return None."
            )
        if not isinstance(returned, list):
            raise ContractError(
                f"Expected a list in the execute return, found type '{type(returned)}'."
            )
        if len(returned) != len(pb_requests):
            raise ContractError(
                "Number of InferenceResponse objects do not match the number of InferenceRequest "
                f"objects. InferenceRequest(s) size is:{len(pb_requests)}, and "
                f"InferenceResponse(s) size is:{len(returned)}\n"
            )
        for pb_request, response in zip(pb_requests, returned):
            if response is None:
                continue
            if pb_request._release_flags == pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
                raise ContractError(  # "reschduled": Triton's spelling, which its tests match
                    "Expected a None object in the execute function return list for "
                    f"reschduled request, found type '{type(response)}'."
                )
            if not isinstance(response, pb_utils.InferenceResponse):
                raise ContractError(
                    "Expected an 'InferenceResponse' object in the execute function return "
                    f"list, found type '{type(response)}'."
                )
            # A returned response is the request's final response, as if sent with FINAL; the
            # sender rejects it when the model already answered through the sender.
            pb_request._sender.send(response, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _collect(self, request: Request, pb_request, sent: SentResponse
                 ) -> Response:
        if sent.response is None:
            if reschedules(pb_request):
                # Triton's core refuses the release (its text); the request, which Triton
                # then leaves unanswered, ends with that error here.
                return error_response(
                    "INVALID_ARG", "Request is released with "
                    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not "
                    "configured to handle such a flag.")
            return self._internal_error(
                f"execute returned None for request '{pb_request.request_id()}' and sent no "
                "response through its response sender"
            )
        if not sent.final:
            return self._internal_error(
                f"the response for request '{pb_request.request_id()}' was sent without "
                "TRITONSERVER_RESPONSE_COMPLETE_FINAL"
            )
        return runner_response(sent.response, pb_request._requested_output_names,
                               self._sequence, request)

    def _internal_error(self, message: str) -> Response:
        return error_response(
            "INTERNAL",
            f"Failed to process the request(s) for model instance '{self._instance_name}', "
            f"message: {message}",
        )


def load(context: Context) -> PythonModel:
    model = PythonModel(context)
    model.initialize()
    return model


def auto_complete(context: AutoCompleteContext) -> dict:
    """The config after the model's `TritonPythonModel.auto_complete_config`, which gets and
    returns a pb_utils.ModelConfig; the config unchanged when the class has no such method."""
    given = pb_utils.ModelConfig(context.config)
    filename = context.config.get("default_model_filename") or "model.py"
    path = os.path.join(context.model_dir, context.version, filename)
    try:
        if context.runtime_dir:
            path = os.path.join(context.runtime_dir, "model.py")
            module = import_backend_model(context.runtime_dir, context.model_dir,
                                          context.version)
        else:
            module = import_model(context.model_dir, context.version,
                                  os.path.splitext(filename)[0])
    except Exception as exc:
        raise BackendError(f"failed to import '{path}': {type(exc).__name__}: {exc}") from exc
    model_class = getattr(module, "TritonPythonModel", None)
    if model_class is None:
        raise BackendError(f"'{path}' does not define class TritonPythonModel")
    method = getattr(model_class, "auto_complete_config", None)
    if method is None:
        return context.config
    try:
        completed = method(given)
    except Exception as exc:
        raise BackendError(
            f"auto_complete_config raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(completed, pb_utils.ModelConfig):
        raise BackendError("auto_complete_config must return the pb_utils.ModelConfig it "
                           f"was given, not {type(completed).__name__}")
    return completed.as_dict()


def _input_tensor(tensor: Input, request: Request, model_name: str) -> pb_utils.Tensor:
    """A pb_utils.Tensor over the wire bytes: a zero-copy view except for BYTES."""
    array = input_array(tensor, request.request_id, model_name)
    if cuda.is_device_array(array):  # a cupy view of a client's CUDA region
        return pb_utils.Tensor._wrap(tensor.name, array, tensor.datatype, cuda.device_id(array))
    return pb_utils.Tensor._wrap(tensor.name, array, tensor.datatype, origin=tensor.origin)

