"""Client shared-memory regions mapped into this worker, by the id the front gave them.

A model reads an input in a client's region in place, and outputs the client asked for in its
region are written there directly: that is the zero-copy path. A system region is mapped from
the object the client registered (its identity is checked, so a name unlinked and reused since
then is refused); a CUDA region is opened from its IPC handle, on the GPU, through cupy.

Unmapping never pulls memory from under a view the model still holds: the mapping is released
when the last view goes (see Segment.close).
"""

import mmap
import os

import numpy as np
import posix_ipc

from shmserve.ipc import messages
from shmserve.ipc.locations import InRegion
from shmserve.ipc.segments import Segment
from workers import cuda


class RegionUnavailable(ValueError):
    """A request names a region this worker could not map; its message says why."""


class OutputTooLarge(ValueError):
    """An output does not fit the slice of the client's region it was asked into."""


class _CudaMapping:
    __slots__ = ("pointer", "device_id", "byte_size", "buffer")

    def __init__(self, msg: messages.MapCudaRegion):
        self.device_id = msg.device_id
        self.byte_size = msg.byte_size
        self.pointer = cuda.open_ipc_handle(msg.raw_handle, msg.device_id)
        try:
            size = cuda.allocation_size(self.pointer, msg.device_id)
            if size is not None and msg.byte_size > size:
                raise RegionUnavailable(f"byte_size {msg.byte_size} exceeds the "
                                        f"{size}-byte CUDA allocation of its handle")
            self.buffer = cuda.device_bytes(self.pointer, msg.byte_size, msg.device_id)
        except BaseException:
            cuda.close_ipc_handle(self.pointer, msg.device_id)
            raise

    def view(self, offset: int, nbytes: int):
        if offset < 0 or nbytes < 0 or offset + nbytes > self.byte_size:
            raise RegionUnavailable(f"range [{offset}, {offset}+{nbytes}) is outside the "
                                    f"region of {self.byte_size} bytes")
        return self.buffer[offset:offset + nbytes]

    def close(self) -> None:
        # cupy views made from `buffer` do not keep the IPC mapping open: the model may hold
        # none past execute (as in Triton), and the front unmaps only once no request uses it.
        self.buffer = None
        cuda.close_ipc_handle(self.pointer, self.device_id)


def wants_gpu_inputs(model_config: dict) -> bool:
    """The Python backend gives a model its inputs in host memory unless its config says
    FORCE_CPU_ONLY_INPUT_TENSORS: "no"."""
    parameter = model_config.get("parameters", {}).get("FORCE_CPU_ONLY_INPUT_TENSORS", {})
    return str(parameter.get("string_value", "yes")).lower() in ("no", "false", "0", "off")


class ClientRegions:
    def __init__(self, *, gpu_inputs: bool):
        # Whether a CUDA-region input reaches the model as a cupy view (a GPU instance whose
        # model asked for GPU inputs) rather than copied to host memory, the Python backend's
        # default.
        self._gpu_inputs = gpu_inputs
        self._mappings: dict = {}  # region id -> Segment, _CudaMapping, or why it failed (str)

    def map_system(self, msg: messages.MapSystemRegion) -> None:
        try:
            self._mappings[msg.region_id] = _map_system(msg)
        except (OSError, ValueError, posix_ipc.Error) as exc:
            self._mappings[msg.region_id] = (f"shared memory region for key '{msg.key}' cannot "
                                             f"be mapped: {exc}")

    def map_cuda(self, msg: messages.MapCudaRegion) -> None:
        try:
            self._mappings[msg.region_id] = _CudaMapping(msg)
        except Exception as exc:  # cupy's CUDA errors have no common base worth naming
            self._mappings[msg.region_id] = f"CUDA shared memory region cannot be opened: {exc}"

    def unmap(self, region_id: int) -> None:
        mapping = self._mappings.pop(region_id, None)
        if mapping is not None and not isinstance(mapping, str):
            mapping.close()

    def close(self) -> None:
        for region_id in list(self._mappings):
            self.unmap(region_id)

    def input(self, location: InRegion, datatype: str):
        """An input's bytes, in place: a memoryview, or a cupy uint8 array for a CUDA region
        when the model takes GPU inputs (copied to host memory otherwise). ValueError when
        the region is not mapped or the range leaves it."""
        mapping = self._mapping(location.region_id)
        view = mapping.view(location.offset, location.nbytes)
        if isinstance(mapping, Segment):
            return view
        return self.for_model(view, datatype)

    def for_model(self, device_view, datatype: str):
        """A tensor in device memory as the model takes it: the cupy view itself, or a host
        copy (a memoryview)."""
        if self._gpu_inputs and datatype != "BYTES":
            return device_view
        return memoryview(cuda.to_numpy(device_view))

    def in_host_memory(self, region_id: int) -> bool:
        """Whether the region is mapped here as system shared memory (not CUDA)."""
        return isinstance(self._mappings.get(region_id), Segment)

    def write(self, target: InRegion, name: str, array, serialized) -> int:
        """Write an output into the client's slice `target`; `serialized` holds a BYTES
        output's wire bytes. Returns the bytes written; OutputTooLarge when the slice is
        smaller."""
        region_id, offset, room = target.region_id, target.offset, target.nbytes
        nbytes = len(serialized) if serialized is not None else array.nbytes
        if nbytes > room:
            raise OutputTooLarge(
                f"shared memory size specified with the request for output '{name}' ({room} "
                f"bytes) should be at least {nbytes} bytes to hold the results")
        mapping = self._mapping(region_id)
        dst = mapping.view(offset, nbytes)
        if serialized is not None:
            src = np.frombuffer(serialized, np.uint8)
        else:
            src = array.reshape(-1).view(np.uint8)
        if isinstance(mapping, Segment):
            if cuda.is_device_array(src):
                src = cuda.to_numpy(src)
            np.copyto(np.frombuffer(dst, np.uint8), src)
        else:
            cuda.copy_into(dst, src)
        return nbytes

    def _mapping(self, region_id: int):
        mapping = self._mappings.get(region_id)
        if mapping is None:
            raise RegionUnavailable(f"shared memory region {region_id} is not mapped in this "
                                    f"model instance")
        if isinstance(mapping, str):
            raise RegionUnavailable(mapping)
        return mapping


def _map_system(msg: messages.MapSystemRegion) -> Segment:
    bare = msg.key.lstrip("/")
    shm = posix_ipc.SharedMemory("/" + bare)
    try:
        st = os.fstat(shm.fd)
        if [st.st_dev, st.st_ino] != list(msg.identity):
            raise RegionUnavailable("the object was removed (and maybe replaced) after the "
                                    "region was registered")
        if msg.offset + msg.byte_size > st.st_size:
            raise RegionUnavailable(f"the object shrank to {st.st_size} bytes, less than the "
                                    f"region's offset + byte_size")
        # mmap wants a page-aligned offset: map from the page the region starts in.
        skip = msg.offset % mmap.ALLOCATIONGRANULARITY
        mapping = mmap.mmap(shm.fd, skip + msg.byte_size, offset=msg.offset - skip)
    finally:
        shm.close_fd()
    return Segment(msg.key, mapping, owner=False, start=skip)
