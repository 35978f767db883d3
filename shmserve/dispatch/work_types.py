"""What a batch carries to a model instance and back: the records the schedulers hand to an
instance (`WorkRequest` and its `WorkInput`s) and those it answers with (`WorkResponse`, its
`WorkOutput`s, the batch's `BatchTimings`).

They live apart from the instance that runs them (dispatch/worker.py) because every layer
above dispatch builds or reads them, and tests build them with no worker at all. Slotted
dataclasses: one of each is made per request on the hot path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

from shmserve.dispatch.memory_regions import Region, RegionSlice
from shmserve.errors import ModelError

if TYPE_CHECKING:
    from shmserve.dispatch.stream import ResponseStream
    from shmserve.fastpath.answer_loan import AnswerLoan
    from shmserve.ipc.request_table import RequestTable
    from shmserve.observability.tracing import Trace


@dataclass(slots=True, frozen=True)
class DeviceTensor:
    """A tensor a GPU instance keeps in its device memory for another instance to read there
    (an ensemble's intermediate): the CUDA IPC handle of the allocation it lies in, and where
    in it. Valid until the release of the response that gave it."""

    raw_handle: bytes
    device_id: int
    offset: int
    nbytes: int


@dataclass(slots=True)
class WorkInput:
    name: str
    datatype: str
    shape: list
    # Raw wire bytes, where they are in a client region, or on another instance's GPU.
    data: bytes | memoryview | RegionSlice | DeviceTensor


@dataclass(slots=True)
class WorkRequest:
    """A validated request, ready for a worker."""

    request_id: str
    correlation_id: int | str
    flags: int
    parameters: dict
    inputs: list  # of WorkInput
    requested_outputs: list  # of str
    # Set for a decoupled model: where its responses go.
    stream: Optional[ResponseStream] = None
    # Output name -> RegionSlice, for outputs the client wants in its own shared memory.
    output_regions: dict = field(default_factory=dict)
    # The client regions (memory_regions.Region) its inputs and outputs are in.
    regions: list = field(default_factory=list)
    # Set by the sequence batcher: the batch slot of the request's sequence on the instance
    # that runs it, and False for a null request (one that fills an idle slot).
    sequence_slot: int = -1
    ready: bool = True
    trace: Optional[Trace] = None  # if sampled
    # Outputs a GPU instance keeps on its GPU when the model made them there (DeviceTensor).
    device_outputs: tuple = ()
    # Its answer to its client, prepared up to the outputs' bytes, that the worker may write
    # (the fast path; fastpath/answer_loan.py says what it promises); None for none.
    prepared_answer: Optional[AnswerLoan] = None
    timeout_us: int = 0  # its timeout (the "timeout" parameter), for `request.timeout()`
    # While a worker holds it (not a decoupled one, whose stream has its row): (the request
    # table, its row), to mark it cancelled when its client goes away (WorkRequest.cancel).
    held: Optional[tuple[RequestTable, int]] = None

    def cancel(self) -> None:
        """Its client went away: the model's `request.is_cancelled()` says so from now on,
        while a worker holds it."""
        held = self.held
        if held is not None:
            held[0].cancel(held[1])


@dataclass(slots=True)
class WorkOutput:
    name: str
    datatype: str
    shape: list
    # bytes (inline; empty when in a client region or on the GPU) or a view of the output arena
    data: bytes | memoryview
    # Where `data` starts in the output arena (see WorkResponse.arena); -1 when not there.
    offset: int = -1
    device: Optional[DeviceTensor] = None  # where it is, when the instance kept it on its GPU


@dataclass(slots=True)
class WorkResponse:
    error: Optional[ModelError]
    outputs: list = field(default_factory=list)
    parameters: dict = field(default_factory=dict)
    # Hands the output-arena slots back once the outputs are copied out; None if none.
    release: Optional[Callable[[], None]] = None
    # An iterative sequence's request that the model asked to run again: no answer yet.
    rescheduled: bool = False
    # The output arena as a Region, when outputs are in it: another instance can then read
    # them in place (an ensemble's next step), as long as `release` has not been called.
    arena: Optional[Region] = None
    # The worker writes the request's prepared answer itself (WorkRequest.prepared_answer).
    written_by_worker: bool = False


@dataclass(slots=True)
class BatchTimings:
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    start_ns: int = 0  # when the worker began it (CLOCK_MONOTONIC); 0 if unknown
    gpu_uuid: str = ""  # the GPU of the instance that ran it; empty for CPU instances
