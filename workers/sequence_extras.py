"""A sequence model's per-request extras: the control tensors Triton's sequence batcher injects
(`sequence_batching.control_input`) and the implicit state it keeps for each batch slot
(`sequence_batching.state`). The model sees both as ordinary inputs.

Everything that does not depend on the request is built once per model: the true and false
tensors of each boolean control, the whole set of extras of a null request (READY false), the
initial state. A request then costs a list copy, a correlation-id tensor and a dict lookup.

State: the output `output_name` of a request becomes the input `input_name` of the next
request of its slot. A request with START gets the initial state (the slot's old state is
dropped), and the slot's state is dropped once a request with END is done. A null request
reads the initial state and updates nothing. Host state is copied into a block of the state
arena, a shared-memory segment the front created for this instance, and handed to the model as
a read-only view of it; when the arena is full it is copied onto the heap instead. A GPU
instance keeps a state the model produced on the GPU where it is; BYTES states are object
arrays and stay on the heap.

Initial state, as Triton documents it: without `initial_state`, a START request's state holds
unspecified data, shaped by `dims` with 1 for every variable-size dimension (zeros here);
`zero_data` gives zeros of the initial state's `dims`; `data_file` gives the bytes, row-major,
of `<model directory>/initial_state/<data_file>`. The tensor has a leading batch dimension of
1 when max_batch_size > 0.

Triton's correlation-id control truncates ids to 32 bits for TYPE_INT32/TYPE_UINT32 and
passes string ids as a BYTES tensor (TYPE_STRING). A string id for a numeric control gets, as
Triton 2.51 gives it (probed), the first bytes of the id's serialized BYTES element, little
endian: its 4-byte length, then its characters, zero-padded ("a" is 97 << 32 | 1 for UINT64).
Triton copies the whole element there and crashes on ids longer than 4 characters; we stop at
the control's width.
"""

import logging
import os
import struct
import threading
from dataclasses import dataclass

import numpy as np

from shmserve.ipc import datatypes
from shmserve.ipc.allocator import ArenaAllocator
from workers import cuda
from workers import triton_python_backend_utils as pb_utils

log = logging.getLogger(__name__)

START = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
END = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END

_FLAG_KINDS = {"CONTROL_SEQUENCE_START": START, "CONTROL_SEQUENCE_END": END}
_READY_KIND = "CONTROL_SEQUENCE_READY"
_CORRID_KIND = "CONTROL_SEQUENCE_CORRID"
# *_false_true field -> (wire datatype, numpy dtype)
_BOOLEAN_FORMS = {
    "int32_false_true": ("INT32", np.dtype("<i4")),
    "fp32_false_true": ("FP32", np.dtype("<f4")),
    "bool_false_true": ("BOOL", np.dtype(np.bool_)),
}
# correlation-id data type -> (wire datatype, numpy dtype, packer of an unsigned of its width);
# packing and viewing the bytes is the cheapest way to a one-element array (~0.4 us).
_CORRID_TYPES = {
    "TYPE_UINT64": ("UINT64", np.dtype("<u8"), struct.Struct("<Q")),
    "TYPE_INT64": ("INT64", np.dtype("<i8"), struct.Struct("<Q")),
    "TYPE_UINT32": ("UINT32", np.dtype("<u4"), struct.Struct("<I")),
    "TYPE_INT32": ("INT32", np.dtype("<i4"), struct.Struct("<I")),
}


class SequenceConfigError(ValueError):
    """The sequence_batching section cannot be served (a bad initial state, say)."""


@dataclass(slots=True)
class _State:
    input_name: str
    output_name: str
    datatype: str  # wire name
    initial: pb_utils.Tensor  # read-only, shared by every slot


@dataclass(slots=True)
class _Held:
    """A slot's state: the tensor the next request gets, and its arena block (None: heap or
    device memory)."""

    tensor: pb_utils.Tensor
    offset: int | None


