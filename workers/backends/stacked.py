"""Framework backends that run a batch as one call: each input of the batch's requests as one
[N, ...] array (a view of the batch's block when the requests lie back to back), each request
answered with its rows of every output it asked for.

The ONNX Runtime and PyTorch backends are such models. A subclass sets `_name`,
`_instance_name`, `_max_batch_size`, `_inputs` and `_outputs` (objects with `.name` and
`.model_shape`: the shape the framework takes without the batch dimension, or None for the
request's own) and says how to feed its framework, run it and read an output:

    _feeds(stacked: {io: array}) -> feeds     (ValueError: these requests cannot run together)
    _infer(feeds) -> [result per output]      (RunError for the whole group)
    _output(io, rows, size) -> batch.Output

Requests that do not stack (a free dimension that differs, bytes the framework refuses) run
one at a time, so that only the one at fault fails.

A sequence model (`sequence_batching` with control inputs or implicit state) gets the controls
and each slot's state as more inputs (workers/sequence_extras.py), and its state outputs are
kept for the slot's next request; `_outputs` then ends with the state outputs (io.state
true), which no client can ask for.

Ragged batching (workers/backends/ragged.py): a subclass that sets `_ragged` and
`_batch_feeds` (each batch input with the ios of its targets) gets its ragged inputs flattened
across the group, the batch inputs computed for the group, and its batch outputs scattered by
the source input's shapes instead of cut into rows.
"""

import time

import numpy as np

from workers import cuda
from workers import triton_python_backend_utils as pb_utils
from workers.backends import BackendError, Context
from workers.backends.batch import Output, Request, Response, Timings, batch_view, \
    error_response, input_array
from workers.backends.ragged import NONE, RaggedBatching
from workers.sequence_extras import SequenceConfigError, SequenceExtras


