"""Shared-memory arenas the front owns: it creates them, and it unlinks them.

Each worker gets two: an input arena whose slots the front allocates, and an output arena
whose slots the worker allocates (it alone knows output sizes) and the front releases.
"""

import itertools
import os

from shmserve.ipc import shm
from shmserve.ipc.allocator import ArenaAllocator

_serial = itertools.count()


def new_segment(tag: str, size: int) -> shm.Segment:
    name = shm.segment_name(os.getpid(), f"{tag}.{next(_serial)}")
    return shm.Segment.create(name, size)


class InputArena:
    """A segment plus the allocator of its slots."""

    def __init__(self, tag: str, size: int):
        self.segment = new_segment(tag, size)
        self._alloc = ArenaAllocator(size)
        self._buf = self.segment.buffer

    @property
    def name(self) -> str:
        return self.segment.name

    def put(self, data) -> int | None:
        """Copy `data` into a fresh slot; its offset, or None when the arena is full."""
        n = len(data) if not isinstance(data, memoryview) else data.nbytes
        offset = self._alloc.alloc(n)
        if offset is not None:
            self._buf[offset:offset + n] = data
        return offset

    def free(self, offset: int) -> None:
        self._alloc.free(offset)

    def destroy(self) -> None:
        self._buf = None
        self.segment.close()
        self.segment.unlink()
