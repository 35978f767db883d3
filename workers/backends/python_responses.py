"""A Python model's responses, from its response senders to the batch's Responses.

A request's `InferenceResponseSender` calls back into one of two collectors: a model that is not
decoupled sends exactly one response, then FINAL (`SentResponse`, read once execute is done); a
decoupled model's responses go out as they are sent (`StreamedResponses`). Either way a
pb_utils response becomes the batch's Response (`runner_response`).

Triton lets a model that is not decoupled return None for a request and answer it later, from
another thread or task: the batch then waits for those answers (`await_late_answers`), holding
only what answering needs (`detached`), so that a request the model dropped is seen to be gone.
"""

import gc
import logging
import threading
import time
import weakref

from workers import triton_python_backend_utils as pb_utils
from workers.backends.batch import Output, Request, Response, error_response
from workers.sequence_extras import SequenceExtras

_log = logging.getLogger(__name__)

# How often a batch whose model answers after execute returned looks whether the model
# still holds the requests it waits for.
_LATE_ANSWER_POLL_S = 0.05
# How often it collects garbage meanwhile (a cycle may hold a request nothing else does), and
# how often it logs the request it waits for.
_LATE_ANSWER_COLLECT_S = 5.0
_LATE_ANSWER_WARN_S = 30.0


class SentResponse:
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


class StreamedResponses:
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
            response = runner_response(response, self._requested, self._sequence,
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


def runner_response(response: pb_utils.InferenceResponse, requested: set,
                    sequence: SequenceExtras | None, request: Request) -> Response:
    """The batch's Response for a model's response: the outputs the request asked for."""
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


def reschedules(pb_request) -> bool:
    """Whether the model released the request with RESCHEDULE (iterative sequences)."""
    return bool(pb_request._release_flags & pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)


class _RequestFacts:
    """What answering a request needs of it, without holding the request (or its sender)."""

    __slots__ = ("_requested_output_names", "_release_flags", "_id")

    def __init__(self, pb_request):
        self._requested_output_names = pb_request._requested_output_names
        self._release_flags = pb_request._release_flags
        self._id = pb_request.request_id()

    def request_id(self) -> str:
        return self._id


def detached(batch: list, iterative: bool) -> tuple[list, dict]:
    """The batch, [(index, pb_utils request, its SentResponse)], with each request replaced
    by what answering it needs, and a weak reference to the sender of each request not yet
    answered in full (by position); `iterative`: a rescheduled request is not waited for."""
    senders = {position: weakref.ref(pb_request._sender)
               for position, (_, pb_request, sent) in enumerate(batch)
               if not sent.final and not (iterative and reschedules(pb_request))}
    if not senders:
        return batch, senders
    return [(index, _RequestFacts(pb_request), sent)
            for index, pb_request, sent in batch], senders


def await_late_answers(batch: list, senders: dict, instance_name: str) -> None:
    """Returns once every request the model still holds is answered in full (`batch` and
    `senders` as `detached` gives them). A request nothing refers to any more (its sender
    gone) can never be answered, and is not waited for: it fails as unanswered."""
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
                             instance_name, batch[position][1].request_id(), warned)
