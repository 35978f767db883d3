"""Transport-neutral inference requests and responses.

The HTTP and gRPC codecs translate their wire formats to and from these; the dataplane and
everything below it only ever see these. Tensor bytes are kept exactly as on the wire:
little-endian, row-major, BYTES as 4-byte-length-prefixed elements, BF16 as raw 2-byte words.
"""

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from shmserve.errors import ServerError

# Parameter values as Triton carries them: bool, int, float or str.
Parameters = dict[str, Any]


@dataclass(slots=True)
class InputTensor:
    name: str
    datatype: str
    shape: list[int]
    # Raw bytes of the tensor; None when the tensor lives in a client shared-memory region.
    data: Optional[memoryview | bytes] = None
    parameters: Parameters = field(default_factory=dict)


@dataclass(slots=True)
class RequestedOutput:
    name: str
    parameters: Parameters = field(default_factory=dict)


@dataclass(slots=True)
class InferRequest:
    model_name: str
    # "" (or "-1") means: the version the model's version policy picks.
    model_version: str = ""
    id: str = ""
    parameters: Parameters = field(default_factory=dict)
    inputs: list[InputTensor] = field(default_factory=list)
    # Empty: every output of the model config.
    outputs: list[RequestedOutput] = field(default_factory=list)
    # When the transport received it, as (Triton's trace timestamp name, ns), for a trace; the
    # transports note it only while some trace settings trace (tracing.Tracer.on).
    received: tuple = ()
    # Its tracing.Trace, once the dataplane sampled it (or an ensemble's, for a step).
    trace: Any = None
    # A BLS request (a model's, not a client's): never sampled, traced only as a child of the
    # calling request's trace (see observability/tracing.py).
    bls: bool = False
    # The W3C traceparent header the client sent, noted while some settings trace: in the
    # opentelemetry trace mode the request is then traced, in the client's trace.
    traceparent: str = ""
    # The fastpath.request_templates.RequestTemplate it was filled from, if any.
    template: Any = None
    # Its answer to its client, prepared by the transport up to the outputs' bytes, that the
    # model's worker may write (fastpath/prepared_answers.PreparedAnswer); None for none.
    prepared_answer: Any = None
    # Set by the dataplane while a decoupled model streams its responses: asks the model to
    # stop, its responses still read to the final one (a BLS caller's cancel()).
    ask_cancel: Any = None


@dataclass(slots=True)
class OutputTensor:
    name: str
    datatype: str
    shape: list[int]
    data: memoryview | bytes
    parameters: Parameters = field(default_factory=dict)
    # Where `data` lies in a model instance's output arena (a memory_regions.RegionSlice), for
    # a reader in another process that maps it rather than have it copied (a BLS caller);
    # None when it lies elsewhere. Valid until the response is done().
    place: Any = None


@dataclass(slots=True)
class InferResponse:
    model_name: str
    model_version: str
    id: str = ""
    parameters: Parameters = field(default_factory=dict)
    outputs: list[OutputTensor] = field(default_factory=list)
    # Called by the transport once it has copied the output bytes onto the wire, so that
    # shared-memory slots holding them can be reused. Must be called exactly once.
    release: Optional[Callable[[], None]] = None
    # The request's tracing.Trace, if sampled: the transport may stamp when it sent the
    # response before its turn of the event loop ends, when the trace is written.
    trace: Any = None
    # The model's worker writes the request's prepared answer (InferRequest.prepared_answer)
    # to the client itself: the transport only keeps its accounts.
    written_by_worker: bool = False

    def done(self) -> None:
        release, self.release = self.release, None
        if release is not None:
            release()


@dataclass(slots=True)
class StreamedResponse:
    """One response of a stream: a response, an error the model sent in its place, or (both
    None) the final flag alone. Only the last one of a request is `final`."""

    response: Optional[InferResponse]
    error: Optional[ServerError]
    final: bool
