"""Control frames exchanged between the front and a worker.

Each message is a named struct with a type tag; on the wire it is a msgpack array
`[tag, field, ...]` (arrays rather than maps keep frames small and encoding cheap on the
hot path). Tensors travel as `TensorRef`s, each located by its bytes (inline) or by one of the
location structs of locations.py.

The inputs of a batch travel as one block: `Execute.input_block` is either inline bytes or
`InInputArena(offset, nbytes)`, a slot of the input arena, and an input's location is a bare
`(offset, nbytes)` pair within that block. The front lays the block out input-major (each
input name's tensors of all requests back to back, in batch order; padding between names keeps
each name's run aligned), so a batched model can view one input of the whole batch as one
array. An output's location is inline bytes or `InOutputArena(offset, nbytes)`, a slot of the
output arena, which the worker allocates. The front created both arenas for the worker.

Tensors in a client's shared-memory region (see shmserve/extensions/client_regions.py) are
not in the block: an input's location is then `InRegion(region_id, offset, nbytes)`, and a
request's `output_regions` names the slices (`InRegion`s) its outputs go to; the worker writes
them there and answers with the location `WrittenToRegion(region_id, nbytes)`, metadata only.
The front sends `MapSystemRegion`/`MapCudaRegion` before the first batch that uses a region,
and `UnmapRegion` once the region is unregistered and no request uses it.

A GPU instance keeps the outputs a request names in `device_outputs` (an ensemble's
intermediates that only GPU steps read) in its device memory, when the model made them there:
their location is `KeptOnDevice(raw_handle, device_id, offset, nbytes, keep_id)`, by the CUDA
IPC handle of the allocation they lie in. The front passes `OnDevice(raw_handle, device_id,
offset, nbytes)` on as an input of the next step, whose instance opens the handle for that
batch only and closes it before it answers; then the front sends the producer `Release` with
the keep ids, and it lets the arrays go. So no handle is open anywhere once the memory behind
it may be freed.

Each request also names its row of the worker's request table (see request_table.py). A
decoupled model answers each request with any number of `StreamResponse`s, from any thread,
at any time, the last one marked final; its batch's `Result` then only ends the execution.

A model's calls into the server (BLS, model control) go the other way: the worker sends a
`ServerCall` and the front answers with `ServerReply` frames carrying the call's id. Small BLS
tensors travel inline. A large input is written by the caller into its BLS arena (a segment
the front created for it) and travels as `InCallArena(offset, nbytes)`, read in place by the
target instance; the caller frees it after the call's final reply. A large output travels as
`InRegion(region_id, offset, nbytes)` of the target's output arena, which the front has the
caller map (`MapSystemRegion`) first: the caller copies it out and sends a "release" call with
the same id, which gives the target's slots back.

A request may come with a prepared answer (`RequestFrame.prepared_answer`): the bytes around
its outputs in the answer to its client, and the outputs (name, datatype, shape, size) those
bytes announce. The front lends the clients' sockets for a batch, before its `Execute`, over a
second socket (`Init.loan_fd`): one packet per batch, the batch id as 8 little-endian bytes
and the batch's distinct sockets as SCM_RIGHTS; each answer names its socket by its index
there (an HTTP/2 connection carries many calls). When the model's response has exactly
those outputs, all inline and nothing else, the worker writes the answer to the socket itself:
its `ResponseFrame` says so (`written_by_worker`) instead of carrying the outputs, and the
worker writes after it has sent the batch's `Result`, so that the front serves the connection's
next request meanwhile (it holds its own writes to the socket until the worker is done). A
socket's answers go in one write, in request order. Then the worker tells the front what the
sockets did not take, for the front to write before anything else, which returns the loans:
at once in a `Written` frame when a socket left some (its client waits for the rest).
Otherwise the news rides on the next batch's `Result` (`Result.written`) when that batch was
already waiting, else goes in a `Written` frame before the worker waits for frames: one frame
and one wake of the front fewer per batch. While it waits to be told, the batch is marked in
the request table (see request_table.py), so that the front knows, should the worker die, that
those connections hold whole answers.
"""

