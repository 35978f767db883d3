"""Memory a tensor lives in outside the frames, as the front knows it: a client's registered
region (the shared-memory extension, extensions/client_regions.py) or a segment of the server's
own that other instances read in place (a worker's output arena, for an ensemble's next step).

The front never maps a region; workers map one, by id, when a batch first uses it there (see
dispatch/region_mapping.py). A Region counts the requests that hold it and remembers the
workers that mapped it, so that each is told to unmap it once it is retired and no request
uses it.
Below both scheduling/ and the extension, so that either may name a region.
"""

import itertools
import os
import stat
from dataclasses import dataclass, field
from typing import Callable, Optional

import posix_ipc

from shmserve.errors import Code, ServerError

_region_ids = itertools.count(1)


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
    forget: Optional[Callable[[], None]] = None

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


def segment_region(name: str, key: str, byte_size: int) -> SystemRegion:
    """A segment of the server's own, as a system region: a worker's output arena, whose slots
    other instances then read in place (an ensemble's intermediate tensors)."""
    identity, _ = inspect_object(key, f"failed to describe segment '{key}'")
    return SystemRegion(name, byte_size, key=key, identity=identity)


def inspect_object(key: str, where: str) -> tuple[tuple, int]:
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
