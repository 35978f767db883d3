"""Admission: whether a request may run on a model, and the record of one that may.

`prepare` checks a decoded request against the model's signature (its inputs' names,
datatypes, shapes and bytes, the outputs it asks for, the parameters the server consumes)
and makes the WorkRequest the scheduler runs. The checks are pure functions of the request,
the model and the limits they are given, so each can be tested alone. Their messages are
Triton's, byte for byte, since clients and tests compare them with what Triton answers.

`Admitted` is what a request that passed carries on its way (lifecycle.py): its work
request, its batch size, its priority and timeout, and when it came.
"""

from dataclasses import dataclass

from shmserve.dispatch.memory_regions import RegionSlice
from shmserve.dispatch.work_types import WorkInput, WorkRequest
from shmserve.errors import BackendReadError, Code, ReadError, ServerError
from shmserve.extensions.client_regions import SharedMemoryManager
from shmserve.inference import InferRequest
from shmserve.ipc import datatypes

# Request parameters the server consumes; the model sees the others through parameters().
RESERVED_PARAMETERS = frozenset(("sequence_id", "sequence_start", "sequence_end", "priority",
                                 "timeout", "binary_data_output", "headers"))
SEQUENCE_START = 1
SEQUENCE_END = 2

# The default of --max-tensor-byte-size (see docs/limits.md): as much as Triton's largest
# gRPC message could carry.
MAX_TENSOR_BYTE_SIZE = 2**31

# Triton's words after a shape mismatch on a model with a batch dimension.
_BATCH_DIM_NOTE = ("NOTE: Setting a non-zero max_batch_size in the model config requires a batch "
                   "dimension to be prepended to each input shape. If you want to specify the "
                   "full shape including the batch dim in your input dims config, try setting "
                   "max_batch_size to zero. See the model configuration docs for more info on "
                   "max_batch_size.")


@dataclass(slots=True)
class Admitted:
    """A request that passed admission, as it travels to its scheduler and back. Read-only
    by use, though not frozen: a frozen dataclass's __init__ costs several times a plain
    one's, and one is made for every request."""

    work: WorkRequest
    batch_size: int
    priority: int
    timeout_us: int
    started: int  # time.perf_counter_ns() as the request reached the dataplane


def prepare(request: InferRequest, mv, shared_memory: SharedMemoryManager,
            max_tensor_bytes: int = MAX_TENSOR_BYTE_SIZE) -> tuple[WorkRequest, int]:
    """Validate a request against the model; the WorkRequest and its batch size."""
    sig = mv.signature
    name = mv.name
    batching = sig.max_batch_size > 0
    inputs = []
    regions = []  # the client regions the request uses
    seen = {}  # input names in request order
    batch_size = 1
    for t in request.inputs:
        spec = sig.inputs.get(t.name)
        if spec is None:
            raise ReadError(Code.INVALID_ARG,
                            f"unexpected inference input '{t.name}' for model '{name}'")
        if t.name in seen:
            raise ServerError(Code.INVALID_ARG,
                              f"input '{t.name}' already exists in request")
        seen[t.name] = None
        if t.datatype != spec.datatype:
            raise ServerError(Code.INVALID_ARG,
                              f"inference input '{t.name}' data-type is '{t.datatype}', but "
                              f"model '{name}' expects '{spec.datatype}'")
        shape = t.shape
        if any((not isinstance(d, int)) or d < 0 for d in shape):
            raise ServerError(Code.INVALID_ARG,
                              f"unexpected shape for input '{t.name}' for model '{name}'. "
                              f"Shape dimensions must be non-negative integers, got {_fmt(shape)}")
        if batching:
            if not shape:
                raise ServerError(Code.INVALID_ARG,
                                  f"input '{t.name}' has no shape but model requires batch "
                                  f"dimension for '{name}'")
            this_batch = shape[0]
            if this_batch > sig.max_batch_size:
                raise ServerError(Code.INVALID_ARG,
                                  f"inference request batch-size must be <= "
                                  f"{sig.max_batch_size} for '{name}'")
            if this_batch < 1:
                raise ServerError(Code.INVALID_ARG,
                                  f"inference request batch-size must be >= 1 for '{name}'")
            if inputs and this_batch != batch_size:
                raise ServerError(Code.INVALID_ARG,
                                  f"input '{t.name}' batch size does not match other inputs "
                                  f"for '{name}'")
            batch_size = this_batch
            item_shape = shape[1:]
        else:
            item_shape = shape
        if not _dims_match(item_shape, spec.dims):
            expected = ([-1] if batching else []) + list(spec.dims)
            raise ServerError(Code.INVALID_ARG,
                              f"unexpected shape for input '{t.name}' for model '{name}'. "
                              f"Expected {_fmt(expected)}, got {_fmt(shape)}. "
                              f"{_BATCH_DIM_NOTE if batching else ''}")
        if t.data is None:
            if "shared_memory_region" not in t.parameters:
                raise ServerError(Code.INVALID_ARG, f"input '{t.name}' has no data")
            data = shared_memory.slice(t.parameters)
            regions.append(data.region)
        else:
            data = t.data
            if type(data) is RegionSlice:  # an ensemble step's input, read where it lies
                regions.append(data.region)
        check_byte_size(t, data, name, max_tensor_bytes)
        model_shape = list(shape)
        if spec.reshape is not None:
            model_shape = ([shape[0]] if batching else []) + _reshape(spec.reshape, item_shape)
        inputs.append(WorkInput(t.name, t.datatype, model_shape, data))
    if len(seen) != len(sig.inputs):
        missing = [n for n, s in sig.inputs.items() if n not in seen and not s.optional]
        if missing:
            required = sum(1 for s in sig.inputs.values() if not s.optional)
            expected = (f"{required} inputs" if required == len(sig.inputs) else
                        f"number of inputs between {required} and {len(sig.inputs)}")
            raise ServerError(Code.INVALID_ARG,
                              f"expected {expected} but got {len(seen)} inputs for model "
                              f"'{name}'. Got input(s) {_names(seen)}, but missing required "
                              f"input(s) {_names(missing)}. Please provide all required input(s).")
    output_regions = {}
    if request.outputs:
        requested = []
        for o in request.outputs:
            if o.name not in sig.outputs:
                raise ReadError(Code.INVALID_ARG,
                                f"unexpected inference output '{o.name}' for model '{name}'")
            if o.name in requested:  # as Triton since 2.69
                raise ServerError(Code.INVALID_ARG,
                                  f"output '{o.name}' already exists in request")
            if o.parameters:
                _check_classification(o, sig, name)
                if "shared_memory_region" in o.parameters:
                    output_regions[o.name] = piece = shared_memory.slice(o.parameters)
                    regions.append(piece.region)
            requested.append(o.name)
    else:
        requested = list(sig.outputs)
    params = request.parameters
    model_params = {k: v for k, v in params.items() if k not in RESERVED_PARAMETERS} if params else {}
    flags = 0
    if params:
        if bool_parameter(params, "sequence_start"):
            flags |= SEQUENCE_START
        if bool_parameter(params, "sequence_end"):
            flags |= SEQUENCE_END
    work = WorkRequest(request.id, params.get("sequence_id", 0), flags, model_params, inputs,
                       requested, output_regions=output_regions, regions=regions)
    return work, batch_size