from dataclasses import dataclass, field
from typing import Any, Optional, Union

from shmserve.ipc import locations
from shmserve.ipc.locations import InInputArena

# The most client sockets lent with one batch: what SCM_RIGHTS carries in one message (the
# kernel's SCM_MAX_FD).
MAX_LENT_SOCKETS = 253

(INIT, READY, EXECUTE, RESULT, RELEASE, SHUTDOWN, BYE, STREAM_RESPONSE, MAP_SYSTEM_REGION,
 MAP_CUDA_REGION, UNMAP_REGION, CHECK_READY, READY_STATE, SERVER_CALL, SERVER_REPLY,
 METRICS_REPORT, WRITTEN) = range(1, 18)


@dataclass(slots=True)
class TensorRef:
    name: str
    datatype: str
    shape: list
    # Input: (offset, nbytes) within the batch's input block, InRegion or OnDevice. Output:
    # bytes (inline data), InOutputArena, WrittenToRegion or KeptOnDevice; a BLS output: bytes
    # or InRegion (bytes once the caller copied it out). None only while batch_layout.layout
    # places a batch's inputs. See locations.py.
    location: Union[bytes, tuple, list, None]

    def to_wire(self) -> list:
        return [self.name, self.datatype, self.shape, self.location]

    @staticmethod
    def input_from_wire(w: list) -> "TensorRef":
        if len(w[3]) > 2:  # not an (offset, nbytes) pair within the block
            w[3] = locations.from_wire(w[3])
        return TensorRef(*w)

    @staticmethod
    def output_from_wire(w: list) -> "TensorRef":
        if type(w[3]) is list:  # not inline bytes
            w[3] = locations.from_wire(w[3])
        return TensorRef(*w)


@dataclass(slots=True)
class Init:
    model_name: str
    model_version: int
    model_dir: str
    model_repository: str
    model_config: dict  # normalized config, rendered as Triton's JSON
    instance_name: str
    instance_kind: str  # "CPU" or "GPU"
    device_id: int
    input_arena: str
    output_arena: str
    request_table: str
    inline_threshold: int
    # Holds the implicit state of the instance's sequence slots; "" for a model without state.
    state_arena: str = ""
    # The eventfd (inherited under this number) that wakes a sender waiting for the front to
    # consume responses (see request_table.py); -1 for none.
    wake_fd: int = -1
    # Where the model's large BLS inputs go (see ServerCall); "" for none.
    bls_arena: str = ""
    # The socket (inherited under this number) that clients' sockets lent for prepared
    # answers arrive on; -1 for none.
    loan_fd: int = -1
    # The eventfd (inherited under this number) each write of which asks for a MetricsReport:
    # the front asks at every scrape of /metrics; -1 for none.
    metrics_fd: int = -1
    # A Python-based backend's folder, whose model.py runs the model; "" for other models.
    runtime_dir: str = ""

    def to_wire(self) -> list:
        return [INIT, self.model_name, self.model_version, self.model_dir, self.model_repository,
                self.model_config, self.instance_name, self.instance_kind, self.device_id,
                self.input_arena, self.output_arena, self.request_table, self.inline_threshold,
                self.state_arena, self.wake_fd, self.bls_arena, self.loan_fd,
                self.metrics_fd, self.runtime_dir]

    @staticmethod
    def from_wire(w: list) -> "Init":
        return Init(*w[1:])


@dataclass(slots=True)
class Ready:
    error: str = ""  # empty when the model initialized
    # The model defines is_ready(): the front asks it (CheckReady) when readiness is queried.
    readiness_hook: bool = False
    # A KIND_GPU instance's GPU, as CUDA names it ("GPU-<uuid>"); empty when none or unknown.
    gpu_uuid: str = ""

    def to_wire(self) -> list:
        return [READY, self.error, self.readiness_hook, self.gpu_uuid]

    @staticmethod
    def from_wire(w: list) -> "Ready":
        return Ready(w[1], w[2], w[3])


