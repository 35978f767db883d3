"""Model warmup (config `model_warmup`), as Triton runs it: before a model version serves (and
before an instance an instance-group update adds joins it), each of its instances runs every
warmup sample, and the model is ready only if every one succeeds.

A sample is `batch_size` requests run together as one batch, `count` times (at least once; a
sample of batch size 0 is skipped). Its inputs hold zeros, random bytes (zeros for BYTES,
which would not parse otherwise) or the bytes of a file in the model's `warmup/` folder, each
with the batch dimension 1 prepended for a model that batches. The requests are checked as a
client's would be (admission.py), in the same words, and then go straight to the instance, past
the scheduler; as in Triton they count in the model's statistics. An input the sample names
that the config does not (a sequence control, which the worker makes itself) is left out. A
failure makes the version UNAVAILABLE with Triton's reason: "failed to run warmup sample
'<name>': <each response's error>; ".

The loader calls `warm_up(mv, instance, model_dir)` once an instance has started (the host
hands it this function: the repository layer sits below admission).
"""

import asyncio
import os
import time
from dataclasses import dataclass

from shmserve import admission
from shmserve.dispatch.stream import ResponseStream
from shmserve.errors import Code, ServerError, invalid_arg
from shmserve.inference import InferRequest, InputTensor
from shmserve.ipc import datatypes
from shmserve.proto import DataType

# Where a sample's input_data_file lies, under the model's folder (Triton's name).
WARMUP_FOLDER = "warmup"
_UNKNOWN_ID = "[request id: <id_unknown>] "
_STRING = DataType.Value("TYPE_STRING")


@dataclass(frozen=True)
class Sample:
    name: str
    batch_size: int
    count: int
    inputs: tuple  # of (name, wire datatype, shape without the batch dimension, bytes)


def samples(config, model_dir: str, max_tensor_bytes: int) -> list[Sample]:
    """The config's warmup samples with their data; ServerError (INVALID_ARG) in Triton's
    words for one that cannot be built. `max_tensor_bytes` bounds each input, as it bounds a
    client's (a config may come from a load request)."""
    built = []
    for setting in config.model_warmup:
        if setting.batch_size == 0:
            continue
        names = sorted(setting.inputs)  # a map: an order of our own, the same every time
        sizes = {}
        for name in names:
            spec = setting.inputs[name]
            dims = list(spec.dims)
            if any(d < 0 for d in dims):
                if all(d >= -1 for d in dims):
                    raise invalid_arg("warmup setting expects all variable-size dimensions "
                                      f"are specified for input '{name}'")
                raise invalid_arg(f"tensor '{name}' contains an invalid dimension "
                                  f"[{','.join(str(d) for d in dims)}]")
            count = datatypes.element_count(dims)
            is_bytes = spec.data_type == _STRING
            nbytes = count * (4 if is_bytes else
                              datatypes.element_size(_wire(spec.data_type, name)))
            if nbytes > max_tensor_bytes:
                raise invalid_arg(f"warmup sample '{setting.name}': input '{name}' would take "
                                  f"{nbytes} bytes, more than the {max_tensor_bytes} bytes "
                                  "this server takes for a tensor")
            sizes[name] = nbytes
        inputs = []
        for name in names:
            spec = setting.inputs[name]
            is_bytes = spec.data_type == _STRING
            nbytes = sizes[name]
            kind = spec.WhichOneof("input_data_type")
            if kind == "zero_data" or (kind == "random_data" and is_bytes):
                data = bytes(nbytes)  # BYTES: each element an empty string
            elif kind == "random_data":
                data = os.urandom(nbytes)
            elif kind == "input_data_file":
                data = _read(os.path.join(model_dir, WARMUP_FOLDER, spec.input_data_file),
                             max_tensor_bytes)
                if not is_bytes:
                    if len(data) < nbytes:
                        raise invalid_arg(f"{_UNKNOWN_ID}warmup setting expects {nbytes} bytes, "
                                          "but the data provided from "
                                          f"{spec.input_data_file}only has {len(data)} bytes")
                    data = data[:nbytes]
            else:
                raise invalid_arg(f"{_UNKNOWN_ID}warmup setting expects input '{name}' to "
                                  "have input_data_type set")
            inputs.append((name, _wire(spec.data_type, name), list(spec.dims), data))
        built.append(Sample(setting.name, setting.batch_size, max(setting.count, 1),
                            tuple(inputs)))
    return built