def uint_parameter(params: dict, name: str) -> int:
    value = params.get(name, 0) if params else 0
    if type(value) is not int:
        raise ReadError(Code.INVALID_ARG, f"invalid value type for '{name}' parameter, "
                                          f"expected int64_param.")
    if value < 0:
        raise ReadError(Code.INVALID_ARG, f"invalid value for '{name}', expected value >= 0.")
    return value


def bool_parameter(params: dict, name: str) -> bool:
    value = params.get(name, False)
    if type(value) is not bool:
        raise ReadError(Code.INVALID_ARG, f"invalid value type for '{name}' parameter, "
                                          f"expected bool_param.")
    return value


def _dims_match(shape, dims) -> bool:
    if len(shape) != len(dims):
        return False
    for got, want in zip(shape, dims):
        if want != -1 and got != want:
            return False
    return True


def _reshape(reshape: tuple, item_shape: list) -> list:
    """The shape the model sees; a -1 in the reshape takes the remaining elements."""
    if -1 not in reshape:
        return list(reshape)
    total = datatypes.element_count(item_shape)
    known = 1
    for d in reshape:
        if d != -1:
            known *= d
    return [total // known if known and d == -1 else d for d in reshape]


def check_byte_size(t, data, model: str, limit: int) -> None:
    """`data`: the tensor's bytes, or the RegionSlice of a client region it fills exactly. The
    elements of a BYTES tensor in a region are the worker's to check: only it reads them.
    A tensor above `limit` bytes is refused before any of it is copied for the model."""
    count = datatypes.element_count(t.shape)
    if t.datatype == "BYTES":
        nbytes = len(data) if isinstance(data, (bytes, bytearray)) else data.nbytes
        if nbytes > limit:
            raise _too_large(t.name, model, nbytes, limit)
        if type(data) is RegionSlice:
            return  # the worker checks the elements, before it allocates for them
        try:
            datatypes.check_bytes(data, count)
        except datatypes.BytesLayoutError as exc:
            raise _bytes_layout_error(exc, t.name, model, count) from None
        return
    expected = count * datatypes.element_size(t.datatype)
    if expected > limit:
        raise _too_large(t.name, model, expected, limit)
    nbytes = len(data) if isinstance(data, (bytes, bytearray)) else data.nbytes
    if nbytes != expected:
        raise ServerError(Code.INVALID_ARG,
                          f"input byte size mismatch for input '{t.name}' for model '{model}'. "
                          f"Expected {expected}, got {nbytes}")


def _bytes_layout_error(exc, name: str, model: str, count: int) -> ServerError:
    # The one Triton's backend finds counts the request as failed (see BackendReadError).
    kind = BackendReadError if exc.problem == "data" else ServerError
    return kind(Code.INVALID_ARG, exc.describe(name, model, count))


def _too_large(name: str, model: str, nbytes: int, limit: int) -> ServerError:
    return ServerError(Code.INVALID_ARG, f"input '{name}' for model '{model}' has {nbytes} "
                                         f"bytes, more than the maximum tensor byte size of "
                                         f"{limit} (--max-tensor-byte-size)")


def _check_classification(o, sig, model: str) -> None:
    k = o.parameters.get("classification")
    if k is None:
        return
    if type(k) is not int or k < 0:
        raise ServerError(Code.INVALID_ARG, f"Unable to set 'classification' of output "
                                            f"'{o.name}': expected an integer >= 0")
    if "shared_memory_region" in o.parameters:
        raise ServerError(Code.INVALID_ARG, "Output can't set both 'shared_memory_region' and "
                                            "'classification'")


def _fmt(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _names(names) -> str:
    return "[" + ",".join(f"'{n}'" for n in names) + "]"
