"""Where a tensor lies, as the control frames between the front and a worker say it: one small
struct per kind of place, so that both sides build and read a location by its fields.

Each struct is a NamedTuple whose last field is its kind, a tag with the struct's own default:
msgpack writes a tuple as the array it is, `[field, ..., kind]`, with no conversion, and the
receiving side turns each array back into its struct by that tag (`from_wire`, called by the
frames that carry locations, messages.py). The kind goes last so that code builds
`InRegion(region_id, offset, nbytes)` and never names it.

    InInputArena(offset, nbytes)     the batch's input block, in the worker's input arena
    InOutputArena(offset, nbytes)    an output in the worker's output arena
    InRegion(region_id, offset, nbytes)
                                     a slice of a region the worker has mapped: a client's
                                     region (an input, or the slice an output is asked into),
                                     or a BLS target's output arena (a BLS output)
    WrittenToRegion(region_id, nbytes)
                                     an output the worker wrote into the client's slice
    OnDevice(raw_handle, device_id, offset, nbytes)
                                     an input in another GPU instance's device memory, by the
                                     CUDA IPC handle of the allocation it lies in
    KeptOnDevice(raw_handle, device_id, offset, nbytes, keep_id)
                                     an output the worker keeps in its device memory until the
                                     front releases `keep_id`
    InCallArena(offset, nbytes)      a BLS input in the calling worker's BLS arena

Two places have no struct. A tensor that travels inline is its bytes. An input within the
batch's input block is located by a bare `(offset, nbytes)` pair, the one location array of two
elements: every input of every request has one, and a struct would cost a Python object per
input on each side, which is most of what a small request's frames cost to make and read.
"""

from typing import Any, NamedTuple

IN_INPUT_ARENA = 1
IN_OUTPUT_ARENA = 2
IN_REGION = 3
WRITTEN_TO_REGION = 4
ON_DEVICE = 5
KEPT_ON_DEVICE = 6
IN_CALL_ARENA = 7


class InInputArena(NamedTuple):
    offset: int
    nbytes: int
    kind: int = IN_INPUT_ARENA


class InOutputArena(NamedTuple):
    offset: int
    nbytes: int
    kind: int = IN_OUTPUT_ARENA


class InRegion(NamedTuple):
    region_id: int
    offset: int
    nbytes: int
    kind: int = IN_REGION


class WrittenToRegion(NamedTuple):
    region_id: int
    nbytes: int
    kind: int = WRITTEN_TO_REGION


class OnDevice(NamedTuple):
    raw_handle: bytes  # a cudaIpcMemHandle_t
    device_id: int
    offset: int
    nbytes: int
    kind: int = ON_DEVICE


class KeptOnDevice(NamedTuple):
    raw_handle: bytes  # a cudaIpcMemHandle_t
    device_id: int
    offset: int
    nbytes: int
    keep_id: int
    kind: int = KEPT_ON_DEVICE


class InCallArena(NamedTuple):
    offset: int
    nbytes: int
    kind: int = IN_CALL_ARENA


KINDS: dict[int, Any] = {IN_INPUT_ARENA: InInputArena, IN_OUTPUT_ARENA: InOutputArena,
                         IN_REGION: InRegion, WRITTEN_TO_REGION: WrittenToRegion,
                         ON_DEVICE: OnDevice, KEPT_ON_DEVICE: KeptOnDevice,
                         IN_CALL_ARENA: InCallArena}

# tuple.__new__ makes a struct of the array as it is, without the struct's own __new__ (a call
# to Python code per location): the frames come from the other side's structs.
_struct_of = tuple.__new__


def from_wire(w: list) -> Any:
    """The struct of a location array a frame carried, from the peer's own struct."""
    return _struct_of(KINDS[w[-1]], w)


def checked(w) -> Any:
    """The struct of a location array that may be malformed (what a model's call into the
    server names); ValueError when it names no kind or has the wrong number of fields."""
    try:
        kind = KINDS[w[-1]]
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"not a tensor location: {w!r}") from None
    if len(w) != len(kind._fields):
        raise ValueError(f"not a tensor location: {w!r}")
    return _struct_of(kind, w)
