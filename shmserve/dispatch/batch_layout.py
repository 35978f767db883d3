"""How a batch's requests and input bytes travel to a worker in its Execute frame.

The batch's input bytes travel as one block, input-major (`layout`), so that a batched model
views each input of the batch as one array (`pb_utils.batched_input`): inline in the frame
when small, else in one slot of the worker's input arena (`place_block`), freed when the
batch's Result frame comes back. Tensors that lie elsewhere (a client's region, another
instance's GPU) travel as references to where they lie, outside the block.
"""

from typing import Optional

from shmserve.dispatch.arena import InputArena
from shmserve.dispatch.memory_regions import RegionSlice
from shmserve.dispatch.work_types import DeviceTensor
from shmserve.ipc import messages
from shmserve.ipc.locations import InInputArena, InRegion, OnDevice

# Tensors up to this size travel inside the control frame: for small tensors a memcpy into
# the frame is cheaper than an arena slot and its release message. For inputs it bounds the
# batch's whole input block.
INLINE_THRESHOLD = 64 * 1024
# Each input name's run of tensors starts at a multiple of this in the input block, so that
# every tensor stays as aligned as one placed alone (arena slots are 64-byte aligned).
BLOCK_ALIGNMENT = 64


def layout(batch: list, rows: list, sockets: Optional[list] = None
           ) -> tuple[list, list, int]:
    """The batch's RequestFrames, with its input bytes laid out as one block, input-major: for
    each input name, in order of first appearance, the tensors of that name of every request
    that has one, back to back in batch order (so a batched model can view them as one array).

    `rows`: per request, its row of the worker's request table. `sockets`: per request, the
    index of the client socket its prepared answer goes to, or -1 when the front answers it
    (None: the front answers all).

    Returns the frames (each input located within the block), the block's pieces in order
    (alignment padding included), and the block's size.
    """
    frames = []
    placed = []  # (TensorRef, its bytes)
    for index, (req, row) in enumerate(zip(batch, rows)):
        refs = []
        for t in req.inputs:
            data = t.data
            if type(data) is RegionSlice:
                refs.append(messages.TensorRef(t.name, t.datatype, t.shape, InRegion(
                    data.region.region_id, data.offset, data.nbytes)))
                continue
            if type(data) is DeviceTensor:
                refs.append(messages.TensorRef(t.name, t.datatype, t.shape, OnDevice(
                    data.raw_handle, data.device_id, data.offset, data.nbytes)))
                continue
            ref = messages.TensorRef(t.name, t.datatype, t.shape, None)
            refs.append(ref)
            placed.append((ref, data))
        output_regions = {name: InRegion(s.region.region_id, s.offset, s.nbytes)
                          for name, s in req.output_regions.items()}
        trace = req.trace
        trace_id, trace_context = (0, "") if trace is None else (trace.id, trace.context)
        prepared = None
        if sockets is not None and sockets[index] >= 0:
            prepared = [sockets[index], *req.prepared_answer.frame]
        frames.append(messages.RequestFrame(req.request_id, req.correlation_id, req.flags,
                                            req.parameters, refs, req.requested_outputs, row,
                                            output_regions, req.sequence_slot, req.ready,
                                            trace_id, trace_context, req.device_outputs,
                                            prepared, req.timeout_us))
    if len(batch) > 1:  # one request's input names are distinct: already input-major
        placed = _by_name(placed)
    pieces = []
    size = 0
    name = None
    for ref, data in placed:
        if ref.name != name:
            name = ref.name
            pad = -size % BLOCK_ALIGNMENT
            if pad:
                pieces.append(bytes(pad))
                size += pad
        n = data.nbytes if isinstance(data, memoryview) else len(data)
        ref.location = (size, n)
        pieces.append(data)
        size += n
    return frames, pieces, size


def place_block(arena: InputArena, pieces: list, nbytes: int) -> tuple:
    """(the Execute frame's input block, its slot in `arena` or None)."""
    if nbytes > INLINE_THRESHOLD:
        slot = arena.put(pieces, nbytes)
        if slot is not None:
            return InInputArena(slot, nbytes), slot
        # arena full: correctness over speed, the block goes inline
    # msgpack copies a lone piece into the frame as it is: joining would copy it twice.
    return (pieces[0] if len(pieces) == 1 else b"".join(pieces)), None


def _by_name(placed: list) -> list:
    """`placed` grouped by input name, names in order of first appearance, order kept within."""
    runs: dict = {}
    for pair in placed:
        run = runs.get(pair[0].name)
        if run is None:
            runs[pair[0].name] = [pair]
        else:
            run.append(pair)
    return [pair for run in runs.values() for pair in run]