@dataclass(slots=True)
class CheckReady:
    """Asks the model's is_ready(); answered with ReadyState."""

    def to_wire(self) -> list:
        return [CHECK_READY]

    @staticmethod
    def from_wire(w: list) -> "CheckReady":
        return CheckReady()


@dataclass(slots=True)
class ReadyState:
    ready: bool

    def to_wire(self) -> list:
        return [READY_STATE, self.ready]

    @staticmethod
    def from_wire(w: list) -> "ReadyState":
        return ReadyState(w[1])


@dataclass(slots=True)
class RequestFrame:
    request_id: str
    correlation_id: Union[int, str]
    flags: int
    parameters: dict
    inputs: list  # of TensorRef
    requested_outputs: list  # of str
    row: int  # in the worker's request table
    # Output name -> InRegion: outputs the client wants in its own memory.
    output_regions: dict = field(default_factory=dict)
    # A sequence model's request: the batch slot of its sequence on this instance (-1 for a
    # model without sequence batching), and whether the slot holds a request at all (a
    # direct-strategy batch fills idle slots below its highest with null requests).
    sequence_slot: int = -1
    ready: bool = True
    # The id of the request's trace, 0 when it is not traced: a BLS request the model makes
    # with `trace=request.trace()` is traced as its child.
    trace_id: int = 0
    # Its OpenTelemetry context (JSON), "" unless it is traced in the opentelemetry mode.
    trace_context: str = ""
    # Outputs to keep in device memory if the model made them there (DEVICE_MEMORY).
    device_outputs: Union[list, tuple] = field(default_factory=list)
    # Its prepared answer, or None: [socket index, pieces, [[name, datatype, shape, nbytes],
    # ...]], the answer being pieces[0], output 0, pieces[1], ..., output n-1, pieces[n].
    prepared_answer: Optional[list] = None
    timeout_us: int = 0  # the request's timeout, which `request.timeout()` gives the model

    def to_wire(self) -> list:
        return [self.request_id, self.correlation_id, self.flags, self.parameters,
                [t.to_wire() for t in self.inputs], self.requested_outputs, self.row,
                self.output_regions, self.sequence_slot, self.ready, self.trace_id,
                self.trace_context, self.device_outputs, self.prepared_answer, self.timeout_us]

    @staticmethod
    def from_wire(w: list) -> "RequestFrame":
        output_regions = w[7]
        if output_regions:
            output_regions = {name: locations.from_wire(slice_)
                              for name, slice_ in output_regions.items()}
        return RequestFrame(w[0], w[1], w[2], w[3], [TensorRef.input_from_wire(t) for t in w[4]],
                            w[5], w[6], output_regions, w[8], w[9], w[10], w[11], w[12], w[13],
                            w[14])


@dataclass(slots=True)
class Execute:
    batch_id: int
    # The bytes of every input of the batch: inline, or where they lie in the input arena.
    input_block: Union[bytes, memoryview, InInputArena]
    requests: list  # of RequestFrame
    # Its one request came while the front had no other in flight: the worker polls for that
    # client's next request under a lower threshold (see ipc/idle_spin.py).
    lone: bool = False

    def to_wire(self) -> list:
        return [EXECUTE, self.batch_id, self.input_block, [r.to_wire() for r in self.requests],
                self.lone]

    @staticmethod
    def from_wire(w: list) -> "Execute":
        block = w[2]
        if type(block) is list:
            block = locations.from_wire(block)
        return Execute(w[1], block, [RequestFrame.from_wire(r) for r in w[3]], w[4])