class SequenceExtras:
    """The extra inputs of one instance of a sequence model, and the state of its slots."""

    def __init__(self, model_config: dict, model_dir: str, instance_kind: str,
                 state_memory: memoryview | None, reserve=None):
        batching = model_config["sequence_batching"]
        batched = model_config.get("max_batch_size", 0) > 0
        self._control_shape = (1, 1) if batched else (1,)
        flag_controls = []  # (flag bit or None for READY, false tensor, true tensor)
        self._corrid = None  # (name, wire datatype, numpy dtype, packer)
        for control_input in batching.get("control_input", ()):
            name = control_input["name"]
            for control in control_input.get("control", ()):
                # Triton's JSON leaves out an enum at its default, CONTROL_SEQUENCE_START.
                kind = control.get("kind", "CONTROL_SEQUENCE_START")
                if kind == _CORRID_KIND:
                    self._corrid = (name, *_corrid_type(control.get("data_type")))
                elif kind in _FLAG_KINDS or kind == _READY_KIND:
                    false, true = self._boolean_tensors(name, control)
                    flag_controls.append((_FLAG_KINDS.get(kind), false, true))
        self._states = [_state(entry, model_dir, batched) for entry in batching.get("state", ())]
        self._state_of_output = {s.output_name: i for i, s in enumerate(self._states)}

        # The boolean controls of a ready request, by its flags & (START | END).
        self._by_flags = [
            [true if bit is None or flags & bit else false for bit, false, true in flag_controls]
            for flags in range(4)
        ]
        self._null = [false for _, false, _ in flag_controls]
        if self._corrid is not None:
            self._null.append(self._corrid_tensor(0 if self._corrid[1] != "BYTES" else ""))
        self._null.extend(s.initial for s in self._states)
        self._names = frozenset(t.name() for t in self._null)

        self._gpu = instance_kind == "GPU"
        self._held: dict[int, list[_Held | None]] = {}
        # A decoupled model's responses, which update state, may come from its own threads.
        self._lock = threading.Lock()
        self._memory = state_memory
        # reserve(end) -> bool: memory backs the arena's first `end` bytes (see
        # segments.Segment.reserve); writing a sparse page on a full /dev/shm would be a SIGBUS.
        self._reserve = reserve
        self._alloc = None if state_memory is None else ArenaAllocator(len(state_memory))
        if self._states and state_memory is None:
            log.warning("no state arena for this instance: implicit state stays on the heap")

    @classmethod
    def from_config(cls, model_config: dict, model_dir: str, instance_kind: str,
                    state_memory: memoryview | None = None,
                    reserve=None) -> "SequenceExtras | None":
        """The extras of a model with `sequence_batching` control inputs or states, else
        None."""
        batching = model_config.get("sequence_batching")
        if batching is None or not (batching.get("control_input") or batching.get("state")):
            return None
        return cls(model_config, model_dir, instance_kind, state_memory, reserve)

    @property
    def arena_used(self) -> int:
        """Bytes of the state arena held by slots' states."""
        return 0 if self._alloc is None else self._alloc.used

    # --- per request ------------------------------------------------------------------------

    def inputs(self, inputs: list, slot: int, flags: int, correlation_id, ready: bool) -> list:
        """`inputs` with the request's controls and state added; an extra replaces a request
        input of the same name. ValueError for a correlation id the CORRID control cannot
        hold."""
        if ready:
            extras = list(self._by_flags[flags & (START | END)])
            if self._corrid is not None:
                extras.append(self._corrid_tensor(correlation_id))
            if self._states:
                extras.extend(self._state_inputs(slot, flags & START))
        else:
            extras = self._null
        names = self._names
        return [t for t in inputs if t._name not in names] + extras

    def capture(self, slot: int, ready: bool, response: pb_utils.InferenceResponse) -> str | None:
        """Keep the state outputs of a ready request's response as its slot's state; an error
        message (and nothing kept) when one has the wrong data type."""
        if not ready or not self._states or response.has_error():
            return None
        found = []
        for tensor in response.output_tensors():
            index = self._state_of_output.get(tensor._name)
            if index is None:
                continue
            state = self._states[index]
            if tensor._datatype != state.datatype:
                return (f"implicit state output '{state.output_name}' has data type "
                        f"{tensor._datatype}, but its sequence_batching.state declares "
                        f"{datatypes.wire_to_config(state.datatype)}")
            found.append((index, tensor))
        if found:
            with self._lock:
                held = self._held.setdefault(slot, [None] * len(self._states))
                for index, tensor in found:
                    old = held[index]
                    held[index] = self._keep(self._states[index], tensor._array)
                    if old is not None:
                        self._free(old)
        return None

    def end(self, slot: int, flags: int, ready: bool) -> None:
        """A request is done (answered for good, not rescheduled): END drops its slot's state."""
        if ready and flags & END and self._states:
            with self._lock:
                self._drop(slot)

    # --- controls ---------------------------------------------------------------------------

    def _boolean_tensors(self, name: str, control: dict) -> tuple:
        for field, (datatype, dtype) in _BOOLEAN_FORMS.items():
            pair = control.get(field)
            if pair:
                return tuple(pb_utils.Tensor._wrap(name, _constant(self._control_shape, value,
                                                                   dtype), datatype)
                             for value in pair)
        raise SequenceConfigError(
            f"control '{name}' ({control.get('kind', 'CONTROL_SEQUENCE_START')}) gives none of "
            f"{', '.join(_BOOLEAN_FORMS)}")

    def _corrid_tensor(self, correlation_id) -> pb_utils.Tensor:
        name, datatype, dtype, packer = self._corrid
        if datatype == "BYTES":
            if not isinstance(correlation_id, str):
                correlation_id = str(correlation_id)
            array = np.empty(self._control_shape, dtype=np.object_)
            array.fill(correlation_id.encode())
        else:
            if isinstance(correlation_id, str):
                correlation_id = _serialized_prefix(correlation_id, packer.size)
            mask = (1 << (8 * packer.size)) - 1
            array = np.frombuffer(packer.pack(correlation_id & mask), dtype)
            array = array.reshape(self._control_shape)
        return pb_utils.Tensor._wrap(name, array, datatype)

    # --- state ------------------------------------------------------------------------------

    def _state_inputs(self, slot: int, start: int) -> list:
        with self._lock:
            if start:
                self._drop(slot)
                return [s.initial for s in self._states]
            held = self._held.get(slot)
            if held is None:
                return [s.initial for s in self._states]
            return [s.initial if h is None else h.tensor for s, h in zip(self._states, held)]

    def _keep(self, state: _State, array) -> _Held:
        name, datatype = state.input_name, state.datatype
        if cuda.is_device_array(array):
            if self._gpu:
                return _Held(pb_utils.Tensor._wrap(name, array, datatype, cuda.device_id(array)),
                             None)
            array = cuda.to_numpy(array)
        if datatype == "BYTES" or self._alloc is None:
            return _Held(pb_utils.Tensor._wrap(name, _read_only(array.copy()), datatype), None)
        nbytes = array.nbytes
        offset = self._alloc.alloc(nbytes)
        if offset is not None and self._reserve is not None and not self._reserve(offset + nbytes):
            self._alloc.free(offset)
            log.warning("no room in /dev/shm: state '%s' of %d bytes kept on the heap", name,
                        nbytes)
            offset = None
        elif offset is None:
            log.warning("state arena full (%d of %d bytes held): state '%s' of %d bytes kept "
                        "on the heap", self._alloc.used, self._alloc.capacity, name, nbytes)
        if offset is None:
            return _Held(pb_utils.Tensor._wrap(name, _read_only(array.copy()), datatype), None)
        view = np.frombuffer(self._memory[offset:offset + nbytes], dtype=array.dtype)
        view = view.reshape(array.shape)
        np.copyto(view, array)
        return _Held(pb_utils.Tensor._wrap(name, _read_only(view), datatype), offset)

    def _drop(self, slot: int) -> None:
        held = self._held.pop(slot, None)
        if held is not None:
            for h in held:
                if h is not None:
                    self._free(h)

    def _free(self, held: _Held) -> None:
        if held.offset is not None:
            self._alloc.free(held.offset)