class RunError(Exception):
    """The framework failed the group's run: every request of it gets this error."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class StackedModel:
    """The backend interface's Instance for a framework that runs a whole batch at once."""

    decoupled = False
    iterative = False
    has_readiness_hook = False

    _name: str
    _instance_name: str
    _max_batch_size: int
    _inputs: list
    _outputs: list
    _sequence: SequenceExtras | None = None
    _ragged: RaggedBatching = NONE
    _batch_feeds: tuple | list = ()  # (ragged.BatchInput, [io of each of its targets])

    def _start_sequences(self, context: Context) -> None:
        """The controls and state of a sequence model's slots (none for other models)."""
        try:
            self._sequence = SequenceExtras.from_config(
                context.model_config, context.model_dir, context.instance_kind,
                context.state_memory, context.state_reserve)
        except SequenceConfigError as exc:
            raise BackendError(f"sequence batching of model '{self._name}': {exc}") from None

    def is_ready(self) -> bool:
        return True

    def execute(self, requests: list[Request]) -> tuple[list[Response], Timings]:
        start = time.perf_counter_ns()
        responses: list[Response | None] = [None] * len(requests)
        arrays = {}  # index -> {input name: array}
        for index, request in enumerate(requests):
            try:
                arrays[index] = {t.name: input_array(t, request.request_id, self._name)
                                 for t in request.inputs}
                if self._sequence is not None:
                    arrays[index] = self._with_sequence_inputs(request, arrays[index])
            except ValueError as exc:
                responses[index] = error_response("INVALID_ARG", str(exc))
        groups = [list(arrays)]
        if self._max_batch_size == 0:
            groups = [[index] for index in arrays]
        timing = [0, 0, 0]
        for group in groups:
            if group:
                self._run(group, requests, arrays, responses, timing)
        if self._sequence is not None:
            for request in requests:
                self._sequence.end(request.sequence_slot, request.flags, request.ready)
        return responses, Timings(timing[0], timing[1], timing[2], start)

    def _with_sequence_inputs(self, request: Request, arrays: dict) -> dict:
        tensors = [pb_utils.Tensor._wrap(t.name, arrays[t.name], t.datatype)
                   for t in request.inputs]
        tensors = self._sequence.inputs(tensors, request.sequence_slot, request.flags,
                                        request.correlation_id, request.ready)
        return {t._name: t._array for t in tensors}

    def _run(self, group: list, requests: list, arrays: dict, responses: list,
             timing: list) -> None:
        began = time.perf_counter_ns()
        try:
            stacked, sizes = self._stack([arrays[i] for i in group])
            feeds = self._feeds(stacked)
        except ValueError as exc:
            if len(group) > 1:
                for index in group:
                    self._run([index], requests, arrays, responses, timing)
                return
            responses[group[0]] = error_response("INVALID_ARG", f"{type(exc).__name__}: {exc}")
            return
        fed = time.perf_counter_ns()
        try:
            results = self._infer(feeds)
            if sizes[0] is not None:
                self._check_rows(results, sum(sizes))
            scattered = self._scatter(results, [arrays[i] for i in group])
        except RunError as exc:
            for index in group:
                responses[index] = error_response(exc.code, exc.message)
            timing[1] += time.perf_counter_ns() - fed
            return
        ran = time.perf_counter_ns()
        row = 0
        for position, (index, size) in enumerate(zip(group, sizes)):
            request = requests[index]
            wanted = set(request.requested_output_names)
            outputs, states = [], []
            for io, result in zip(self._outputs, results):
                if io in scattered:
                    if io.name in wanted:
                        part = scattered[io][position]
                        outputs.append(Output(io.name, io.wire, list(part.shape), part))
                elif io.name in wanted or io.state:
                    part = result[row:row + size] if size is not None else result
                    (states if io.state else outputs).append(self._output(io, part, size))
            responses[index] = Response(outputs, None, {})
            if states:
                error = self._sequence.capture(
                    request.sequence_slot, request.ready, pb_utils.InferenceResponse(
                        [pb_utils.Tensor._wrap(o.name, o.array, o.datatype) for o in states]))
                if error is not None:
                    responses[index] = error_response("INTERNAL", error)
            if size is not None:
                row += size
        timing[0] += fed - began
        timing[1] += ran - fed
        timing[2] += time.perf_counter_ns() - ran

    def _stack(self, arrays: list) -> tuple[dict, list]:
        """{io: the group's array of that input} for requests whose inputs are `arrays`
        ({name: array} each), and each request's batch size (None for a model that does not
        batch). ValueError when the requests' inputs cannot be stacked."""
        batching = self._max_batch_size > 0
        sizes = [None] * len(arrays)
        stacked = {}
        for io in self._inputs:
            parts = [a[io.name] for a in arrays if io.name in a]
            if not parts:
                continue  # an optional input no request gave
            if len(parts) != len(arrays):
                raise ValueError(f"input '{io.name}' is missing from some requests")
            if batching:
                sizes = [p.shape[0] if p.ndim else 1 for p in parts]
            if io.name in self._ragged.ragged:
                # Every request's elements back to back, one flat tensor for the group.
                parts = [p.reshape(-1) for p in parts]
                stacked[io] = parts[0] if len(parts) == 1 else _concatenate(parts)
                continue
            array = parts[0] if not batching or len(parts) == 1 else _concatenate(parts)
            if io.model_shape is not None:
                array = array.reshape(([sum(sizes)] if batching else []) + io.model_shape)
            stacked[io] = array
        for batch_input, ios in self._batch_feeds:
            shapes = [a[batch_input.source].shape for a in arrays if batch_input.source in a]
            if len(shapes) != len(arrays):
                raise ValueError(f"input '{batch_input.source}', the source of batch input "
                                 f"'{batch_input.targets[0]}', is missing from some requests")
            array = batch_input.array(shapes)
            for io in ios:
                stacked[io] = array
        return stacked, sizes

    def _scatter(self, results: list, arrays: list) -> dict:
        """{io: each request's part} of the batch outputs among `results`, for requests whose
        inputs are `arrays`."""
        scattered = {}
        for io, result in zip(self._outputs, results):
            batch_output = self._ragged.batch_outputs.get(io.name)
            if batch_output is None:
                continue
            if isinstance(result, list):  # a List[str] from TorchScript: refused at load
                raise RunError("INTERNAL", f"batch output '{io.name}' must be a tensor")
            try:
                scattered[io] = batch_output.scatter(
                    result, [a[batch_output.source].shape for a in arrays])
            except (ValueError, KeyError) as exc:
                raise RunError("INTERNAL", f"model '{self._name}': {exc}") from None
        return scattered

    def _check_rows(self, results: list, rows: int) -> None:
        for io, result in zip(self._outputs, results):
            if io.name in self._ragged.batch_outputs:
                continue  # its parts follow the input shapes, not the batch's rows
            count = len(result) if getattr(result, "ndim", 1) else 0
            if count != rows:
                raise RunError("INTERNAL", f"output '{io.name}' of model '{self._name}' has "
                                           f"{count} rows for a batch of {rows}")

    def _feeds(self, stacked: dict):
        raise NotImplementedError

    def _infer(self, feeds) -> list:
        raise NotImplementedError

    def _output(self, io, rows, size):
        raise NotImplementedError


def _concatenate(parts: list):
    if cuda.is_device_array(parts[0]):
        return cuda.concatenate(parts)
    stacked = None if parts[0].dtype.hasobject else batch_view(parts)
    return stacked if stacked is not None else np.concatenate(parts)
