"""The shared-memory extension: regions of client memory, registered by name, that requests
name instead of carrying tensor bytes.

The front never maps a client region: it checks a system region once at registration
(object type, bounds) and remembers which object it was; workers map regions, by id, when a
batch first uses them there (see dispatch/region_mapping.py; the Region records themselves are in
dispatch/memory_regions.py), so a tensor goes from the client's memory to the model with no
copy. A region stays usable by requests that hold it after it is unregistered; once the last
one ends, the workers that mapped it are told to unmap it.
"""

import base64
import functools

from shmserve.dispatch.memory_regions import (CudaRegion, Region, RegionSlice, SystemRegion,
                                              inspect_object)
from shmserve.errors import Code, ReadError, ServerError
from shmserve.ipc.segments import is_server_segment

# What a CUDA IPC handle is: sizeof(cudaIpcMemHandle_t).
CUDA_IPC_HANDLE_SIZE = 64
# Triton's Python backend names its own segments so; a client may not register them.
_RESERVED_PREFIX = "triton_python_backend_shm_region_"

# The largest byte size plus offset Triton's size_t holds.
_SIZE_MAX = 2**64 - 1


class RegionError(ReadError):
    """A tensor names a region badly."""


class SharedMemoryManager:
    def __init__(self, *, allowed: bool = True, gpu_count: int = 0):
        self.allowed = allowed
        self._gpu_count = gpu_count
        # System and CUDA regions share one namespace of names.
        self._regions: dict[str, SystemRegion | CudaRegion] = {}

    # -- the extension's API ------------------------------------------------------------

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self._check_allowed()
        bare = key.lstrip("/")
        if not bare:
            raise ServerError(Code.INVALID_ARG, f"cannot register shared memory region "
                                                f"'{name}' - invalid shm key '{key}'")
        if bare.startswith(_RESERVED_PREFIX):
            raise ServerError(Code.INVALID_ARG, f"cannot register shared memory region "
                                                f"'{name}' with key '{key}' as the key contains "
                                                f"the reserved prefix '{_RESERVED_PREFIX}'")
        self._check_name(name)
        # Triton's words, then why
        where = f"failed to register shared memory region '{name}': invalid args"
        if is_server_segment(key):
            raise ServerError(Code.INVALID_ARG, f"{where}: key '{key}' names a segment of the "
                                                f"server itself")
        if offset < 0 or byte_size <= 0:
            raise ServerError(Code.INVALID_ARG, f"{where}: offset must not be negative and "
                                                f"byte_size must be positive")
        identity, size = inspect_object(key, where)
        if offset + byte_size > size:
            raise ServerError(Code.INVALID_ARG,
                              f"{where}: offset {offset} + byte_size {byte_size} exceeds the "
                              f"{size} bytes of shared-memory object '{key}'")
        self._regions[name] = SystemRegion(name, byte_size, key=key, offset=offset,
                                           identity=identity)

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        self._check_allowed()
        self._check_name(name)
        where = "failed to register shared memory region: invalid args"
        if len(raw_handle) != CUDA_IPC_HANDLE_SIZE:
            raise ServerError(Code.INVALID_ARG, f"{where}: raw_handle has {len(raw_handle)} "
                                                f"bytes, a cudaIpcMemHandle_t has "
                                                f"{CUDA_IPC_HANDLE_SIZE}")
        if not 0 <= device_id < self._gpu_count:
            raise ServerError(Code.INVALID_ARG, f"{where}: no GPU with id {device_id} (this "
                                                f"machine has {self._gpu_count})")
        if byte_size <= 0:
            raise ServerError(Code.INVALID_ARG, f"{where}: byte_size must be positive")
        self._regions[name] = CudaRegion(name, byte_size, raw_handle=raw_handle,
                                         device_id=device_id)

    def unregister_system(self, name: str = "") -> None:
        self._check_allowed()
        self._unregister(SystemRegion, name)

    def unregister_cuda(self, name: str = "") -> None:
        self._check_allowed()
        self._unregister(CudaRegion, name)

    def system_status(self, name: str = "") -> list[dict]:
        return self._status(SystemRegion, name)

    def cuda_status(self, name: str = "") -> list[dict]:
        return self._status(CudaRegion, name)

    def unregister_all(self) -> None:
        """At shutdown: every region goes, whatever still uses it."""
        for region in self._regions.values():
            region.unregistered = True
        self._regions.clear()

    # -- requests -----------------------------------------------------------------------

    def slice(self, parameters: dict) -> RegionSlice:
        """The slice of a registered region that a tensor's parameters name (offsets relative
        to the region); NOT_FOUND for an unknown region, INVALID_ARG when the slice is empty or
        leaves it. The caller holds the region (Region.users) while the request may touch it."""
        name = parameters["shared_memory_region"]
        region = self._regions.get(name)
        if region is None:
            raise RegionError(Code.NOT_FOUND, f"Unable to find shared memory region: '{name}'")
        nbytes = parameters.get("shared_memory_byte_size", 0)
        offset = parameters.get("shared_memory_offset", 0)
        if not 0 <= offset < region.byte_size:
            raise RegionError(Code.INVALID_ARG,
                              f"Invalid offset for shared memory region: '{name}'")
        if nbytes > _SIZE_MAX - offset:  # Triton's size_t would wrap
            raise RegionError(Code.INVALID_ARG,
                              f"Integer overflow detected: byte_size ({nbytes}) + offset "
                              f"({offset}) exceeds maximum value ({_SIZE_MAX}) for region "
                              f"'{name}'")
        if nbytes <= 0 or offset + nbytes > region.byte_size:
            raise RegionError(Code.INVALID_ARG,
                              f"Invalid offset + byte size for shared memory region: '{name}'")
        return RegionSlice(region, offset, nbytes)

    # -- helpers ------------------------------------------------------------------------

    def _check_allowed(self) -> None:
        if not self.allowed:
            raise ServerError(Code.UNSUPPORTED, "Client shared memory is disabled. Start the "
                                                "server with '--allow-client-shm=true' to "
                                                "enable.")

    def _check_name(self, name: str) -> None:
        if name in self._regions:
            raise ServerError(Code.ALREADY_EXISTS, f"shared memory region '{name}' already in "
                                                   f"manager")

    def _unregister(self, kind: type, name: str) -> None:
        self._check_allowed()
        if name:
            region = self._regions.get(name)
            names = [name] if isinstance(region, kind) else []
        else:
            names = [n for n, r in self._regions.items() if isinstance(r, kind)]
        for n in names:
            region = self._regions[n]
            region.unregistered = True
            if region.users == 0:
                del self._regions[n]
                region._retire()
            else:
                # As Triton since 2.53: listed (and usable) until the requests that use it
                # end, then gone without another unregister.
                region.forget = functools.partial(self._forget, n, region)

    def _forget(self, name: str, region: Region) -> None:
        if self._regions.get(name) is region:
            del self._regions[name]

    def _status(self, kind: type, name: str) -> list[dict]:
        if name:
            region = self._regions.get(name)
            if region is None:
                raise ServerError(Code.NOT_FOUND, f"Unable to find {_KIND_NAMES[kind]} shared "
                                                  f"memory region: '{name}'")
            if not isinstance(region, kind):
                raise ServerError(Code.NOT_FOUND,
                                  f"The region named '{name}' is registered as "
                                  f"{_KIND_TITLES[type(region)]} shared memory, not "
                                  f"{_KIND_TITLES[kind]} shared memory")
            return [region.status()]
        return [self._regions[n].status() for n in sorted(self._regions)
                if isinstance(self._regions[n], kind)]


_KIND_NAMES = {SystemRegion: "system", CudaRegion: "cuda"}
_KIND_TITLES = {SystemRegion: "system", CudaRegion: "CUDA"}


def decode_raw_handle(b64: str) -> bytes:
    """The cudaIpcMemHandle_t that HTTP carries in base64; INVALID_ARG for anything else."""
    try:
        raw = base64.b64decode(b64, validate=True)
    except (ValueError, TypeError):
        raw = b""
    if len(raw) != CUDA_IPC_HANDLE_SIZE:
        raise ServerError(Code.INVALID_ARG,
                          "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
    return raw