@dataclass(slots=True)
class ResponseFrame:
    error: Optional[list]  # [code name, message] or None
    outputs: list  # of TensorRef
    parameters: dict = field(default_factory=dict)
    # The error is the model's own answer (see errors.ModelError.answered).
    answered: bool = False
    # The worker writes the request's prepared answer itself, after the Result (see Written).
    written_by_worker: bool = False

    def to_wire(self) -> list:
        return [self.error, [t.to_wire() for t in self.outputs], self.parameters, self.answered,
                self.written_by_worker]

    @staticmethod
    def from_wire(w: list) -> "ResponseFrame":
        return ResponseFrame(w[0], [TensorRef.output_from_wire(t) for t in w[1]], w[2], w[3], w[4])


@dataclass(slots=True)
class Result:
    batch_id: int
    # Of ResponseFrame, one per request of the batch, in order; empty for a decoupled model.
    responses: list
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    # Indices (in the batch) of the requests an iterative-sequence model asked to run again
    # (TRITONSERVER_REQUEST_RELEASE_RESCHEDULE): they have no response yet, or no final one.
    rescheduled: list = field(default_factory=list)
    # When the worker began the batch (time.perf_counter_ns: CLOCK_MONOTONIC, which the front
    # shares), for traces.
    compute_start_ns: int = 0
    # [batch id, unsent] of earlier batches whose answers the worker has written since it
    # last told the front (see Written), to be handled before this batch's own.
    written: list = field(default_factory=list)

    def to_wire(self) -> list:
        return [RESULT, self.batch_id, [r.to_wire() for r in self.responses],
                self.compute_input_ns, self.compute_infer_ns, self.compute_output_ns,
                self.rescheduled, self.compute_start_ns, self.written]

    @staticmethod
    def from_wire(w: list) -> "Result":
        return Result(w[1], [ResponseFrame.from_wire(r) for r in w[2]], w[3], w[4], w[5], w[6],
                      w[7], w[8])


@dataclass(slots=True)
class Written:
    """The worker has written the answers its batch's Result said it would
    (`written_by_worker`): what the sockets did not take, as [request's index in the batch,
    bytes] for those that left some, for the front to write first. The worker writes no more
    to such a socket. Sent alone only when no batch waits to carry it (`Result.written`)."""

    batch_id: int
    unsent: list = field(default_factory=list)

    def to_wire(self) -> list:
        return [WRITTEN, self.batch_id, self.unsent]

    @staticmethod
    def from_wire(w: list) -> "Written":
        return Written(w[1], w[2])


@dataclass(slots=True)
class StreamResponse:
    """One response of a decoupled model's request (its table row); `response` is None for
    a final flag sent alone."""

    row: int
    final: bool
    response: Optional[ResponseFrame]

    def to_wire(self) -> list:
        return [STREAM_RESPONSE, self.row, self.final,
                None if self.response is None else self.response.to_wire()]

    @staticmethod
    def from_wire(w: list) -> "StreamResponse":
        return StreamResponse(w[1], w[2], None if w[3] is None else ResponseFrame.from_wire(w[3]))


@dataclass(slots=True)
class Release:
    """Output-arena slots the front has finished copying out, and the keep ids of device
    outputs no instance reads any more."""

    offsets: list
    kept: list = field(default_factory=list)

    def to_wire(self) -> list:
        return [RELEASE, self.offsets, self.kept]

    @staticmethod
    def from_wire(w: list) -> "Release":
        return Release(w[1], w[2])


@dataclass(slots=True)
class MapSystemRegion:
    region_id: int
    key: str  # the POSIX shared-memory object
    offset: int  # of the region in the object
    byte_size: int
    identity: list  # [st_dev, st_ino] of the object the client registered

    def to_wire(self) -> list:
        return [MAP_SYSTEM_REGION, self.region_id, self.key, self.offset, self.byte_size,
                self.identity]

    @staticmethod
    def from_wire(w: list) -> "MapSystemRegion":
        return MapSystemRegion(*w[1:])


@dataclass(slots=True)
class MapCudaRegion:
    region_id: int
    raw_handle: bytes  # a cudaIpcMemHandle_t
    device_id: int
    byte_size: int

    def to_wire(self) -> list:
        return [MAP_CUDA_REGION, self.region_id, self.raw_handle, self.device_id, self.byte_size]

    @staticmethod
    def from_wire(w: list) -> "MapCudaRegion":
        return MapCudaRegion(*w[1:])