def _serialized_prefix(correlation_id: str, size: int) -> int:
    raw = correlation_id.encode()
    element = struct.pack("<I", len(raw)) + raw[:size]
    return int.from_bytes(element[:size].ljust(size, b"\0"), "little")


def extra_tensors(model_config: dict) -> tuple[list, list]:
    """The control and state inputs a sequence model takes, and the state outputs it gives, as
    a config's tensor entries ({name, data_type, dims}, dims without the batch dimension): a
    backend that checks its model against the config checks these too."""
    batching = model_config.get("sequence_batching") or {}
    inputs, outputs = [], []
    for control_input in batching.get("control_input", ()):
        for control in control_input.get("control", ()):
            if control.get("kind", "CONTROL_SEQUENCE_START") == _CORRID_KIND:
                data_type = control.get("data_type", "TYPE_UINT64")
            else:
                data_type = next((datatypes.wire_to_config(wire)
                                  for field, (wire, _) in _BOOLEAN_FORMS.items()
                                  if control.get(field)), "TYPE_INT32")
            inputs.append({"name": control_input["name"], "data_type": data_type,
                           "dims": [1]})
    for state in batching.get("state", ()):
        dims = [int(d) for d in state.get("dims", ())]
        inputs.append({"name": state["input_name"], "data_type": state["data_type"],
                       "dims": dims})
        outputs.append({"name": state["output_name"], "data_type": state["data_type"],
                        "dims": dims})
    return inputs, outputs


