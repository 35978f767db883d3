"""The shared-memory extension: regions of client memory, registered by name, that requests
name instead of carrying tensor bytes.

The front never maps a client region: it checks a system region once at registration
(object type, bounds) and remembers which object it was; workers map regions, by id, when a
batch first uses them there (see dispatch/worker.py), so a tensor goes from the client's
memory to the model with no copy. A region stays usable by requests that hold it after it is
unregistered; once the last one ends, the workers that mapped it are told to unmap it.
"""

import base64
import functools
import itertools
import os
import stat
from dataclasses import dataclass, field

import posix_ipc

from shmserve.errors import Code, ReadError, ServerError
from shmserve.ipc.shm import is_server_segment

# What a CUDA IPC handle is: sizeof(cudaIpcMemHandle_t).
CUDA_IPC_HANDLE_SIZE = 64
# Triton's Python backend names its own segments so; a client may not register them.
_RESERVED_PREFIX = "triton_python_backend_shm_region_"

_region_ids = itertools.count(1)
# The largest byte size plus offset Triton's size_t holds.
_SIZE_MAX = 2**64 - 1


class RegionError(ReadError):
    """A tensor names a region badly."""


@dataclass(eq=False)
class Region:
    name: str
    byte_size: int
    region_id: int = field(default_factory=lambda: next(_region_ids))
    # Requests that hold the region: it is unmapped only when none does.
    users: int = 0
    unregistered: bool = False
    # Worker handles that mapped it; each is told to unmap it in the end.
    mapped_by: set = field(default_factory=set)
    # Unregistered while in use: what takes its name out of the manager once unused.
    forget: object = None

    def release(self) -> None:
        self.users -= 1
        if self.users == 0 and self.unregistered:
            if self.forget is not None:
                self.forget()
            self._retire()

    def retire_when_unused(self) -> None:
        """The memory behind the region goes away: workers unmap it once no request uses it."""
        self.unregistered = True
        if self.users == 0:
            self._retire()

    def _retire(self) -> None:
        mapped, self.mapped_by = self.mapped_by, set()
        for handle in mapped:
            handle.unmap_region(self.region_id)


@dataclass(eq=False)
class SystemRegion(Region):
    key: str = ""
    offset: int = 0
    # (st_dev, st_ino) of the object at registration: a worker maps that object or none.
    identity: tuple = (0, 0)

    def status(self) -> dict:
        return {"name": self.name, "key": self.key, "offset": self.offset,
                "byte_size": self.byte_size}


@dataclass(eq=False)
class CudaRegion(Region):
    raw_handle: bytes = b""
    device_id: int = 0

    def status(self) -> dict:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}


@dataclass(slots=True)
class RegionSlice:
    """`nbytes` at `offset` inside a region: where one tensor of a request lives."""

    region: Region
    offset: int
    nbytes: int


class SharedMemoryManager:
    def __init__(self, *, allowed: bool = True, gpu_count: int = 0):
        self.allowed = allowed
        self._gpu_count = gpu_count
        # System and CUDA regions share one namespace of names.
        self._regions: dict[str, Region] = {}

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
        identity, size = _inspect_object(key, where)
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


def segment_region(name: str, key: str, byte_size: int) -> SystemRegion:
    """A segment of the server's own, as a system region: a worker's output arena, whose slots
    other instances then read in place (an ensemble's intermediate tensors)."""
    identity, _ = _inspect_object(key, f"failed to describe segment '{key}'")
    return SystemRegion(name, byte_size, key=key, identity=identity)


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


def _inspect_object(key: str, where: str) -> tuple[tuple, int]:
    """((st_dev, st_ino), size) of the POSIX shared-memory object `key`. Triton's words;
    why comes after, and the code says whose mistake it is (Triton answers INTERNAL to all):
    a key that cannot name an object, or one the server may not open, is the client's
    (INVALID_ARG), one that names nothing NOT_FOUND."""
    shown = key if len(key) <= 256 else key[:256] + "..."
    bare = key.lstrip("/")
    if not bare or "/" in bare or "\x00" in bare:
        raise ServerError(Code.INVALID_ARG, f"Unable to open shared memory region: '{shown}': "
                                            f"a key is '/' and a name without '/'")
    try:
        shm = posix_ipc.SharedMemory("/" + bare)
    except posix_ipc.ExistentialError:
        raise ServerError(Code.NOT_FOUND, f"Unable to open shared memory region: '{shown}': "
                                          f"no shared-memory object has this key") from None
    except (posix_ipc.PermissionsError, PermissionError, ValueError) as exc:
        # posix_ipc says ValueError for names the system refuses (too long, "." or "..").
        raise ServerError(Code.INVALID_ARG, f"Unable to open shared memory region: "
                                            f"'{shown}': {exc}") from None
    except (posix_ipc.Error, OSError) as exc:
        raise ServerError(Code.INTERNAL, f"Unable to open shared memory region: '{shown}': "
                                         f"{exc}") from None
    try:
        st = os.fstat(shm.fd)
    finally:
        shm.close_fd()
    if not stat.S_ISREG(st.st_mode):
        raise ServerError(Code.INVALID_ARG, f"{where}: '{key}' is not a shared-memory object")
    return (st.st_dev, st.st_ino), st.st_size
