"""The Python backend: a Triton Python-backend model (`<version>/model.py`, class
`TritonPythonModel`) run on batches of requests; knows no IPC.

The model is imported as Triton's Python backend imports it, with our `pb_utils` in its place.
Its requests' inputs are pb_utils tensors over the batch's wire bytes (zero-copy views except
for BYTES), so `pb_utils.batched_input` can hand a model the whole batch as one array.
"""

import asyncio
import functools
import gc
import importlib
import importlib.machinery
import importlib.util
import inspect
import json
import logging
import os
import sys
import threading
import time
import weakref

import numpy as np

from workers import cuda
from workers import triton_python_backend_utils as pb_utils
from workers.backends import AutoCompleteContext, BackendError, Context
from workers.backends.batch import (Input, Output, Request, Response, Timings, error_response,
                                    input_array)
from workers.sequence_extras import SequenceConfigError, SequenceExtras

_log = logging.getLogger(__name__)


class _ContractError(Exception):
    """The model broke the execute() contract; reported, as in Triton, without an exception type."""


# How often a batch whose model answers after execute returned looks whether the model
# still holds the requests it waits for.
_LATE_ANSWER_POLL_S = 0.05
# How often it collects garbage meanwhile (a cycle may hold a request nothing else does), and
# how often it logs the request it waits for.
_LATE_ANSWER_COLLECT_S = 5.0
_LATE_ANSWER_WARN_S = 30.0


class _RequestFacts:
    """What answering a request needs of it, without holding the request (or its sender)."""

    __slots__ = ("_requested_output_names", "_release_flags", "_id")

    def __init__(self, pb_request):
        self._requested_output_names = pb_request._requested_output_names
        self._release_flags = pb_request._release_flags
        self._id = pb_request.request_id()

    def request_id(self) -> str:
        return self._id


class _SentResponse:
    """Response-sender callback of a non-decoupled model: exactly one response, then FINAL."""

    __slots__ = ("response", "final", "_done")

    def __init__(self):
        self.response = None
        self.final = False
        self._done = None  # a threading.Event, once someone waits for FINAL

    def wait_final(self, timeout: float) -> bool:
        if self._done is None:
            self._done = threading.Event()
            if self.final:
                return True
        return self._done.wait(timeout)

    def __call__(self, response, flags):
        if response is not None and self.response is not None:
            raise pb_utils.TritonModelException(
                "Unable to send response. Non-decoupled model cannot send more than one response."
            )
        if response is None and self.response is None:
            raise pb_utils.TritonModelException(
                "Unable to send response. Non-decoupled model cannot send complete final before "
                "sending a response."
            )
        if response is not None:
            self.response = response
        if flags == pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self.final = True
            if self._done is not None:
                self._done.set()