def _corrid_type(data_type) -> tuple:
    if data_type == "TYPE_STRING":
        return "BYTES", np.dtype(np.object_), None
    try:
        return _CORRID_TYPES[data_type]
    except KeyError:
        raise SequenceConfigError(
            f"{_CORRID_KIND} control has data type {data_type}; allowed are TYPE_UINT64, "
            "TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING") from None


def _state(entry: dict, model_dir: str, batched: bool) -> _State:
    input_name, output_name = entry["input_name"], entry["output_name"]
    try:
        datatype = datatypes.config_to_wire(entry["data_type"])
    except KeyError:
        raise SequenceConfigError(
            f"state '{input_name}' has data type {entry['data_type']}") from None
    initial = _initial_array(entry, datatype, model_dir)
    if batched:
        initial = initial.reshape((1, *initial.shape))
    return _State(input_name, output_name, datatype,
                  pb_utils.Tensor._wrap(input_name, _read_only(initial), datatype))


def _initial_array(entry: dict, datatype: str, model_dir: str) -> np.ndarray:
    dtype = datatypes.numpy_dtype(datatype)
    name = entry["input_name"]
    initial_states = entry.get("initial_state") or []
    if not initial_states:
        return _zeros([1 if d == -1 else d for d in entry.get("dims", ())], datatype)
    if len(initial_states) > 1:
        raise SequenceConfigError(f"state '{name}' has more than one initial_state")
    initial = initial_states[0]
    if initial.get("data_type", "TYPE_INVALID") not in ("TYPE_INVALID", entry["data_type"]):
        raise SequenceConfigError(
            f"initial state of '{name}' has data type {initial['data_type']}, the state has "
            f"{entry['data_type']}")
    dims = list(initial.get("dims", ()))
    if any(d < 0 for d in dims):
        raise SequenceConfigError(
            f"initial state of '{name}' has dims {dims}; they must not be variable-size")
    if "data_file" in initial:
        path = os.path.join(model_dir, "initial_state", initial["data_file"])
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise SequenceConfigError(
                f"cannot read the initial state of '{name}': {exc}") from None
        count = datatypes.element_count(dims)
        try:
            if datatype == "BYTES":
                array = np.empty(count, dtype=np.object_)
                array[:] = datatypes.deserialize_bytes(data, count)
                return array.reshape(dims)
            expected = count * dtype.itemsize
            if len(data) != expected:
                raise ValueError(f"{len(data)} bytes for {expected} expected")
        except ValueError as exc:
            raise SequenceConfigError(
                f"initial state file '{path}' does not match dims {dims} of "
                f"{entry['data_type']}: {exc}") from None
        return np.frombuffer(data, dtype=dtype).reshape(dims)
    if "zero_data" in initial:
        return _zeros(dims, datatype)
    raise SequenceConfigError(f"initial state of '{name}' gives neither zero_data nor data_file")


def _zeros(dims: list, datatype: str) -> np.ndarray:
    if datatype == "BYTES":
        return np.full(dims, b"", dtype=np.object_)
    return np.zeros(dims, dtype=datatypes.numpy_dtype(datatype))


def _constant(shape: tuple, value, dtype: np.dtype) -> np.ndarray:
    return _read_only(np.full(shape, value, dtype=dtype))


def _read_only(array: np.ndarray) -> np.ndarray:
    # Shared by requests (a constant) or by the slot's next request (a state): no model may
    # write into it.
    array.flags.writeable = False
    return array