def _wire(data_type: int, name: str) -> str:
    config_name = DataType.Name(data_type)
    try:
        return datatypes.config_to_wire(config_name)
    except KeyError:
        raise invalid_arg(f"warmup input '{name}' has data type {config_name}") from None


def _read(path: str, limit: int) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise invalid_arg(f"failed to open text file for read {path}: "
                          f"{exc.strerror or exc}") from None
    if len(data) > limit:
        raise invalid_arg(f"warmup data file {path} is larger than the {limit} bytes this "
                          "server takes for a tensor")
    return data


async def warm_up(mv, instance, model_dir: str,
                  max_tensor_bytes: int = admission.MAX_TENSOR_BYTE_SIZE) -> None:
    """Run the version's warmup samples on one of its started instances; ServerError for the
    first sample that fails (or cannot be built)."""
    if not mv.config.model_warmup:
        return
    for sample in samples(mv.config, model_dir, max_tensor_bytes):
        for _ in range(sample.count):
            await _run(mv, instance, sample, max_tensor_bytes)


async def _run(mv, instance, sample: Sample, max_tensor_bytes: int) -> None:
    sig = mv.signature
    batching = sig.max_batch_size > 0
    works = []
    for slot in range(sample.batch_size):
        request = InferRequest(model_name=mv.name, inputs=[
            InputTensor(name, datatype, ([1] if batching else []) + shape, data)
            for name, datatype, shape, data in sample.inputs if name in sig.inputs])
        try:
            work, _ = admission.prepare(request, mv, None, max_tensor_bytes)
        except ServerError as exc:
            raise ServerError(exc.code, f"{_UNKNOWN_ID}{exc.message}") from None
        if mv.config.HasField("sequence_batching"):
            # A slot of its own. An implicit state the sample leaves in it stays until a
            # sequence's START there replaces it (at most one state per warmup request).
            work.sequence_slot = slot
        if mv.decoupled:
            work.stream = ResponseStream()
        works.append(work)
    allowed = sig.max_batch_size
    if sample.batch_size > max(allowed, 1):
        # Triton's backends refuse the batch, once for each of its requests.
        error = f"batch size {sample.batch_size} for '{instance.instance_name}', max allowed " \
                f"is {allowed}"
        raise _failed(sample, [error] * sample.batch_size)
    started = time.perf_counter_ns()
    errors = []
    if mv.decoupled:
        # Read while the batch runs: the worker holds a decoupled model's next response
        # until the front has taken the one before.
        reads = [asyncio.ensure_future(_stream_errors(work.stream)) for work in works]
        try:
            (responses, timings), *per_request = await asyncio.gather(instance.execute(works),
                                                                      *reads)
        except BaseException:
            for read in reads:
                read.cancel()
            for work in works:
                work.stream.cancel()
            raise
        for request_errors in per_request:
            errors += request_errors
    else:
        responses, timings = await instance.execute(works)
        for response in responses:
            if response.error is not None:
                errors.append(response.error.message)
            if response.release is not None:
                response.release()
    request_ns = time.perf_counter_ns() - started
    if errors:
        raise _failed(sample, errors)
    stats = mv.stats
    for _ in works:
        stats.record_success(batch_size=1, request_ns=request_ns, queue_ns=0,
                             compute_input_ns=timings.compute_input_ns,
                             compute_infer_ns=timings.compute_infer_ns,
                             compute_output_ns=timings.compute_output_ns,
                             device=timings.gpu_uuid)
    stats.record_execution(len(works), timings)


async def _stream_errors(stream: ResponseStream) -> list[str]:
    """The errors among a decoupled request's responses, read to its final one."""
    errors = []
    while True:
        response, final = await stream.get()
        if response is not None:
            if response.error is not None:
                errors.append(response.error.message)
            if response.release is not None:
                response.release()
        if final:
            return errors
        stream.consumed()


def _failed(sample: Sample, errors: list[str]) -> ServerError:
    return ServerError(Code.INVALID_ARG, f"failed to run warmup sample '{sample.name}': "
                                         + "".join(f"{error}; " for error in errors))