class _StreamedResponses:
    """Response-sender callback of a decoupled model: each response goes out as it is sent.
    A sequence model's responses update the state of the request's slot as they go."""

    __slots__ = ("_request", "_requested", "_sequence", "final")

    def __init__(self, request: Request, sequence: SequenceExtras | None):
        self._request = request
        self._requested = set(request.requested_output_names)
        self._sequence = sequence
        self.final = False

    def __call__(self, response, flags):
        final = flags == pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if response is not None:
            response = _runner_response(response, self._requested, self._sequence,
                                        self._request)
        self._send(response, final)

    def end_with(self, response: Response) -> None:
        self._send(response, True)

    def _send(self, response, final: bool) -> None:
        if final:
            self.final = True
            if self._sequence is not None:
                request = self._request
                self._sequence.end(request.sequence_slot, request.flags, request.ready)
        self._request.respond(response, final)


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
        self._loop = None  # the instance's event loop (_event_loop), once a coroutine needs it
        self._loop_thread = None
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
            raise BackendError(_describe(exc)) from exc
        model_class = getattr(module, "TritonPythonModel", None)
        if model_class is None:
            raise BackendError(f"AttributeError: module '{module.__name__}' has no attribute "
                              f"'TritonPythonModel'")
        try:
            self._model = model_class()
            if hasattr(self._model, "initialize"):
                self._complete(self._model.initialize(self._initialize_args()))
            pb_utils._allow_bls(True)
        except Exception as exc:
            _log.exception("initialize failed for model instance '%s'", self._instance_name)
            raise BackendError(_describe(exc)) from exc

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
            answer = self._complete(self._model.is_ready())
        except Exception:
            _log.exception("is_ready() failed for model instance '%s'", self._instance_name)
            return False
        return isinstance(answer, (bool, np.bool_)) and bool(answer)

    def finalize(self) -> None:
        pb_utils._allow_bls(False)
        try:
            if self._model is not None and hasattr(self._model, "finalize"):
                self._complete(self._model.finalize())
        except Exception as exc:
            raise BackendError(
                f"Failed to finalize model instance '{self._instance_name}': {_describe(exc)}"
            ) from exc
        finally:
            self._model = None
            self._stop_loop()

    # --- coroutines --------------------------------------------------------------------------

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        """The instance's event loop, running in a thread of its own from the first coroutine
        on, as Triton's stub runs it: a model's coroutines, and the tasks they start, run
        there, between calls too (and it is the worker's current event loop)."""
        if self._loop is None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop_thread = threading.Thread(target=loop.run_forever, daemon=True,
                                                 name="model-event-loop")
            self._loop_thread.start()
            self._loop = loop
        return self._loop

    def _complete(self, result):
        """The value of `result`: a coroutine runs to completion on the instance's event
        loop, waited for here."""
        if not inspect.iscoroutine(result):
            return result
        return asyncio.run_coroutine_threadsafe(result, self._event_loop()).result()

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
                    sent.end_with(self._internal_error(_describe(exc)))

        asyncio.run_coroutine_threadsafe(coroutine, self._event_loop()).add_done_callback(done)

    def _stop_loop(self):
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop_thread.join(5)
            if not self._loop.is_running():
                self._loop.close()
            self._loop = None

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
                sent = _StreamedResponses(request, sequence)
            else:
                sent = _SentResponse()
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
            except _ContractError as exc:
                failure = str(exc)
            except Exception as exc:
                _log.exception("execute failed for model instance '%s'", self._instance_name)
                failure = _describe(exc)
        infer_done = time.perf_counter_ns()

        if self.decoupled:
            for index, request in enumerate(requests):
                if results[index] is not None:  # its inputs were unreadable
                    _StreamedResponses(request, sequence).end_with(results[index])
            if failure is not None:
                # Requests still open end with the error; the others were answered in full.
                for _, pb_request, sent in batch:
                    if pb_request._sender._close():
                        sent.end_with(self._internal_error(failure))
            elif self.iterative:
                for index, pb_request, sent in batch:
                    if self._reschedules(pb_request) and not sent.final:
                        requests[index].rescheduled = True
            return [], Timings(inputs_done - start, infer_done - inputs_done, 0, start)

        if failure is not None:
            for pb_request in pb_requests:
                pb_request._sender._close()
        else:
            pb_requests = pb_request = None  # so that only the model may hold them now
            batch, senders = self._detached(batch)
            self._await_late_answers(batch, senders)
        for index, pb_request, sent in batch:
            request = requests[index]
            if failure is not None and sent.response is None:
                results[index] = self._internal_error(failure)
            elif failure is not None:
                # Its response was sent when execute failed (a second send, a response
                # returned after it): Triton has delivered it, and only logs the failure.
                _log.error("model instance '%s' failed after answering request '%s': %s",
                           self._instance_name, request.request_id, failure)
                results[index] = _runner_response(sent.response, pb_request._requested_output_names,
                                                  self._sequence, request)
            elif sent.response is None and self.iterative and self._reschedules(pb_request):
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

    def _detached(self, batch: list) -> tuple[list, dict]:
        """The batch with each request replaced by what answering it needs, and a weak
        reference to the sender of each request not yet answered in full (by position)."""
        senders = {position: weakref.ref(pb_request._sender)
                   for position, (_, pb_request, sent) in enumerate(batch)
                   if not sent.final and not (self.iterative and self._reschedules(pb_request))}
        if not senders:
            return batch, senders
        return [(index, _RequestFacts(pb_request), sent)
                for index, pb_request, sent in batch], senders

    def _await_late_answers(self, batch: list, senders: dict) -> None:
        """Returns once every request the model still holds is answered in full.

        Triton lets a model that is not decoupled return None for a request and send its
        response (or the FINAL flag) later, from another thread or task; the batch's Result
        waits for those. A request nothing refers to any more (its sender gone) can never
        be answered, and is not waited for: it fails as unanswered."""
        collected = started = time.monotonic()
        warned = 0.0
        for position, sender in senders.items():
            sent = batch[position][2]
            while not sent.wait_final(_LATE_ANSWER_POLL_S):
                if sender() is None:
                    break
                now = time.monotonic()
                if now - collected >= _LATE_ANSWER_COLLECT_S or collected == started:
                    gc.collect()  # a cycle may be all that holds it
                    collected = now
                if now - started >= warned + _LATE_ANSWER_WARN_S:
                    warned = now - started
                    _log.warning("model instance '%s' holds request '%s' unanswered %.0f s "
                                 "after execute returned; it takes no other batch meanwhile",
                                 self._instance_name, batch[position][1].request_id(), warned)

    @staticmethod
    def _reschedules(pb_request) -> bool:
        return bool(pb_request._release_flags & pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)

    def _run_model(self, pb_requests, batch: list):
        if not hasattr(self._model, "execute"):
            raise _ContractError(
                f"Python model '{self._model_name}' does not implement `execute` method."
            )
        returned = self._model.execute(pb_requests)
        if inspect.iscoroutine(returned):
            if self.decoupled:
                self._in_background(returned, batch)
                return
            returned = self._complete(returned)
        if returned is None:
            return  # every request must have been answered through its response sender
        if self.decoupled:
            raise _ContractError(
                f"Python model '{self._instance_name}' is using the decoupled mode and the "
                "execute function must return None."
            )
        if not isinstance(returned, list):
            raise _ContractError(
                f"Expected a list in the execute return, found type '{type(returned)}'."
            )
        if len(returned) != len(pb_requests):
            raise _ContractError(
                "Number of InferenceResponse objects do not match the number of InferenceRequest "
                f"objects. InferenceRequest(s) size is:{len(pb_requests)}, and "
                f"InferenceResponse(s) size is:{len(returned)}\n"
            )
        for pb_request, response in zip(pb_requests, returned):
            if response is None:
                continue
            if pb_request._release_flags == pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
                raise _ContractError(  # "reschduled": Triton's spelling, which its tests match
                    "Expected a None object in the execute function return list for "
                    f"reschduled request, found type '{type(response)}'."
                )
            if not isinstance(response, pb_utils.InferenceResponse):
                raise _ContractError(
                    "Expected an 'InferenceResponse' object in the execute function return "
                    f"list, found type '{type(response)}'."
                )
            # A returned response is the request's final response, as if sent with FINAL; the
            # sender rejects it when the model already answered through the sender.
            pb_request._sender.send(response, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _collect(self, request: Request, pb_request, sent: _SentResponse
                 ) -> Response:
        if sent.response is None:
            if self._reschedules(pb_request):
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
        return _runner_response(sent.response, pb_request._requested_output_names,
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


def import_model(model_dir: str, version: str, stem: str, instance_name: str = ""):
    """The module `<model_dir>/<version>/<stem>.py`, imported as Triton's Python backend
    imports it: our pb_utils as `triton_python_backend_utils`, the version folder and the
    model folder on sys.path."""
    version_dir = os.path.join(model_dir, version)
    pb_utils._set_model_context(model_dir=version_dir, instance_name=instance_name)
    sys.modules["triton_python_backend_utils"] = pb_utils
    for entry in (version_dir, model_dir):
        if entry not in sys.path:
            sys.path.append(entry)
    return _import_model_module(version_dir, version, stem)


def import_backend_model(runtime_dir: str, model_dir: str, version: str,
                         instance_name: str = ""):
    """The model.py of a Python-based backend, imported as Triton's stub imports it: as module
    `model`, its folder on sys.path; pb_utils.get_model_dir() is still the model's version
    folder."""
    pb_utils._set_model_context(model_dir=os.path.join(model_dir, version),
                                instance_name=instance_name)
    sys.modules["triton_python_backend_utils"] = pb_utils
    if runtime_dir not in sys.path:
        sys.path.append(runtime_dir)
    sys.modules.pop("model", None)
    __import__("model")
    return sys.modules["model"]


def _import_model_module(version_dir: str, version: str, stem: str):
    # Triton imports "<version>.<stem>" with the model folder on sys.path, which makes the
    # version folder a namespace package (model.py may use relative imports). Registering the
    # package ourselves pins it to this model's folder whatever else sys.path holds, and a fresh
    # package per load keeps an earlier model loaded in this process from shadowing this one.
    for name in [n for n in sys.modules if n == version or n.startswith(version + ".")]:
        del sys.modules[name]
    spec = importlib.machinery.ModuleSpec(version, None, is_package=True)
    spec.submodule_search_locations = [version_dir]
    sys.modules[version] = importlib.util.module_from_spec(spec)
    # The import statement's way in, not importlib.import_module: the interpreter then trims
    # its own frames off a failed import's traceback, as in Triton's stub.
    __import__(f"{version}.{stem}")
    return sys.modules[f"{version}.{stem}"]


def _describe(exc: BaseException) -> str:
    """As Triton's Python backend (pybind11) words an exception from the model: its type and
    message, then the stack where it was raised, innermost first ("  file(line): function"),
    up to the code that called into the model."""
    # Innermost, the last frame that is not ours: pb_utils raising for a misuse is C++ in
    # Triton, with no frame of its own.
    frame, lineno = None, 0
    tb = exc.__traceback__
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_OWN_CODE):
            frame, lineno = tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next
    lines = []
    while frame is not None and not frame.f_code.co_filename.startswith(_OWN_CODE):
        lines.append(f"  {frame.f_code.co_filename}({lineno}): {frame.f_code.co_name}\n")
        frame = frame.f_back
        lineno = frame.f_lineno if frame is not None else 0
    where = "".join(lines)
    return f"{type(exc).__name__}: {exc}" + (f"\n\nAt:\n{where}" if where else "")


# Frames of the worker and of asyncio (which runs an async execute) are not the model's.
_OWN_CODE = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
             os.path.dirname(asyncio.__file__) + os.sep)


def _input_tensor(tensor: Input, request: Request, model_name: str) -> pb_utils.Tensor:
    """A pb_utils.Tensor over the wire bytes: a zero-copy view except for BYTES."""
    array = input_array(tensor, request.request_id, model_name)
    if cuda.is_device_array(array):  # a cupy view of a client's CUDA region
        return pb_utils.Tensor._wrap(tensor.name, array, tensor.datatype, cuda.device_id(array))
    return pb_utils.Tensor._wrap(tensor.name, array, tensor.datatype, origin=tensor.origin)


def _runner_response(response: pb_utils.InferenceResponse, requested: set,
                     sequence: SequenceExtras | None, request: Request) -> Response:
    if response.has_error():
        error = response.error()
        return Response([], (error.code().name, error.message()), response._parameters,
                              answered=True)
    if sequence is not None:
        # Before the outputs the client did not ask for go: a state output usually is one.
        error = sequence.capture(request.sequence_slot, request.ready, response)
        if error is not None:
            return error_response("INTERNAL", error)
    outputs = []
    for tensor in response.output_tensors():
        if tensor._name not in requested:
            continue
        array = tensor._array
        outputs.append(Output(tensor._name, tensor._datatype, list(array.shape), array))
    return Response(outputs, None, response._parameters)