@dataclass(slots=True)
class UnmapRegion:
    region_id: int

    def to_wire(self) -> list:
        return [UNMAP_REGION, self.region_id]

    @staticmethod
    def from_wire(w: list) -> "UnmapRegion":
        return UnmapRegion(w[1])


@dataclass(slots=True)
class Shutdown:
    def to_wire(self) -> list:
        return [SHUTDOWN]

    @staticmethod
    def from_wire(w: list) -> "Shutdown":
        return Shutdown()


@dataclass(slots=True)
class Bye:
    def to_wire(self) -> list:
        return [BYE]

    @staticmethod
    def from_wire(w: list) -> "Bye":
        return Bye()


@dataclass(slots=True)
class ServerCall:
    """A model's call into the server (worker to front), answered by ServerReply frames with
    its `call_id`. `kind` is "infer" (BLS), "load", "unload", "ready" (model control),
    "cancel" (the caller left a call's replies unread: stop it), "cancel_request" (a decoupled
    infer call's caller asks the model to stop, and reads on to the final reply) or "release"
    (the caller copied out the outputs of the call's oldest reply that had any by
    reference)."""

    call_id: int
    kind: str
    args: dict

    def to_wire(self) -> list:
        return [SERVER_CALL, self.call_id, self.kind, self.args]

    @staticmethod
    def from_wire(w: list) -> "ServerCall":
        return ServerCall(w[1], w[2], w[3])


@dataclass(slots=True)
class ServerReply:
    """One answer to a ServerCall: a BLS response (outputs inline or by reference) or a
    control call's outcome (`response` holds only an error, if any; `value` the answer). The
    last reply of a call is `final`; a decoupled model's final flag alone comes with
    `response` None."""

    call_id: int
    final: bool
    response: Optional[ResponseFrame]
    value: Any = None

    def to_wire(self) -> list:
        return [SERVER_REPLY, self.call_id, self.final,
                None if self.response is None else self.response.to_wire(), self.value]

    @staticmethod
    def from_wire(w: list) -> "ServerReply":
        return ServerReply(w[1], w[2], None if w[3] is None else ResponseFrame.from_wire(w[3]),
                           w[4])


@dataclass(slots=True)
class MetricsReport:
    """The worker's answer to the front's asks for its custom metrics (pb_utils.MetricFamily;
    see Init.metrics_fd): `answered`, how many asks it has answered in all, and `families`,
    None when nothing changed since its last answer, else
    [[name, description, kind, [[labels, value, updated], ...]], ...], kind 0 counter,
    1 gauge, 2 histogram (value: [bounds, counts per bucket then +Inf, sum, count]);
    `updated` is the CLOCK_MONOTONIC time of the series' last change."""

    answered: int
    families: Optional[list]

    def to_wire(self) -> list:
        return [METRICS_REPORT, self.answered, self.families]

    @staticmethod
    def from_wire(w: list) -> "MetricsReport":
        return MetricsReport(w[1], w[2])


_BY_TAG: dict[int, Any] = {INIT: Init, READY: Ready, EXECUTE: Execute, RESULT: Result, RELEASE: Release,
           SHUTDOWN: Shutdown, BYE: Bye, STREAM_RESPONSE: StreamResponse,
           MAP_SYSTEM_REGION: MapSystemRegion, MAP_CUDA_REGION: MapCudaRegion,
           UNMAP_REGION: UnmapRegion, CHECK_READY: CheckReady, READY_STATE: ReadyState,
           SERVER_CALL: ServerCall, SERVER_REPLY: ServerReply, METRICS_REPORT: MetricsReport,
           WRITTEN: Written}


def from_wire(w: list) -> Any:
    """Decode a frame's msgpack array into its message; ValueError for unknown tags."""
    try:
        cls = _BY_TAG[w[0]]
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"unknown control frame {w[:1]!r}") from None
    return cls.from_wire(w)
